"""Model definitions (Llama / Qwen2) and the weight loader (GGUF and Hugging Face folders)."""

from pagedrt.models.llama import LlamaForCausalLM
from pagedrt.models.loader import LoadedModel, cache_dir, default_model_path, load_model

__all__ = ["LlamaForCausalLM", "LoadedModel", "cache_dir", "default_model_path", "load_model"]
