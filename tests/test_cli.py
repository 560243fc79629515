"""The `pagedrt` command's engine options: one per EngineConfig field, made from the fields."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pytest
import torch

from pagedrt import LLM, EngineConfig
from pagedrt.bench.common import add_model_args
from pagedrt.entrypoints.cli import build_parser, main
from pagedrt.entrypoints.engine_args import engine_kwargs

# a valid value other than the default, for every EngineConfig field: a field added to
# EngineConfig fails test_fields_have_test_values until it is given one here (and so is run
# through the command line by test_every_field_round_trips)
NON_DEFAULT = {
    "block_size": 32, "num_kv_blocks": 7, "kv_cache_memory_bytes": 12345,
    "gpu_memory_utilization": 0.5, "max_num_seqs": 3, "max_num_batched_tokens": 99,
    "max_model_len": 77, "enable_prefix_caching": False, "preemption_mode": "swap",
    "swap_space_bytes": 0, "enforce_eager": True, "async_scheduling": True,
    "num_scheduler_steps": 4, "multi_step_max_num_seqs": 16,
    "attention_backend": "torch", "kv_cache_dtype": "fp8", "seed": 42,
    "tensor_parallel_size": 2, "distributed_executor_backend": "mp",
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 2},
}
# the words before the engine options: one line of each command that takes them
COMMANDS = (["generate", "hi"], ["serve"])


def parse(argv: list[str]) -> argparse.Namespace:
    args, rest = build_parser().parse_known_args(argv)
    assert not rest, rest
    return args


def config_of(argv: list[str]) -> EngineConfig:
    return EngineConfig(**engine_kwargs(parse(argv)))


def test_fields_have_test_values():
    names = [f.name for f in dataclasses.fields(EngineConfig)]
    assert sorted(NON_DEFAULT) == sorted(names)
    for f in dataclasses.fields(EngineConfig):
        assert NON_DEFAULT[f.name] != f.default, f.name


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(EngineConfig)])
def test_every_field_round_trips(command, field):
    """--field-name VALUE (or the flags in the field's metadata) -> engine_kwargs ->
    EngineConfig has VALUE in that field and the defaults elsewhere."""
    f = EngineConfig.__dataclass_fields__[field]
    flag = f.metadata.get("flags", ("--" + field.replace("_", "-"),))[0]
    value = NON_DEFAULT[field]
    if isinstance(value, bool):
        option = [flag if value else "--no-" + flag[2:]]
    elif isinstance(value, dict):
        option = [flag, json.dumps(value)]
    else:
        option = [flag, str(value)]
    assert config_of(command + option) == EngineConfig(**{field: value})


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_no_options_give_the_engine_defaults(command):
    assert config_of(command) == EngineConfig()


def test_existing_spellings_still_parse():
    """Spellings used by scripts, tests, the README and the benchmarks before the options were
    made from the fields."""
    config = config_of([
        "generate", "hi", "--block-size", "8", "--num-kv-blocks", "64",
        "--kv-cache-memory-bytes", "4096", "--gpu-memory-utilization", "0.7",
        "--max-num-seqs", "4", "--max-num-batched-tokens", "512", "--max-model-len", "1024",
        "--no-prefix-caching", "--preemption-mode", "swap", "--swap-space-bytes", "0",
        "--enforce-eager", "--attention-backend", "triton", "--engine-seed", "5",
    ])
    assert config == EngineConfig(
        block_size=8, num_kv_blocks=64, kv_cache_memory_bytes=4096,
        gpu_memory_utilization=0.7, max_num_seqs=4, max_num_batched_tokens=512,
        max_model_len=1024, enable_prefix_caching=False, preemption_mode="swap",
        swap_space_bytes=0, enforce_eager=True, attention_backend="triton", seed=5)


def test_tensor_parallel_size_has_vllms_short_flag():
    for command in COMMANDS:
        assert config_of(command + ["-tp", "4"]).tensor_parallel_size == 4


def test_generate_seed_is_the_request_seed_not_the_engine_seed():
    args = parse(["generate", "hi", "--seed", "3"])
    assert args.seed == 3 and engine_kwargs(args)["seed"] == 0
    args = parse(["generate", "hi", "--engine-seed", "4"])
    assert args.seed is None and engine_kwargs(args)["seed"] == 4


@pytest.mark.parametrize(("option", "expected"), [
    ([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False),
])
def test_async_scheduling_flag(option, expected):
    for command in COMMANDS:
        assert engine_kwargs(parse(command + option))["async_scheduling"] is expected


@pytest.mark.parametrize(("option", "message"), [
    (["--max-num-seqs", "0"], "max_num_seqs=0 must be >= 1"),
    (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization=1.5 must be in (0, 1]"),
    (["--num-kv-blocks", "0"], "num_kv_blocks=0 must be >= 1 (or None)"),
    (["--engine-seed", str(-2**63 - 1)],  # (torch's error was "Overflow when unpacking ...")
     f"seed={-2**63 - 1} must be in [-2**63, 2**63) (a 64-bit int)"),
    (["--tensor-parallel-size", "0"], "tensor_parallel_size=0 must be an int >= 1"),
    (["-tp", "2", "--distributed-executor-backend", "uni"],
     ("distributed_executor_backend='uni' runs one rank in the engine's process, but "
      "tensor_parallel_size=2; use 'mp' or 'auto'")),
])
def test_bad_value_is_the_engine_config_error(option, message, capsys):
    """EngineConfig's ValueError reaches the user as `pagedrt: error: ...`, exit code 2,
    before any model is loaded, with the option the field it names is set by."""
    flag = option[-2] if option[-2].startswith("--") else option[0]
    assert main(["generate", "hi", *option]) == 2
    assert capsys.readouterr().err == f"pagedrt: error: {message} (option {flag})\n"


@pytest.mark.parametrize(("message", "flag"), [
    ("seed=x must be an int", "--engine-seed"),
    ("num_scheduler_steps=0 must be ...", "--num-scheduler-steps"),
    ("multi_step_max_num_seqs=0 must be ...", "--multi-step-max-num-seqs"),
    ("max_num_seqs=0 must be >= 1", "--max-num-seqs"),
    ("top_p=0.0 must be in (0, 1]", None),  # (not an engine option)
    ("prompt has 12 tokens", None),
])
def test_option_of_an_engine_config_error(message, flag):
    from pagedrt.entrypoints.engine_args import option_of_error

    assert option_of_error(message) == flag


@pytest.mark.parametrize(("option", "choices"), [
    (["--block-size", "12"], "8, 16, 32"),
    (["--preemption-mode", "evict"], "'recompute', 'swap'"),
    (["--attention-backend", "flash"], "'auto', 'torch', 'triton'"),
    (["--kv-cache-dtype", "int8"], "'auto', 'fp8'"),
])
def test_value_outside_the_choices_is_a_usage_error(option, choices, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "hi", *option])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{option[0]}: invalid choice: " in err and f"(choose from {choices})" in err
    # the error line and where the options are, not argparse's usage block before it
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"pagedrt generate: error: argument {option[0]}")
    assert lines[1] == "(pagedrt generate --help lists the options)"


@pytest.mark.parametrize("argv", [["bench", "throughput", "--preset", "nope"],
                                  ["bench", "latency", "--contexts"], ["bogus"]])
def test_usage_error_is_one_line_and_the_help_pointer(argv, capsys):
    """Every command's usage error (the benchmarks' parsers too): exit code 2, the error
    naming the argument, then where the options are listed; no usage block."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    prog = "pagedrt" if argv == ["bogus"] else f"pagedrt {argv[0]} {argv[1]}"
    assert len(lines) == 2 and lines[0].startswith(f"{prog}: error: argument ")
    assert lines[1] == f"({prog} --help lists the options)"


def test_bench_engine_options_keep_their_defaults():
    """The throughput and latency benchmarks take every engine option; their defaults are
    EngineConfig's but for three larger batching settings, as before."""
    p = argparse.ArgumentParser()
    add_model_args(p)
    args = p.parse_args([])
    assert (args.preset, args.model, args.out) == ("qwen2-0.5b", None, "benchmarks/results")
    assert EngineConfig(**engine_kwargs(args)) == EngineConfig(
        gpu_memory_utilization=0.85, max_num_batched_tokens=16384, max_model_len=4096)
    args = p.parse_args(["--enforce-eager", "--num-kv-blocks", "64", "--async-scheduling"])
    kw = engine_kwargs(args)
    assert kw["enforce_eager"] and kw["num_kv_blocks"] == 64 and kw["async_scheduling"]


def test_engine_config_docstring_lists_every_field():
    for f in dataclasses.fields(EngineConfig):
        assert f"        {f.name}: " in EngineConfig.__doc__, f.name


def test_llm_rejects_an_unknown_option_listing_the_fields():
    names = sorted(f.name for f in dataclasses.fields(EngineConfig))
    with pytest.raises(TypeError, match=re.escape(
            f"unknown LLM argument(s) ['block_sizes']; engine options are {names}")):
        LLM(None, block_sizes=16)


@pytest.mark.parametrize(("option", "message"), [
    (["--min-p", "1.5"], "min_p=1.5 must be in [0, 1] (option --min-p)"),
    (["--top-p", "0"], "top_p=0.0 must be in (0, 1] (option --top-p)"),
    (["--max-tokens", "-1"], "max_tokens=-1 must be >= 1 (option --max-tokens)"),
    (["--temperature", "-1"], ("temperature=-1.0 must be >= 0 (0 means greedy) "
                              "(option --temperature)")),
    # (--seed is the request's; EngineConfig's seed is --engine-seed, below)
    (["--seed", str(2**63)], (f"seed={2**63} must be in [-2**63, 2**63) (a 64-bit int) "
                             "(option --seed)")),
])
def test_generate_sampling_value_refused_before_the_model_loads(option, message, capsys,
                                                                monkeypatch):
    """`pagedrt generate`'s sampling options (--min-p as in vLLM's SamplingParams) are checked
    before the model is loaded: the error is SamplingParams', with the flag it came from,
    exit code 2, and no LLM is built (one built would fail this test)."""
    import pagedrt

    def no_llm(*args, **kwargs):
        raise AssertionError("the model was loaded before the sampling settings were checked")

    monkeypatch.setattr(pagedrt, "LLM", no_llm)
    assert main(["generate", "hi", *option]) == 2
    assert capsys.readouterr().err == f"pagedrt: error: {message}\n"
    assert parse(["generate", "hi", "--min-p", "0.05"]).min_p == 0.05


@pytest.mark.parametrize("device", ["gpu", "mps", "cuda:x"],
                         ids=["named-gpu", "mps", "bad-index"])  # (an id "gpu" marks a GPU test)
def test_unknown_device_is_a_clear_error(device, capsys):
    """`--device gpu` was a raw torch RuntimeError and exit code 1 (a fresh user's run): now
    the engine's ValueError naming the value and the accepted ones, exit code 2."""
    from pagedrt.engine.llm_engine import resolve_device

    with pytest.raises(ValueError, match=f"device='{device}'; use 'auto', 'cpu', 'cuda'"):
        resolve_device(device)
    assert main(["generate", "hi", "--model", "x", "--device", device]) == 2
    err = capsys.readouterr().err
    assert f"device='{device}'" in err and err.endswith(" (option --device)\n")


def test_unknown_dtype_names_the_flag(capsys):
    assert main(["generate", "hi", "--model", "x", "--dtype", "foo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedrt: error: dtype='foo'; use 'auto' or one of ")
    assert err.endswith(" (option --dtype)\n")


def test_cuda_without_cuda_names_the_cli_spelling_too(monkeypatch, capsys):
    """`--device cuda` on a machine without CUDA answered with the Python API's spelling
    ("use device='cpu'"; a fresh user's run): the line now gives the flag as well."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["generate", "hi", "--model", "x", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "device 'cuda' asked for, but CUDA is not available" in err
    assert "--device cpu" in err


def test_missing_model_names_the_cli_spelling_too(tmp_path, capsys):
    """A --model path that is not a model mentioned "None for the default model", a Python
    spelling: the line now says what to do on the command line too."""
    missing = str(tmp_path / "nope")
    assert main(["generate", "hi", "--model", missing, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"cannot load model '{missing}'" in err
    assert "no --model on the command line" in err


def test_a_file_that_is_not_gguf_names_the_file_and_what_to_pass(tmp_path, monkeypatch,
                                                                 capsys):
    """`--model junk.gguf` printed only gguf-py's "GGUF magic invalid" (a fresh user's try):
    the line now names the file and what pagedrt loads, for bad bytes and a truncated header."""
    monkeypatch.setenv("PAGEDRT_CACHE_DIR", str(tmp_path / "cache"))
    for name, data in [("junk.gguf", bytes(range(256)) * 4), ("cut.gguf", b"GGUF\x03\0\0\0")]:
        path = tmp_path / name
        path.write_bytes(data)
        assert main(["generate", "hi", "--model", str(path), "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"pagedrt: error: '{path}' is not a GGUF file pagedrt can read (")
        assert "pass a complete .gguf file" in err and "Traceback" not in err


def test_triton_backend_on_the_cpu_without_the_interpreter_is_one_line(monkeypatch, capsys):
    """`--attention-backend triton` on a CPU machine passed the config's checks and failed at
    the first step with Triton's traceback ("0 active drivers"; a fresh user's run): now one
    line, before the model loads, naming the value and what works."""
    from pagedrt.engine.llm_engine import LLMEngine

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the backend was checked")

    monkeypatch.setattr("pagedrt.engine.llm_engine.create_executor", no_model)
    assert main(["generate", "hi", "--model", "x", "--device", "cpu",
                 "--attention-backend", "triton"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedrt: error: attention_backend='triton' on the CPU needs") and (
        "use 'auto' or 'torch'" in err) and err.count("\n") == 1
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        LLMEngine(config=EngineConfig(attention_backend="triton"), device="cpu")
    from pagedrt.ops.attention import uses_triton

    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):  # (the ops' own check)
        uses_triton("triton", torch.zeros(1))


def test_async_scheduling_variable_takes_0_or_1(tiny, monkeypatch):
    """PAGEDRT_ASYNC_SCHEDULING other than 0 or 1 is refused by name (it used to turn async
    scheduling on for any value but "0", "false" included)."""
    from pagedrt import LLM

    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "false")
    with pytest.raises(ValueError, match=r"PAGEDRT_ASYNC_SCHEDULING='false'; set it to 0 \(off\) or 1"):
        LLM(tiny, num_kv_blocks=16)
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "0")
    assert LLM(tiny, num_kv_blocks=16).llm_engine.async_scheduling is False


def test_bench_results_record_the_start_up_timing_choices(tmp_path, monkeypatch):
    """Each results file names what the start-up timing chose in its process (shape key ->
    config, None for the plain path), so that a figure can be traced to its kernels."""
    import json

    from pagedrt.bench.common import write_results
    from pagedrt.ops import gemv_triton, matmul_triton

    monkeypatch.setattr(gemv_triton, "_CHOICE", {((896, 896), 1): (8, 256, 4)})
    monkeypatch.setattr(gemv_triton, "_FUSED_CHOICE", {})
    monkeypatch.setattr(matmul_triton, "_CHOICE", {("qkv_rope", 16): None})
    with open(write_results(str(tmp_path), "run", [{"x": 1}])) as f:
        doc = json.load(f)
    assert doc["results"] == [{"x": 1}]
    assert doc["kernel_choices"] == {
        "gemv_triton._CHOICE": {"((896, 896), 1)": [8, 256, 4]},
        "matmul_triton._CHOICE": {"('qkv_rope', 16)": None}}


def test_serve_with_a_path_that_is_not_a_model_is_one_line_and_exit_2(tmp_path, capfd):
    """`pagedrt serve --model foo` printed the loader's clear line, then a 15-line traceback
    from the engine core, and exited 1 (a fresh user's run), where `pagedrt generate` prints
    the line alone and exits 2: now serve does the same."""
    missing = str(tmp_path / "no-such-model")
    assert main(["serve", "--model", missing, "--device", "cpu", "--port", "0",
                 "--no-warm-up"]) == 2
    captured = capfd.readouterr()  # (fd level: the engine core's output too)
    assert f"pagedrt: error: cannot load model '{missing}'" in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_chat_prompt_over_max_model_len_names_the_template(smollm2_path, capsys):
    """`pagedrt generate "Hi" --max-model-len 10` (a fresh user's try): the prompt is the chat
    template's 31 tokens, which the error now says, with the way around it."""
    assert main(["generate", "Hi", "--model", smollm2_path, "--max-model-len", "10",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedrt: error: prompt has ") and "max_model_len=10" in err
    assert "the chat template's tokens too; --no-chat sends the text as it is" in err


def test_max_tokens_over_max_model_len_names_the_flags(smollm2_path, capsys):
    """`pagedrt generate "..." --max-model-len 40` (a fresh user's try): the default
    --max-tokens 128 does not fit; the error names both flags and the default's value."""
    assert main(["generate", "What is the capital of France?", "--model", smollm2_path,
                 "--max-model-len", "40", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "+ max_tokens (128) = " in err and "exceeds max_model_len=40" in err
    assert "(--max-tokens is 128, the default; --max-model-len sets the other bound; " in err
    assert "--no-chat sends the text as it is)" in err


def test_a_request_over_the_whole_cache_names_the_sizing_flags(smollm2_path, capsys):
    """`--num-kv-blocks 1` (a fresh user's try) said "1 blocks" and "enlarge the KV cache"
    without saying how: the error now names the fields and, on the command line, the flags."""
    assert main(["generate", "Hi", "--model", smollm2_path, "--num-kv-blocks", "1",
                 "--max-tokens", "200", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "KV blocks but the whole cache has 1 block of 16 tokens; lower max_tokens or " in err
    assert ("enlarge the KV cache (num_kv_blocks, or kv_cache_memory_bytes on a CPU, "
            "gpu_memory_utilization on CUDA)") in err
    assert err.endswith("(options --max-tokens, --num-kv-blocks, --kv-cache-memory-bytes, "
                        "--gpu-memory-utilization)\n")


def test_an_answer_cut_by_max_tokens_says_so(smollm2_path, capsys):
    """`pagedrt generate` printed an answer cut by --max-tokens as if it had ended (a fresh
    user's try): a cut answer is now followed by a line that says so; one that ended is not."""
    assert main(["generate", "Count from 1 to 50, one number a line.", "--model",
                 smollm2_path, "--max-tokens", "6", "--quiet"]) == 0
    assert "\n[cut off at --max-tokens 6]\n" in capsys.readouterr().out
    assert main(["generate", "Say yes.", "--model", smollm2_path, "--max-tokens", "100",
                 "--quiet"]) == 0
    assert "[cut off at" not in capsys.readouterr().out


def test_a_misspelt_option_names_the_command_and_the_closest_option(capsys):
    """`pagedrt generate hi --temprature 0.5`: the error is the subcommand's (its --help lists
    the options) and suggests --temperature; an unknown word with nothing close gets no hint."""
    with pytest.raises(SystemExit) as e:
        main(["generate", "hi", "--temprature", "0.5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "pagedrt generate: error: unrecognized arguments: --temprature 0.5" in err
    assert "--temprature: did you mean --temperature?" in err
    assert "(pagedrt generate --help lists the options)" in err
    with pytest.raises(SystemExit):
        main(["serve", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "pagedrt serve: error: unrecognized arguments: --zzzzzz\n" in err
    assert "did you mean" not in err


def test_version(capsys):
    import pagedrt

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"pagedrt {pagedrt.__version__}"


@pytest.mark.parametrize(("port", "message"), [
    ("-1", "-1 is out of range: give 0 to 65535"),
    ("70000", "70000 is out of range: give 0 to 65535"),
    ("http", "'http' is not a port number: give 0 to 65535"),
])
def test_serve_port_out_of_range_is_a_usage_error(port, message, capsys):
    """`pagedrt serve --port -1` (or 70000) ended in socket.bind's OverflowError traceback (a
    fresh user's run): now a usage error naming the value, before anything starts."""
    with pytest.raises(SystemExit) as e:
        main(["serve", "--port", port])
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"pagedrt serve: error: argument --port: {message}"
