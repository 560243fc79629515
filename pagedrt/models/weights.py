"""Where a model's weights come from, as small picklable objects: a tensor-parallel worker
process receives one and reads, draws or maps the full Hugging Face-named tensors, and each
layer's `weight_loader` keeps its rank's slice (pagedrt/models/layers.py).

    SafetensorsWeights   *.safetensors files (a Hugging Face folder, or a GGUF's cache entry)
    RandomWeights        N(0, std) weights of a config's shape, norms 1 (benchmarks)
    TensorWeights        tensors already in memory (a model loaded in this process); sent to
                         a worker process in shared memory by torch.multiprocessing

Every source has `named_tensors(dtype, device)` -> iterator of (Hugging Face name, tensor).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pagedrt.config import ModelConfig
from pagedrt.models.registry import model_class


@dataclass(frozen=True)
class SafetensorsWeights:
    """Tensors of these safetensors files, read on the CPU in their stored dtype."""

    files: tuple[str, ...]

    def named_tensors(self, dtype: torch.dtype, device: torch.device
                      ) -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import safe_open

        for file in self.files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    yield name, f.get_tensor(name)


@dataclass(frozen=True)
class RandomWeights:
    """Random weights of `config`'s shape: RMSNorm weights the identity (1, or 0 for Gemma 3's
    (1 + w) norms: the class's NORM_IDENTITY), everything else N(0, std) (the usual
    initializer_range), each tensor drawn on the target device from its own generator,
    seeded by `seed` and the tensor's name. The same source therefore gives the same weights to
    a model on one device and to the ranks of a tensor-parallel model (each drawing the full
    tensor and keeping its slice), on devices of one type. The benchmarks' presets use it: no
    weights are downloaded, and FLOPs and bytes are those of the real model.

    Attributes:
        config: the model's shape.
        seed: of the draws.
        std: standard deviation of the non-norm weights.
    """

    config: ModelConfig
    seed: int = 0
    std: float = 0.02

    @property
    def model_path(self) -> str:
        return f"random:{self.config.architecture}"

    def named_tensors(self, dtype: torch.dtype, device: torch.device
                      ) -> Iterator[tuple[str, torch.Tensor]]:
        cls = model_class(self.config.architecture)
        for name, shape in cls.hf_weight_shapes(self.config).items():
            t = torch.empty(shape, dtype=dtype, device=device)
            if "norm" in name:
                t.fill_(cls.NORM_IDENTITY)
            else:
                gen = torch.Generator(device=device)
                gen.manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
                t.normal_(0.0, self.std, generator=gen)
            yield name, t


@dataclass
class TensorWeights:
    """Full Hugging Face-named tensors held in memory (`LlamaForCausalLM.hf_state_dict` of a
    model loaded on one rank)."""

    tensors: dict[str, torch.Tensor]

    def named_tensors(self, dtype: torch.dtype, device: torch.device
                      ) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.tensors.items()
