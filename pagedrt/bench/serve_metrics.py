"""Metrics of `pagedrt bench serve`, from per-request records (pagedrt.bench.serve_client).

Definitions (as vLLM's `vllm bench serve` reports them):
  TTFT   time to first token: request sent -> first chunk carrying output, seconds
  TPOT   time per output token after the first, per request:
         (E2EL - TTFT) / (output tokens - 1); undefined for a single output token
  ITL    inter-token latency: every gap between consecutive output chunks, all requests pooled
  E2EL   end-to-end latency: request sent -> response complete
  goodput  completed requests per second that meet every latency SLO given (the measure of
         DistServe, Zhong et al., OSDI 2024); a request whose metric is undefined (TPOT of a
         one-token answer) is not held to that SLO.
Throughputs divide by the benchmark duration: from the start of the schedule to the end of the
last request. Only completed requests count towards token totals and latency statistics.
Percentiles are numpy's default (linear interpolation between order statistics).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from pagedrt.bench.serve_client import RequestRecord

SLO_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_GOODPUT = ("ttft:500", "tpot:50")


def parse_goodput(items: list[str] | tuple[str, ...]) -> dict[str, float]:
    """{"ttft": 500.0, ...} in ms from ["ttft:500", "tpot:50"] (e2el also allowed).
    Raises ValueError naming a malformed item, an unknown metric or a value that is not > 0."""
    slo: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--goodput {item!r} is not METRIC:MS; write e.g. ttft:500 tpot:50")
        if name not in SLO_METRICS:
            raise ValueError(f"--goodput {item!r}: unknown metric {name!r}; use one of "
                             f"{', '.join(SLO_METRICS)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of ms") from None
        if not ms > 0:
            raise ValueError(f"--goodput {item!r}: the SLO must be > 0 ms")
        slo[name] = ms
    return slo


def latency_stats(values_s) -> dict[str, float | None]:
    """{"mean", "median", "p90", "p99"} in ms of values in seconds; None each when empty."""
    a = np.asarray(values_s, dtype=np.float64) * 1e3
    if a.size == 0:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "median": float(p50), "p90": float(p90), "p99": float(p99)}


def tpot_s(record: RequestRecord) -> float | None:
    """(E2EL - TTFT) / (output tokens - 1) in seconds; None without a TTFT or with one token."""
    if record.ttft_s is None or record.e2el_s is None or record.output_tokens < 2:
        return None
    return (record.e2el_s - record.ttft_s) / (record.output_tokens - 1)


def meets_slo(record: RequestRecord, slo_ms: dict[str, float]) -> bool:
    """Completed, and every SLO metric it has is within its bound (see the module docstring).
    A TTFT or E2EL SLO needs the metric: a request without it (not streamed) does not count."""
    if not record.success:
        return False
    values = {"ttft": record.ttft_s, "tpot": tpot_s(record), "e2el": record.e2el_s}
    for name, bound_ms in slo_ms.items():
        value = values[name]
        if value is None:
            if name == "tpot" and record.ttft_s is not None:
                continue  # one output token: no TPOT to hold
            return False
        if value * 1e3 > bound_ms:
            return False
    return True


def peak_concurrency(records: list[RequestRecord]) -> int:
    """The largest number of requests in flight at once (from start_s and end_s)."""
    events = sorted([(r.start_s, 1) for r in records] + [(r.end_s, -1) for r in records],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def summarize(records: list[RequestRecord], slo_ms: dict[str, float], stream: bool = True) -> dict:
    """Throughputs (req/s, tok/s), latency statistics (ms) and goodput of one run. Without
    streaming there is no TTFT or TPOT: goodput is None unless the SLOs hold only e2el."""
    done = [r for r in records if r.success]
    duration = max((r.end_s for r in records), default=0.0)
    per_s = 1.0 / duration if duration > 0 else 0.0
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    measurable = stream or set(slo_ms) <= {"e2el"}
    good = sum(meets_slo(r, slo_ms) for r in done) if measurable else None
    errors = Counter(r.error for r in records if not r.success)
    tpots = [t for r in done if (t := tpot_s(r)) is not None]
    return {
        "num_requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) * per_s,
        "input_throughput": input_tokens * per_s,
        "output_throughput": output_tokens * per_s,
        "total_token_throughput": (input_tokens + output_tokens) * per_s,
        "goodput_slo_ms": dict(slo_ms),
        "good_requests": good,
        "goodput": good * per_s if good is not None else None,
        "peak_concurrent_requests": peak_concurrency(records),
        "short_outputs": sum(r.output_tokens < r.output_len for r in done),
        "output_tokens_counted_from_chunks": sum(r.output_tokens_from == "chunks" for r in done),
        "ttft_ms": latency_stats([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_ms": latency_stats(tpots),
        "itl_ms": latency_stats([gap for r in done for gap in r.itl_s]),
        "e2el_ms": latency_stats([r.e2el_s for r in done]),
        "errors": dict(errors.most_common(10)),
    }
