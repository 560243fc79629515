"""Tensor parallelism on CUDA: the worker-process path against the in-process path on one GPU
(the same kernels on the same device: the same tokens), with CUDA graphs replayed and async
scheduling on in the worker; and, on a machine with two GPUs, TP=2 over NCCL against TP=1
(CUDA graphs capturing the all-reduces)."""

import random

import pytest
import torch
from tp_helpers import count_graph_replays, graph_replays, greedy_logits

from pagedrt import LLM, SamplingParams
from pagedrt.bench.presets import get_preset
from pagedrt.models.weights import RandomWeights

SOURCE = RandomWeights(get_preset("qwen2-0.5b"))
ENGINE = {"gpu_memory_utilization": 0.3, "max_model_len": 2048, "max_num_seqs": 32}


def _prompts(n: int = 6) -> list[list[int]]:
    g = random.Random(0)
    return [[g.randrange(10000) for _ in range(g.randint(1, 600))] for _ in range(n)]


def _tokens(llm: LLM, prompts) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _free(llm: LLM) -> None:
    llm.llm_engine.shutdown()
    del llm.llm_engine
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_tp1_worker_process_gives_the_in_process_tokens():
    prompts = _prompts()
    ref = LLM(SOURCE, **ENGINE)
    expected = _tokens(ref, prompts)
    _free(ref)
    llm = LLM(SOURCE, distributed_executor_backend="mp", **ENGINE)
    try:
        engine = llm.llm_engine
        assert engine.model_runner is None and len(engine.executor.worker_pids) == 1
        assert engine.async_scheduling
        [sizes] = engine.executor.collective_rpc(count_graph_replays)
        assert sizes and sizes[-1] == ENGINE["max_num_seqs"]
        assert _tokens(llm, prompts) == expected
        [replays] = engine.executor.collective_rpc(graph_replays)
        assert replays >= 40  # the decode steps ran as graph replays
        engine.check_integrity()
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_nccl_matches_tp1():
    """fp32 (no TF32 in matmuls by default): logits within 1e-4 relative and the same greedy
    tokens through the engine, with the all-reduces inside the captured decode graphs."""
    prompts = _prompts(4)
    kw = {**ENGINE, "dtype": "float32"}
    ref = LLM(SOURCE, **kw)
    [ref_logits] = ref.llm_engine.executor.collective_rpc(greedy_logits, prompts[:2], 16)
    expected = _tokens(ref, prompts)
    _free(ref)
    llm = LLM(SOURCE, tensor_parallel_size=2, **kw)
    try:
        executor = llm.llm_engine.executor
        assert all(executor.collective_rpc(count_graph_replays))
        for ours in executor.collective_rpc(greedy_logits, prompts[:2], 16):
            for o, r in zip(ours, ref_logits):
                assert ((o - r).abs().max() / r.abs().max()).item() <= 1e-4
        assert _tokens(llm, prompts) == expected
        assert min(executor.collective_rpc(graph_replays)) >= 40
        llm.llm_engine.check_integrity()
    finally:
        llm.llm_engine.shutdown()
