"""Helpers shared by the benchmarks: model choice, device ceilings, HF peers, result files."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import subprocess
import sys
import time

import torch

from pagedrt.bench.presets import PRESETS, get_preset, random_model
from pagedrt.entrypoints.engine_args import add_engine_config_args, engine_kwargs


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model (--preset or --model), --dtype, --device, every engine option (with larger
    batching defaults than the CLI's) and --out."""
    p.add_argument("--preset", default="qwen2-0.5b", choices=sorted(PRESETS),
                   help="random-weight model of a published shape (ignored with --model; "
                        "default: qwen2-0.5b, not the packaged SmolLM2)")
    p.add_argument("--model", default=None,
                   help="a real model (.gguf or HF folder) instead, e.g. the packaged "
                        "SmolLM2's .gguf (the README's quick start says where it lies)")
    p.add_argument("--dtype", default="auto",
                   help="model dtype: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, "
                        "float16")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cuda or cpu")
    add_engine_config_args(p)
    p.set_defaults(gpu_memory_utilization=0.85, max_num_batched_tokens=16384,
                   max_model_len=4096)
    p.add_argument("--out", default="benchmarks/results",
                   help="folder for JSON and PNG (default: benchmarks/results under the "
                        "current directory)")


def uses_workers(args) -> bool:
    """Whether the engine will run the model in worker processes (tensor parallelism, the 'mp'
    backend, or a torchrun launch) rather than in this process."""
    from pagedrt.distributed.group import torchrun_env

    return (args.tensor_parallel_size > 1 or args.distributed_executor_backend == "mp"
            or torchrun_env() is not None)


def load(args) -> tuple:
    """(model, name) for --model or --preset: a LoadedModel in the resolved dtype and device,
    or, when the model runs in worker processes (`uses_workers`), what they load it from (the
    path, or the preset's RandomWeights: the same weights as the LoadedModel's), so that this
    process holds no copy of the weights."""
    from pagedrt.engine.llm_engine import resolve_device, resolve_dtype
    from pagedrt.models.loader import load_model
    from pagedrt.models.weights import RandomWeights

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    name = os.path.basename(args.model.rstrip("/")) if args.model else args.preset
    if uses_workers(args):
        return (args.model or RandomWeights(get_preset(args.preset))), name
    if args.model:
        return load_model(args.model, dtype, device), name
    return random_model(get_preset(args.preset), dtype, device), name


def make_llm(model, args, **overrides):
    """The benchmark's `LLM`, without `LLM.generate`'s slow-CPU RuntimeWarning: a benchmark
    reports its own rates, and its warm-up (prefill-heavy, a few tokens a request) fired the
    warning on an idle 2-core CPU (a `bench throughput` run of 2026-12-07)."""
    from pagedrt import LLM

    llm = LLM(model, dtype=args.dtype, device=args.device,
              **{**engine_kwargs(args), **overrides})
    llm._warned_slow_cpu = True
    return llm


def start_up_report(llm, engine_s: float) -> dict:
    """Where an engine's start-up went: {"engine_s": `engine_s` (the caller's clock around
    LLM(...)), and where the model runs in this process "gemm_warm_up_s", "graph_capture_s"
    (the decode graphs' capture, which times their kernel configs) and "spec_warm_up_s";
    where Triton was used, "config_timing": this process's `config_timing.TOTALS` (choices
    timed, configs timed, seconds, choices read from the config cache on disk)}, in
    seconds."""
    out = {"engine_s": engine_s}
    runner = llm.llm_engine.model_runner
    if runner is not None:
        out.update(gemm_warm_up_s=runner.gemm_warm_up_s,
                   graph_capture_s=runner.graph_capture_s,
                   spec_warm_up_s=runner.spec_warm_up_s)
    timing = sys.modules.get("pagedrt.ops.config_timing")
    if timing is not None:
        out["config_timing"] = dataclasses.asdict(timing.TOTALS)
    return out


def format_start_up(report: dict) -> str:
    """`start_up_report` as one line."""
    line = f"pagedrt start-up: engine {report['engine_s']:.1f} s"
    if "graph_capture_s" in report:
        line += (f" (GEMM warm-up {report['gemm_warm_up_s']:.1f} s, graph capture "
                 f"{report['graph_capture_s']:.1f} s)")
    t = report.get("config_timing")
    if t:
        from pagedrt.ops.config_timing import TimingTotals  # present where it was reported

        line += f"; kernel configs: {TimingTotals(**t).summary()}"
    return line


def free_llm(llm) -> None:
    """Stop the engine (its worker processes, if any) and give its device memory (KV cache,
    CUDA graphs) back, so that an engine made next in this process sizes its cache from the
    same free memory. The engine froze the objects alive when it started (`gc.freeze` in
    LLMEngine), which keeps its reference cycles from ever being collected: unfreeze, then
    collect them."""
    engine = llm.llm_engine
    local = engine.model_runner is not None
    engine.shutdown()
    del engine, llm.llm_engine
    gc.unfreeze()
    gc.collect()
    if local and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def sync_engine(engine) -> None:
    """Wait for the engine's device work, when its model runs in this process (a step run by
    worker processes is done once the engine has its tokens)."""
    if engine.model_runner is not None:
        sync(engine.device)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def device_ceilings(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Measured in this run: read bandwidth (bytes/s, a large sum over bf16 data) and the
    dense matmul rate in `dtype`, the model's (FLOP/s, 8192^3; bf16 for the GPU runs of
    record, fp32 for a CPU run in fp32, whose bf16 rate it never uses). On CPU: a rough
    single measurement of each (1024^3)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    x.sum()
    sync(device)
    reps = 10 if device.type == "cuda" else 2
    t = time.perf_counter()
    for _ in range(reps):
        x.sum()
    sync(device)
    read_bw = reps * x.numel() * x.element_size() / (time.perf_counter() - t)
    del x
    m = 8192 if device.type == "cuda" else 1024
    a = torch.randn(m, m, dtype=dtype, device=device)
    a @ a
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ a
    sync(device)
    flops = reps * 2 * m**3 / (time.perf_counter() - t)
    return {"read_bytes_per_s": read_bw, "matmul_flop_per_s": flops,
            "matmul_dtype": str(dtype).removeprefix("torch.")}


def gpu_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({os.cpu_count()} cores)"


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=False).stdout.strip()
        return (head + ("-dirty" if dirty else "")) or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def kernel_choices() -> dict:
    """What the start-up timing chose in this process (the skinny matmul and its fused ops,
    pagedrt/ops/gemv_triton.py; the decode matmul, pagedrt/ops/matmul_triton.py): {"module.TABLE":
    {str(shape key): config as a list, or None for the plain path}}, only for modules already
    imported and tables not empty. Engines whose model runs in worker processes time there,
    so their choices are not here. With PAGEDRT_STEP_TIMING set, "step_timing" holds what the
    in-step timing found (pagedrt/engine/step_timing.py). Lets a run's figures be traced to
    the kernels it ran."""
    from pagedrt.ops.config_cache import CHOICE_TABLES  # (module, its choice tables)

    out = {}
    for module, tables in CHOICE_TABLES:
        mod = sys.modules.get(module)
        for table in tables:
            chosen = getattr(mod, table, None) if mod is not None else None
            if chosen:
                out[f"{module.rsplit('.', 1)[1]}.{table}"] = {
                    str(k): None if v is None else list(v) for k, v in chosen.items()}
    step_timing = sys.modules.get("pagedrt.engine.step_timing")
    if step_timing is not None and step_timing.REPORT:
        out["step_timing"] = step_timing.report_dict()
    return out


def config_cache_files() -> list[str] | None:
    """The config cache's files (pagedrt/ops/config_cache.py) this process's start-up timing
    looked up, or None where it used none (PAGEDRT_CONFIG_CACHE=off, or no choice timed: on a
    CPU, or with the model in worker processes)."""
    cache = sys.modules.get("pagedrt.ops.config_cache")
    return (cache.files_in_use() or None) if cache is not None else None


def write_results(out_dir: str, name: str, results: list[dict], extra: dict | None = None) -> str:
    """Write {gpu, commit, date, command, results, kernel_choices, config_cache, **extra} to
    out_dir/name.json and return its path (`kernel_choices`: the start-up timing's choices of
    this process; `config_cache`: the config cache's files this process's timing
    looked up, where choices may come from an earlier process, or None)."""
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "gpu": gpu_name(), "commit": os.environ.get("PAGEDRT_COMMIT") or git_commit(),
        "date": datetime.date.today().isoformat(),
        "command": "pagedrt " + " ".join(sys.argv[1:]) if "pagedrt" in sys.argv[0]
        else " ".join(sys.argv),
        "results": results, "kernel_choices": kernel_choices(),
        "config_cache": config_cache_files(), **(extra or {}),
    }
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    return path


_HF_CONFIG_CLASSES = {"LlamaForCausalLM": "LlamaConfig", "Qwen2ForCausalLM": "Qwen2Config",
                      "Qwen3ForCausalLM": "Qwen3Config", "MistralForCausalLM": "MistralConfig",
                      "Gemma3ForCausalLM": "Gemma3TextConfig"}


def hf_config_fields(mc) -> dict:
    """The Hugging Face config.json fields of a ModelConfig, for its architecture's config
    class (what `ModelConfig.from_hf_config` reads back to the same config)."""
    fields = {
        "vocab_size": mc.vocab_size, "hidden_size": mc.hidden_size,
        "intermediate_size": mc.intermediate_size, "num_hidden_layers": mc.num_hidden_layers,
        "num_attention_heads": mc.num_attention_heads,
        "num_key_value_heads": mc.num_key_value_heads,
        "head_dim": mc.head_dim, "rms_norm_eps": mc.rms_norm_eps,
        "max_position_embeddings": mc.max_position_embeddings,
        "tie_word_embeddings": mc.tie_word_embeddings, "bos_token_id": mc.bos_token_id,
        "eos_token_id": list(mc.eos_token_ids), "architectures": [mc.architecture]}
    arch = mc.architecture
    if arch == "Gemma3ForCausalLM":
        full = {"rope_type": "default", **(mc.rope_scaling or {}), "rope_theta": mc.rope_theta}
        local = {"rope_type": "default", "rope_theta": mc.rope_local_theta or mc.rope_theta}
        return {**fields, "rope_parameters": {"full_attention": full,
                                              "sliding_attention": local},
                "sliding_window": mc.sliding_window or mc.max_position_embeddings,
                "layer_types": list(mc.layer_types) or None,
                "query_pre_attn_scalar": mc.query_pre_attn_scalar or mc.head_dim}
    fields["rope_theta"] = mc.rope_theta
    if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        fields["attention_bias"] = mc.attention_bias
    if arch == "MistralForCausalLM":
        fields["sliding_window"] = mc.sliding_window
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and mc.layer_types:
        fields.update(use_sliding_window=True, sliding_window=mc.sliding_window,
                      layer_types=list(mc.layer_types))
    return fields


def hf_model_like(loaded, dtype, device, attn_implementation: str = "sdpa"):
    """An HF transformers model of the same architecture holding the same weights."""
    import transformers

    mc = loaded.model_config
    cls_cfg = getattr(transformers, _HF_CONFIG_CLASSES[mc.architecture])
    cfg = cls_cfg(**hf_config_fields(mc))
    cls = getattr(transformers, mc.architecture)
    with torch.device(device):
        hf = cls._from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    state = hf_state_dict(loaded.model, mc)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and mc.tie_word_embeddings)]
    assert not missing and not unexpected, (missing, unexpected)
    return hf.eval()


def hf_state_dict(model, mc) -> dict:
    """Our fused parameters split back into Hugging Face names (`LlamaForCausalLM.hf_state_dict`)."""
    return model.hf_state_dict()


def int_list(value: str, minimum: int = 1) -> list[int]:
    """argparse type of a comma list of integers >= `minimum` ("1,8,32"; "" is none): a bad
    item is an argparse error that names it."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    try:
        numbers = [int(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give a comma list of whole numbers, e.g. 1,8,32") from None
    if any(n < minimum for n in numbers):
        raise argparse.ArgumentTypeError(f"{value!r}: every number must be >= {minimum}")
    return numbers


def kernel_device_times(prof, name_chars: int = 90) -> dict:
    """Device time by kernel of a finished `torch.profiler.profile` run: {kernel name (its
    first name_chars characters): [launches, device microseconds]}, most time first."""
    kernels: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name[:name_chars], [0, 0.0])
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return dict(sorted(kernels.items(), key=lambda kv: -kv[1][1]))
