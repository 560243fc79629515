"""Model definitions (Llama / Qwen2 / Qwen3 / Mistral), the architecture registry and the weight
loader (GGUF and Hugging Face folders).

Names are imported on first access, so that `pagedrt.config` can read `pagedrt.models.registry`
without importing the model code (which itself imports `pagedrt.config`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LlamaForCausalLM": "pagedrt.models.llama",
    "LoadedModel": "pagedrt.models.loader",
    "cache_dir": "pagedrt.models.loader",
    "default_model_path": "pagedrt.models.loader",
    "load_model": "pagedrt.models.loader",
    "MODEL_REGISTRY": "pagedrt.models.registry",
    "model_class": "pagedrt.models.registry",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pagedrt.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
