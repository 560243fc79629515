"""`pagedrt bench accuracy`: what a KV cache dtype does to a real model's outputs.

Two measures, each for the full-precision cache (the model's dtype) and --kv-cache-dtype:
  perplexity  teacher-forced, over a real English text that ships with an installed package
              (the Apache License 2.0 text in transformers' distribution, ~2,240 SmolLM2
              tokens), run as a chunked prefill through a paged cache built from a
              `KVCacheSpec`; also the mean KL divergence of each next-token distribution from
              the full-precision cache's and how often their argmaxes agree
  greedy      tokens of `CHAT_PROMPTS` through `LLM.generate` (temperature 0): per prompt the
              common prefix with the full-precision cache's answer, and the position-wise
              agreement

--scales-experiment (torch backend) adds the other FP8 scale schemes, written by stand-ins
swapped in for the torch reference's quantizer or writer (the attention that reads them is
unchanged: a scale per token and head that happens to be constant per layer is a per-tensor
scale):
  per-token-head, 2^e           the smallest power of two >= amax / 448 (exact division, but
                                the largest value is rounded instead of stored as 448)
  per-tensor 1.0                one scale for every layer, no calibration (vLLM's default
                                when a checkpoint carries none)
  per-tensor calibrated         per layer, K and V: amax over the whole evaluation text / 448
                                (an oracle calibration on the very text measured)
Results: docs/design.md ("FP8 KV cache") quotes them for SmolLM2.

    pagedrt bench accuracy [--model PATH] [--dtype float32] [--kv-cache-dtype fp8]
                           [--scales-experiment] --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import math
import time
from unittest import mock

import torch

from pagedrt.bench.common import free_llm, write_results
from pagedrt.config import KV_CACHE_DTYPES
from pagedrt.entrypoints.arg_parser import ArgumentParser
from pagedrt.kv.kv_cache import KVCache, KVCacheSpec, resolve_kv_cache_dtype
from pagedrt.ops import attention_reference
from pagedrt.ops.attention import AttentionMetadata
from pagedrt.ops.fp8 import FP8_DTYPE, FP8_MAX
from pagedrt.sampling_params import SamplingParams

CHAT_PROMPTS = [  # held out: no test or tuning used them before this measure
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn leaves.",
    "List three benefits of regular exercise.",
    "How do I reverse a list in Python?",
    "What is the difference between a virus and a bacterium?",
    "Give me a short recipe for pancakes.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
]


def reference_text() -> tuple[str, str]:
    """(where it comes from, text): the Apache License 2.0 text that the transformers wheel
    ships (a hard dependency of pagedrt, so it is installed wherever pagedrt is).

    Raises:
        FileNotFoundError: the installed transformers has no LICENSE file.
    """
    dist = importlib.metadata.distribution("transformers")
    for f in dist.files or []:
        if f.name == "LICENSE" and ".dist-info" in str(f):
            # (f is already named after the package and version: transformers-5.x.dist-info/)
            return str(f), f.read_text(encoding="utf-8")
    raise FileNotFoundError("the installed transformers ships no LICENSE file")


@torch.inference_mode()
def next_token_logprobs(loaded, token_ids: list[int], kv_dtype: torch.dtype, backend: str,
                        block_size: int = 16, chunk: int = 512, seed: int = 0) -> torch.Tensor:
    """Teacher-forced log-probabilities: row t is log p(. | token_ids[:t + 1]), float32
    [len(token_ids) - 1, vocab] on the CPU.

    The text runs as a chunked prefill (chunks of `chunk` tokens) through a KV cache of
    `kv_dtype` in shuffled blocks, as the engine runs a long prompt: every chunk attends to
    the K/V of the earlier ones as the cache holds them (quantized, for an FP8 cache). With
    `chunk` 1 every token is a decode step, so the decode kernel is the one measured.
    """
    mc = loaded.model_config
    device = next(loaded.model.parameters()).device
    n = len(token_ids)
    num_blocks = -(-n // block_size)
    cache = KVCache(KVCacheSpec.for_model(mc, block_size, kv_dtype), num_blocks, 0, device,
                    backend)
    table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    ids = torch.tensor(token_ids, device=device)
    out = []
    for start in range(0, n - 1, chunk):
        end = min(start + chunk, n - 1)  # the last token is only ever a target
        positions = torch.arange(start, end, device=device)
        slots = table.to(device)[positions // block_size] * block_size + positions % block_size
        meta = AttentionMetadata(
            slot_mapping=slots, block_tables=table.to(device, torch.int32)[None],
            seq_lens=torch.tensor([end], dtype=torch.int32, device=device),
            cu_seqlens_q=torch.tensor([0, end - start], dtype=torch.int32, device=device),
            max_query_len=end - start, max_seq_len=end, backend=backend)
        hidden = loaded.model(ids[start:end], positions, cache.layers, meta)
        logits = loaded.model.compute_logits(hidden).float()
        out.append(torch.log_softmax(logits, dim=-1).cpu())
    return torch.cat(out)


def perplexity_row(logprobs: torch.Tensor, token_ids: list[int],
                   reference: torch.Tensor | None) -> dict:
    """Perplexity of the targets token_ids[1:]; against a reference's logprobs, the mean KL
    divergence KL(reference || these) per token and the share of equal argmaxes."""
    targets = torch.tensor(token_ids[1:])
    nll = -logprobs.gather(1, targets[:, None]).squeeze(1)
    row = {"num_tokens": len(targets), "perplexity": math.exp(nll.mean().item())}
    if reference is not None:
        kl = (reference.exp() * (reference - logprobs)).sum(-1)
        row["kl_vs_full_mean"] = kl.mean().item()
        same = reference.argmax(-1) == logprobs.argmax(-1)
        row["argmax_agreement"] = same.float().mean().item()
    return row


def greedy_answers(loaded, prompts: list[str], max_tokens: int, **engine_kwargs) -> list[list]:
    """Token ids of greedy answers to chat prompts (chat template applied)."""
    from pagedrt import LLM

    blocks = len(prompts) * -(-engine_kwargs.get("max_model_len", 2048) // 16)  # all at once
    llm = LLM(loaded, **{"max_num_seqs": len(prompts), "num_kv_blocks": blocks,
                         **engine_kwargs})
    chats = [llm.chat_prompt([{"role": "user", "content": p}]) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs = llm.generate(chats, params, use_tqdm=False)
    free_llm(llm)  # the next engine sizes its cache from the same free memory
    return [list(o.outputs[0].token_ids) for o in outs]


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Per prompt, the common prefix length; overall, the share of answers identical, the
    mean common prefix as a share of the reference answer, and position-wise agreement."""
    prefixes, same_positions, positions = [], 0, 0
    for a, b in zip(reference, other):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        prefixes.append(k)
        same_positions += sum(x == y for x, y in zip(a, b))
        positions += max(len(a), len(b))
    return {
        "identical_answers": sum(a == b for a, b in zip(reference, other)),
        "num_prompts": len(reference),
        "common_prefix_tokens": prefixes,
        "mean_common_prefix_share": sum(k / max(len(a), 1) for k, a in zip(prefixes, reference))
        / len(reference),
        "positionwise_agreement": same_positions / max(positions, 1),
    }


# ---------------------------------------------------------------------- other scale schemes
def _power_of_two_quantizer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token-head scales rounded up to a power of two: 2^ceil(log2(amax / 448))."""
    xf = x.float()
    amax = xf.abs().amax(-1).clamp_min(torch.finfo(torch.float32).tiny)
    scales = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    return (xf / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scales


def _per_tensor_writer(layer_scales: dict[int, tuple[float, float]]):
    """A stand-in for `write_kv_reference` that quantizes with one static scale per layer
    (looked up by the K cache's data pointer) and stores it as every token's scale."""
    def write(key, value, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None):
        block_size = k_cache.shape[1]
        valid = slot_mapping >= 0
        slots = slot_mapping[valid].long()
        blocks, offsets = slots // block_size, slots % block_size
        static = layer_scales[k_cache.data_ptr()]
        for cache, scales, x, s in ((k_cache, k_scales, key[valid].float(), static[0]),
                                    (v_cache, v_scales, value[valid].float(), static[1])):
            values = (x / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
            cache.view(-1, *cache.shape[2:]).view(torch.uint8)[slots] = values.view(torch.uint8)
            scales.transpose(1, 2)[blocks, offsets] = s
    return write


@contextlib.contextmanager
def _per_tensor_scales(kv_scale_of_layer):
    """Patch the reference writer so that layer i's K/V use the static scales
    kv_scale_of_layer(i) -> (k_scale, v_scale); the KVCache is created inside, so the layer
    of a write is found from its K cache's address (KVCache registers them here)."""
    layer_scales: dict[int, tuple[float, float]] = {}
    original_init = KVCache.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        for i, k in enumerate(self.k_caches):
            layer_scales[k.data_ptr()] = kv_scale_of_layer(i)

    with mock.patch.object(KVCache, "__init__", init), \
            mock.patch.object(attention_reference, "write_kv_reference",
                              _per_tensor_writer(layer_scales)):
        yield


@torch.inference_mode()
def calibrated_layer_scales(loaded, token_ids: list[int], backend: str) -> list[tuple]:
    """(amax K / 448, amax V / 448) per layer over the whole text, from a full-precision
    pass (the oracle calibration of the per-tensor scheme)."""
    captured: list[tuple[float, float]] = []
    original = attention_reference.write_kv_reference

    def spy(key, value, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None):
        captured.append((key.abs().max().item(), value.abs().max().item()))
        return original(key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales)

    dtype = next(loaded.model.parameters()).dtype
    with mock.patch.object(attention_reference, "write_kv_reference", spy):
        next_token_logprobs(loaded, token_ids, dtype, backend)
    num_layers = loaded.model_config.num_hidden_layers
    per_layer = [captured[i::num_layers] for i in range(num_layers)]  # chunks x layers order
    return [(max(k for k, _ in c) / FP8_MAX, max(v for _, v in c) / FP8_MAX) for c in per_layer]


def scale_schemes(loaded, token_ids: list[int], backend: str) -> dict:
    """name -> context manager factory under which an FP8 cache uses that scale scheme."""
    calibrated = calibrated_layer_scales(loaded, token_ids, backend)
    return {
        "fp8 per-token-head amax/448 (pagedrt)": contextlib.ExitStack,
        "fp8 per-token-head 2^e": lambda: mock.patch.object(
            attention_reference, "quantize_fp8", _power_of_two_quantizer),
        "fp8 per-tensor 1.0 (uncalibrated)": lambda: _per_tensor_scales(lambda i: (1.0, 1.0)),
        "fp8 per-tensor per layer, calibrated on the text": lambda: _per_tensor_scales(
            lambda i: calibrated[i]),
    }


# ---------------------------------------------------------------------- the command
def main(argv: list[str]) -> int:
    from pagedrt.engine.llm_engine import resolve_device, resolve_dtype
    from pagedrt.models.loader import load_model

    p = ArgumentParser(prog="pagedrt bench accuracy", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a .gguf or HF folder (default: SmolLM2)")
    p.add_argument("--dtype", default="auto", help="model dtype (auto: bf16 on CUDA, fp32 CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--kv-cache-dtype", default="fp8", choices=KV_CACHE_DTYPES[1:],
                   help="the cache dtype compared against the model-dtype cache")
    p.add_argument("--max-tokens", type=int, default=48, help="greedy tokens per chat prompt")
    p.add_argument("--scales-experiment", action="store_true",
                   help="also the other FP8 scale schemes (torch backend only)")
    p.add_argument("--perplexity-chunk", type=int, default=512,
                   help="tokens per forward of the perplexity pass (default 512, the extend "
                        "kernel); 1 runs every token as a decode, through the decode kernel")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default="accuracy", help="JSON file name under --out")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    backend = args.attention_backend
    if args.scales_experiment and not (backend == "torch" or device.type == "cpu"):
        p.error("--scales-experiment swaps the torch reference's writer: use "
                "--attention-backend torch (or the CPU)")
    if args.perplexity_chunk < 1:
        p.error(f"--perplexity-chunk {args.perplexity_chunk}: give at least 1")
    loaded = load_model(args.model, dtype, device)
    source, text = reference_text()
    token_ids = loaded.tokenizer.encode(text)
    kv_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, dtype, device, backend)
    engine = {"attention_backend": backend, "max_model_len": 2048}

    t = time.perf_counter()
    chunk = args.perplexity_chunk
    full = next_token_logprobs(loaded, token_ids, dtype, backend, chunk=chunk)
    full_answers = greedy_answers(loaded, CHAT_PROMPTS, args.max_tokens, **engine)
    rows = [{"cache": "full precision (model dtype)", **perplexity_row(full, token_ids, None)}]
    schemes = {f"{args.kv_cache_dtype} (pagedrt)": contextlib.ExitStack}
    if args.scales_experiment:
        schemes = scale_schemes(loaded, token_ids, backend)
    for name, context in schemes.items():
        with context():
            logprobs = next_token_logprobs(loaded, token_ids, kv_dtype, backend, chunk=chunk)
            answers = greedy_answers(loaded, CHAT_PROMPTS, args.max_tokens,
                                     kv_cache_dtype=args.kv_cache_dtype, **engine)
        row = {"cache": name, **perplexity_row(logprobs, token_ids, full),
               "greedy": agreement(full_answers, answers)}
        row["perplexity_ratio"] = row["perplexity"] / rows[0]["perplexity"]
        rows.append(row)
    meta = {"model": loaded.model_path, "dtype": str(dtype), "device": str(device),
            "backend": backend, "text": source, "text_tokens": len(token_ids),
            "chat_prompts": CHAT_PROMPTS, "max_tokens": args.max_tokens,
            "perplexity_chunk": chunk,
            "elapsed_s": time.perf_counter() - t}
    path = write_results(args.out, args.name, rows, meta)
    print(f"\n{source}: {len(token_ids)} tokens in chunks of {chunk}; {len(CHAT_PROMPTS)} "
          f"chat prompts x {args.max_tokens} greedy tokens; model {dtype}, {device}, backend {backend}")
    print(f"{'cache':<50} {'ppl':>8} {'ratio':>7} {'KL':>8} {'top1':>6} {'same':>5} "
          f"{'prefix':>7} {'pos':>6}")
    for r in rows:
        g = r.get("greedy")
        extra = (f" {r['perplexity_ratio']:7.4f} {r['kl_vs_full_mean']:8.5f} "
                 f"{r['argmax_agreement']:6.1%} {g['identical_answers']:>2}/{g['num_prompts']:<2}"
                 f" {g['mean_common_prefix_share']:7.1%} {g['positionwise_agreement']:6.1%}"
                 if g else "")
        print(f"{r['cache']:<50} {r['perplexity']:8.4f}{extra}")
    print(f"results: {path}")
    return 0
