"""Prometheus metrics of the server, on a private registry (several apps can live in one process).

Gauges and counters are read on scrape from the latest `LLMEngine.stats()` snapshot, which the
engine-core process sends every 0.1 s while busy; the latency histograms are observed in the API
process as tokens arrive from the core. With several API processes (`--api-server-count`) each
serves its own histograms and request counts (the requests it handled).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

# series name -> (stats key, help); gauges read from the snapshot
_GAUGES = {
    "pagedrt_num_requests_running": ("num_running", "Sequences in the running batch."),
    "pagedrt_num_requests_waiting": ("num_waiting", "Requests waiting to be scheduled."),
    "pagedrt_num_requests_swapped": ("num_swapped", "Sequences swapped out to CPU memory."),
    "pagedrt_kv_blocks_total": ("num_blocks", "KV cache blocks in the pool."),
    "pagedrt_kv_blocks_used": ("num_used_blocks", "KV blocks held by a request (ref count >= 1)."),
    "pagedrt_kv_blocks_free": ("num_free_blocks", "KV blocks free and not cached."),
    "pagedrt_kv_blocks_cached": ("num_cached_blocks",
                                 "KV blocks free but still holding a cached prefix (evictable)."),
    "pagedrt_prefix_cache_hit_rate": (
        "prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / tokens looked up."),
    "pagedrt_kv_cache_bytes_per_token": (
        "kv_cache_bytes_per_token",
        "KV cache bytes per token: all layers, K and V (and an FP8 cache's scales)."),
    "pagedrt_spec_decode_acceptance_rate": (
        "spec_decode_acceptance_rate",
        "Speculative decoding: draft tokens accepted / draft tokens verified."),
    "pagedrt_spec_decode_mean_accepted_length": (
        "spec_decode_mean_accepted_length",
        "Speculative decoding: tokens per sequence-step with drafts (1 + accepted / drafts)."),
}
# series name (without _total) -> (stats key, help)
_COUNTERS = {
    "pagedrt_num_preemptions": ("num_preemptions", "Sequences preempted (recompute or swap)."),
    "pagedrt_prompt_tokens": ("server_prompt_tokens", "Prompt tokens of admitted requests."),
    "pagedrt_generation_tokens": ("num_generated_tokens", "Tokens generated."),
    "pagedrt_prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "pagedrt_prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    "pagedrt_spec_decode_num_drafts": (
        "spec_decode_num_drafts", "Speculative decoding: sequence-steps that verified drafts."),
    "pagedrt_spec_decode_num_draft_tokens": (
        "spec_decode_num_draft_tokens", "Speculative decoding: draft tokens verified."),
    "pagedrt_spec_decode_num_accepted_tokens": (
        "spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens accepted."),
    "pagedrt_spec_decode_num_pauses": (
        "spec_decode_num_pauses",
        "Speculative decoding: pauses of a sequence whose drafts were mostly rejected."),
    "pagedrt_multi_step_plans": (
        "num_multi_step_plans", "Multi-step decode: plans that ran more than one pass."),
    "pagedrt_multi_step_passes": ("num_multi_step_passes", "Multi-step decode: their passes."),
}


class _StatsCollector:
    def __init__(self, get_stats: Callable[[], dict]) -> None:
        self.get_stats = get_stats

    def collect(self):
        stats = self.get_stats()
        for name, (key, doc) in _GAUGES.items():
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(stats.get(key, 0) or 0))
            yield g
        for name, (key, doc) in _COUNTERS.items():
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(stats.get(key, 0) or 0))
            yield c
        if stats.get("kv_cache_dtype"):
            info = GaugeMetricFamily(
                "pagedrt_kv_cache_info", "The KV cache's element type and block size (always 1).",
                labels=["kv_cache_dtype", "block_size"])
            info.add_metric([stats["kv_cache_dtype"], str(stats.get("block_size", ""))], 1.0)
            yield info
        finished = CounterMetricFamily("pagedrt_request_success", "Finished requests by reason.",
                                       labels=["finished_reason"])
        for reason, count in sorted(stats.get("server_finished", {}).items()):
            finished.add_metric([reason], float(count))
        yield finished


class BatchHistogram:
    """A Prometheus histogram observed a batch at a time (one numpy call per batch instead of a
    locked Python call per value: inter-token gaps arrive for every stream at every step).
    Single-threaded: observe and collect run on the API process's event loop."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self.counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # last: above every bound
        self.sum = 0.0

    def observe_many(self, values) -> None:
        values = np.asarray(values, dtype=np.float64)
        # a value equal to a bound belongs to that bucket (le): side="left"
        self.counts += np.bincount(np.searchsorted(self.bounds, values, side="left"),
                                   minlength=len(self.counts))
        self.sum += float(values.sum())

    def observe(self, value: float) -> None:
        self.observe_many([value])

    def collect(self):
        cumulative = np.cumsum(self.counts)
        buckets = [(repr(float(b)), int(c)) for b, c in zip(self.bounds, cumulative)]
        buckets.append(("+Inf", int(cumulative[-1])))
        h = HistogramMetricFamily(self.name, self.documentation)
        h.add_metric([], buckets, self.sum)
        yield h


class ServerMetrics:
    """The registry and the histograms; `bind` tells it where the stats snapshot lives."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.time_to_first_token = Histogram(
            "pagedrt_time_to_first_token_seconds",
            "From the HTTP request's arrival to its first generated token.",
            buckets=_TTFT_BUCKETS, registry=self.registry)
        self.inter_token_latency = BatchHistogram(
            "pagedrt_inter_token_latency_seconds",
            "Time between two consecutive engine messages that gave a request new tokens.",
            _ITL_BUCKETS)
        self.registry.register(self.inter_token_latency)
        self.e2e_request_latency = Histogram(
            "pagedrt_e2e_request_latency_seconds",
            "From the HTTP request's arrival to its last token.",
            buckets=_E2E_BUCKETS, registry=self.registry)

    def bind(self, get_stats: Callable[[], dict]) -> None:
        self.registry.register(_StatsCollector(get_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)
