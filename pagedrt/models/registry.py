"""Which class implements each Hugging Face architecture name.

`MODEL_REGISTRY` maps the name found in config.json's "architectures" to the module and class
that implement it. Modules are imported only when a model is built (`model_class`), so reading
the registry (as `pagedrt.config` does to validate a config) imports no model code.
"""

from __future__ import annotations

import importlib

# architecture -> (module path, class name)
MODEL_REGISTRY: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("pagedrt.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("pagedrt.models.llama", "LlamaForCausalLM"),  # + qkv bias
    "Qwen3ForCausalLM": ("pagedrt.models.llama", "LlamaForCausalLM"),  # + q/k RMSNorm
    "MistralForCausalLM": ("pagedrt.models.llama", "LlamaForCausalLM"),  # + sliding window
    "Gemma3ForCausalLM": ("pagedrt.models.gemma3", "Gemma3ForCausalLM"),  # text-only
}


def supported_architectures() -> tuple[str, ...]:
    """The architecture names pagedrt can run, in registry order."""
    return tuple(MODEL_REGISTRY)


def model_class(architecture: str) -> type:
    """The nn.Module class for `architecture`, importing its module on first use.

    Raises:
        ValueError: `architecture` is not in the registry; the message lists those that are.
    """
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"unsupported architecture {architecture!r}; pagedrt runs "
            f"{', '.join(MODEL_REGISTRY)}"
        )
    module_path, class_name = MODEL_REGISTRY[architecture]
    return getattr(importlib.import_module(module_path), class_name)
