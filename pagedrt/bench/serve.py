"""`pagedrt bench serve`: online benchmark of a running OpenAI-compatible server (`pagedrt serve`,
vLLM, ...), modelled on what `vllm bench serve` reports.

Workload: --num-prompts random token-id prompts (ids in [--min-token-id, vocab), away from
special tokens), lengths uniform in [len*(1-r), len*(1+r)] for --input-len and --output-len
with r = --range-ratio, after an optional shared prefix of --prefix-len ids; every request asks
for exactly its output length (ignore_eos, temperature 0). Each request rate of a sweep draws
other prompts (seeded by --seed and the rate's position), so a server's prefix cache does not
carry one rate's prompts into the next; repeating a whole run with the same --seed does reuse
them (change --seed or restart the server).

Arrivals: Poisson at each --request-rate (exponential gaps of mean 1/rate, seeded), "inf" sends
all at once; --max-concurrency caps requests in flight. --num-client-processes K spreads the
requests over K client processes; the same figures with a larger K show the client is not
the limit.

Reports per rate: duration, completed/failed requests, request, input, output and total
throughput, goodput under --goodput SLOs, and TTFT, TPOT, ITL, E2EL (mean, median, p90, p99,
ms; definitions in pagedrt.bench.serve_metrics). --out writes them as JSON, --plot a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import os
import shlex

import numpy as np

from pagedrt.bench.serve_client import (
    ClientConfig,
    RequestSpec,
    run_clients,
    run_schedule,
    split_concurrency,
)
from pagedrt.bench.serve_metrics import DEFAULT_GOODPUT, parse_goodput, summarize
from pagedrt.entrypoints.arg_parser import ArgumentParser

DEFAULT_VOCAB_SIZE = 32000
PROBE_STREAM = 2**31  # workload_rng index of the probe request (no rate index reaches it)
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def parse_request_rates(text: str) -> list[float]:
    """[8.0, 32.0, inf] from "8,32,inf" (requests/s). Raises ValueError for a value that is not
    a number > 0 or inf."""
    rates = []
    for item in text.split(","):
        try:
            rate = float(item)
        except ValueError:
            raise ValueError(f"--request-rate {item!r} is not a number; give requests/s, "
                             "e.g. 8,32,inf") from None
        if not rate > 0:
            raise ValueError(f"--request-rate {item!r} must be > 0 (or inf for a burst)")
        rates.append(rate)
    return rates


def arrival_offsets(num_requests: int, rate: float, rng: np.random.Generator) -> list[float]:
    """Send times in seconds from the start of a Poisson process of `rate` requests/s: the
    first request at 0, then exponential gaps of mean 1/rate. rate=inf: all at 0."""
    if num_requests == 0:
        return []
    if math.isinf(rate):
        return [0.0] * num_requests
    gaps = rng.exponential(1.0 / rate, size=num_requests - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def length_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """[low, high] of lengths uniform in [length*(1-r), length*(1+r)], at least 1."""
    low = max(1, math.floor(length * (1 - range_ratio)))
    return low, max(low, math.ceil(length * (1 + range_ratio)))


def random_requests(num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                    prefix_len: int, min_token_id: int, vocab_size: int,
                    rng: np.random.Generator) -> list[RequestSpec]:
    """Token-id prompts: prefix_len shared ids, then a random part of a length uniform in
    length_bounds(input_len, range_ratio); output lengths likewise. Ids uniform in
    [min_token_id, vocab_size)."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--range-ratio {range_ratio} must be in [0, 1)")
    if not 0 <= min_token_id < vocab_size:
        raise ValueError(f"--min-token-id {min_token_id} must be in [0, vocab size "
                         f"{vocab_size}); lower it or pass the model's --vocab-size")
    for name, value in (("--num-prompts", num_prompts), ("--input-len", input_len),
                        ("--output-len", output_len)):
        if value < 1:
            raise ValueError(f"{name} {value} must be >= 1")
    if prefix_len < 0:
        raise ValueError(f"--prefix-len {prefix_len} must be >= 0")
    in_low, in_high = length_bounds(input_len, range_ratio)
    out_low, out_high = length_bounds(output_len, range_ratio)
    in_lens = rng.integers(in_low, in_high, size=num_prompts, endpoint=True)
    out_lens = rng.integers(out_low, out_high, size=num_prompts, endpoint=True)
    prefix = rng.integers(min_token_id, vocab_size, size=prefix_len).tolist()
    specs = []
    for i, (n_in, n_out) in enumerate(zip(in_lens.tolist(), out_lens.tolist())):
        ids = prefix + rng.integers(min_token_id, vocab_size, size=n_in).tolist()
        specs.append(RequestSpec(index=i, prompt=ids, prompt_len=len(ids), output_len=n_out))
    return specs


def workload_rng(seed: int, rate_index: int) -> np.random.Generator:
    """The generator of the prompts and arrivals of the sweep's `rate_index`-th rate."""
    return np.random.default_rng([seed, rate_index])


def fetch_model_card(base_url: str, api_key: str | None) -> dict:
    """The first model of GET {base_url}/v1/models. Raises ValueError when there is none."""
    import httpx

    url = base_url.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=30)
        response.raise_for_status()
        return response.json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"could not read the served model from {url} ({type(e).__name__}: "
                         f"{e}); check --base-url and --api-key, or pass --model and "
                         "--vocab-size") from None


def load_tokenizer(path: str):
    """A Hugging Face tokenizer from a model folder or a .gguf file (for chat prompts)."""
    from transformers import AutoTokenizer

    if path.endswith(".gguf"):
        folder, name = os.path.split(os.path.abspath(path))
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return AutoTokenizer.from_pretrained(path)


def probe(spec: RequestSpec, cfg: ClientConfig) -> None:
    """Send one request before timing anything. Raises ValueError with the server's answer
    when it fails: nothing would succeed."""
    record = asyncio.run(run_schedule([spec], [0.0], cfg, 1))[0]
    if not record.success:
        raise ValueError(f"the probe request to {cfg.url} failed: {record.error}; check "
                         "--base-url, --endpoint, --model, --api-key and the lengths")


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def print_summary(s: dict) -> None:
    slo = ", ".join(f"{k} <= {v:g} ms" for k, v in s["goodput_slo_ms"].items())
    cap = s["max_concurrency"] if s["max_concurrency"] is not None else "none"
    print(f"\n===== request rate {s['request_rate']} req/s, max concurrency {cap} =====")
    rows = [
        ("completed / failed requests", f"{s['completed']} / {s['failed']}"),
        ("duration (s)", f"{s['duration_s']:.2f}"),
        ("request throughput (req/s)", f"{s['request_throughput']:.2f}"),
        (f"goodput (req/s) [{slo}]", f"{s['goodput']:.2f}" if s["goodput"] is not None
         else "- (no TTFT/TPOT unstreamed; --goodput e2el:MS)"),
        ("input token throughput (tok/s)", f"{s['input_throughput']:.1f}"),
        ("output token throughput (tok/s)", f"{s['output_throughput']:.1f}"),
        ("total token throughput (tok/s)", f"{s['total_token_throughput']:.1f}"),
        ("peak concurrent requests", f"{s['peak_concurrent_requests']}"),
        # near 1.0 per process: the load generator, not the server, sets the pace
        ("client CPU busy (CPU s / wall s, per process)",
         f"{s['client_cpu_s'] / max(s['duration_s'], 1e-9) / s['num_client_processes']:.2f}"),
    ]
    for label, value in rows:
        print(f"{label:<48} {value:>12}")
    print(f"{'(ms)':<8} {'mean':>10} {'median':>10} {'p90':>10} {'p99':>10}")
    for key in ("ttft", "tpot", "itl", "e2el"):
        st = s[f"{key}_ms"]
        cells = [f"{st[q]:10.2f}" if st[q] is not None else f"{'-':>10}"
                 for q in ("mean", "median", "p90", "p99")]
        print(f"{key.upper():<8} {' '.join(cells)}")
    for error, count in s["errors"].items():
        print(f"  {count} x {error}")
    if s["short_outputs"]:
        print(f"  note: {s['short_outputs']} requests got fewer tokens than asked for "
              "(the server ignored ignore_eos?)")


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def print_sweep(results: list[dict]) -> None:
    print(f"\n{'rate':>6} {'done':>6} {'fail':>5} {'req/s':>8} {'out tok/s':>10} "
          f"{'goodput':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9}")

    for s in results:
        latencies = " ".join(_num(s[key][q], 9, 1) for key in ("ttft_ms", "tpot_ms")
                             for q in ("median", "p99"))
        print(f"{s['request_rate']:>6} {s['completed']:>6} {s['failed']:>5} "
              f"{s['request_throughput']:>8.2f} {s['output_throughput']:>10.1f} "
              f"{_num(s['goodput'], 8, 2)} {latencies}")


def write_json(path: str, config: dict, results: list[dict]) -> None:
    from pagedrt.bench.common import git_commit

    doc = {"config": {**config, "commit": os.environ.get("PAGEDRT_COMMIT") or git_commit()},
           "results": results}
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="pagedrt bench serve", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server's root URL")
    p.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    p.add_argument("--model", default=None,
                   help="model name sent in each request (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)")
    p.add_argument("--tokenizer", default=None,
                   help="HF folder or .gguf whose tokenizer turns the random ids into text; "
                        "needed for /v1/chat/completions")
    p.add_argument("--num-prompts", type=int, default=256, help="requests per request rate")
    p.add_argument("--input-len", type=int, default=512, help="prompt tokens (random part)")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens of each request")
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1")
    p.add_argument("--prefix-len", type=int, default=0,
                   help="random ids shared by every prompt, before its own --input-len ids")
    p.add_argument("--min-token-id", type=int, default=1000,
                   help="lowest token id drawn (the ids below hold most special tokens)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help=f"ids are drawn below this (default: the model card's vocab_size, "
                        f"else {DEFAULT_VOCAB_SIZE})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-rate", default="inf",
                   help="requests/s of Poisson arrivals, a comma list for a sweep; inf = all "
                        "at once, e.g. 8,32,128,inf")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight (default: no cap)")
    p.add_argument("--num-client-processes", type=int, default=1,
                   help="client processes sharing the requests (each its own event loop)")
    p.add_argument("--no-stream", action="store_true",
                   help="whole responses (no TTFT, TPOT or ITL)")
    p.add_argument("--goodput", nargs="+", default=list(DEFAULT_GOODPUT), metavar="METRIC:MS",
                   help="SLOs of goodput, from ttft, tpot, e2el in ms (default: ttft:500 "
                        "tpot:50)")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may take from send to end before it fails")
    p.add_argument("--out", default=None, help="write the results to this JSON file")
    p.add_argument("--save-requests", action="store_true",
                   help="also write every request's record into the JSON")
    p.add_argument("--plot", default=None,
                   help="PNG of TTFT and TPOT (p50, p99) against request rate")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    slo = parse_goodput(args.goodput)
    rates = parse_request_rates(args.request_rate)
    if args.request_timeout <= 0:
        raise ValueError(f"--request-timeout {args.request_timeout} must be > 0 seconds")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency {args.max_concurrency} must be >= 1 (or left out)")
    split_concurrency(args.max_concurrency, args.num_client_processes)  # checks both
    chat = args.endpoint == "/v1/chat/completions"
    if chat and args.tokenizer is None:
        raise ValueError("--endpoint /v1/chat/completions sends text: give --tokenizer PATH "
                         "(the served model's folder or .gguf) to turn the random ids into text")
    card = {}
    if args.model is None or args.vocab_size is None:
        try:
            card = fetch_model_card(args.base_url, args.api_key)
        except ValueError:
            if args.model is None:
                raise
    model = args.model or card.get("id")
    if not model:
        raise ValueError(f"the model card of {args.base_url}/v1/models has no id; pass --model")
    vocab_size = args.vocab_size or card.get("vocab_size") or DEFAULT_VOCAB_SIZE
    longest = (args.prefix_len + length_bounds(args.input_len, args.range_ratio)[1]
               + length_bounds(args.output_len, args.range_ratio)[1])
    if card.get("max_model_len") and longest > card["max_model_len"]:
        raise ValueError(f"the longest request ({longest} tokens: --prefix-len, --input-len and "
                         f"--output-len at --range-ratio) exceeds the server's max_model_len "
                         f"{card['max_model_len']}; shorten them")
    tokenizer = load_tokenizer(args.tokenizer) if chat else None
    cfg = ClientConfig(url=args.base_url.rstrip("/") + args.endpoint, model=model, chat=chat,
                       stream=not args.no_stream, api_key=args.api_key,
                       request_timeout_s=args.request_timeout)

    def make_specs(rng: np.random.Generator, num_prompts: int, output_len: int,
                   range_ratio: float) -> list[RequestSpec]:
        specs = random_requests(num_prompts, args.input_len, output_len, range_ratio,
                                args.prefix_len, args.min_token_id, vocab_size, rng)
        if tokenizer is not None:
            for s in specs:
                s.prompt = tokenizer.decode(s.prompt)
        return specs

    workloads = []  # (requests, send offsets) of each rate, all drawn before anything is sent
    for i, rate in enumerate(rates):
        rng = workload_rng(args.seed, i)
        specs = make_specs(rng, args.num_prompts, args.output_len, args.range_ratio)
        workloads.append((specs, arrival_offsets(len(specs), rate, rng)))
    # the probe: one output token, a prompt of the usual length from ids no rate draws
    probe(make_specs(workload_rng(args.seed, PROBE_STREAM), 1, 1, 0.0)[0], cfg)
    print(f"benchmarking {model!r} at {cfg.url}: {args.num_prompts} requests per rate, "
          f"input {args.input_len}, output {args.output_len}, range ratio {args.range_ratio}, "
          f"{args.num_client_processes} client process(es)")
    results = []
    for rate, (specs, offsets) in zip(rates, workloads):
        records, client_cpu_s = _run_with_progress(specs, offsets, cfg, args)
        summary = {"request_rate": rate_label(rate), "max_concurrency": args.max_concurrency,
                   **summarize(records, slo, stream=not args.no_stream),
                   "client_cpu_s": client_cpu_s,
                   "num_client_processes": args.num_client_processes}
        print_summary(summary)
        if args.save_requests:
            summary["requests"] = [dataclasses.asdict(r) for r in records]
        results.append(summary)
    if len(results) > 1:
        print_sweep(results)
    if args.out:
        config = {
            "command": "pagedrt bench serve " + shlex.join(argv),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "base_url": args.base_url, "endpoint": args.endpoint, "model": model,
            "vocab_size": vocab_size, "stream": not args.no_stream,
            "num_prompts": args.num_prompts, "input_len": args.input_len,
            "output_len": args.output_len, "range_ratio": args.range_ratio,
            "prefix_len": args.prefix_len, "min_token_id": args.min_token_id, "seed": args.seed,
            "request_rates": [rate_label(r) for r in rates],
            "max_concurrency": args.max_concurrency,
            "num_client_processes": args.num_client_processes,
            "request_timeout_s": args.request_timeout, "goodput_slo_ms": slo,
        }
        write_json(args.out, config, results)
        print(f"results: {args.out}")
    if args.plot:
        from pagedrt.bench.plots import plot_serve

        plot_serve(results, args.plot, title=f"{model}: {args.input_len} in / "
                   f"{args.output_len} out")
        print(f"plot: {args.plot}")
    return 0


def _run_with_progress(specs, offsets, cfg, args):
    """run_clients with a tqdm bar of completed requests (one client process; on a terminal)."""
    from tqdm import tqdm

    with tqdm(total=len(specs), desc="requests", unit="req", leave=False,
              disable=None if args.num_client_processes == 1 else True) as bar:
        return run_clients(specs, offsets, cfg, args.max_concurrency, args.num_client_processes,
                           progress=lambda record: bar.update())
