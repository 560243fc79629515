"""pagedrt: a paged-attention runtime for LLM inference.

Public API (compatible with vLLM's offline API):
    LLM, SamplingParams, RequestOutputKind, BeamSearchParams, RequestOutput, CompletionOutput,
    BeamSearchOutput, BeamSearchSequence, EngineConfig, ModelConfig
"""

from pagedrt.config import EngineConfig, ModelConfig
from pagedrt.outputs import BeamSearchOutput, BeamSearchSequence, CompletionOutput, RequestOutput
from pagedrt.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

__all__ = [
    "LLM",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "CompletionOutput",
    "EngineConfig",
    "ModelConfig",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
]
__version__ = "0.1.0"


def __getattr__(name):  # import the engine lazily: `import pagedrt` stays cheap
    if name == "LLM":
        from pagedrt.entrypoints.llm import LLM

        return LLM
    raise AttributeError(name)
