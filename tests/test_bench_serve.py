"""`pagedrt bench serve` against a fake OpenAI-compatible server with known timings
(tests/fake_openai_server.py), and its pure parts (SSE parsing, arrivals, prompts, metrics).

Latencies are only checked against lower bounds the fake guarantees (its sleeps), or very
loose upper bounds; counts are checked exactly.
"""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest
from fake_openai_server import MODEL, Behaviour, FakeServer

from pagedrt.bench import serve
from pagedrt.bench.serve_client import (
    ClientConfig,
    RequestRecord,
    RequestSpec,
    SSEParser,
    run_schedule,
    split_concurrency,
)
from pagedrt.bench.serve_metrics import latency_stats, meets_slo, parse_goodput, tpot_s
from pagedrt.entrypoints import cli

TIMER_SLACK_S = 0.002  # how early a fake server's timed sleep may end (uvloop)

SUMMARY_KEYS = {
    "request_rate", "max_concurrency", "num_requests", "completed", "failed", "duration_s",
    "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput",
    "output_throughput", "total_token_throughput", "goodput_slo_ms", "good_requests",
    "goodput", "peak_concurrent_requests", "short_outputs", "output_tokens_counted_from_chunks",
    "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "errors", "client_cpu_s", "num_client_processes"}
CONFIG_KEYS = {
    "command", "date", "base_url", "endpoint", "model", "vocab_size", "stream", "num_prompts",
    "input_len", "output_len", "range_ratio", "prefix_len", "min_token_id", "seed",
    "request_rates", "max_concurrency", "num_client_processes", "request_timeout_s",
    "goodput_slo_ms", "commit"}
STATS_KEYS = {"mean", "median", "p90", "p99"}


def first_ids(num_prompts: int, input_len: int = 16, output_len: int = 6, rate_index: int = 0,
              seed: int = 0) -> list[int]:
    """The first token id of each prompt the benchmark will send at `rate_index` (the fake
    picks its misbehaviour by it)."""
    specs = serve.random_requests(num_prompts, input_len, output_len, 0.0, 0, 1000,
                                  serve.DEFAULT_VOCAB_SIZE, serve.workload_rng(seed, rate_index))
    return [s.prompt[0] for s in specs]


def run_bench(fake: FakeServer, tmp_path, *extra: str, num_prompts: int = 12,
              output_len: int = 6) -> dict:
    out = tmp_path / "serve.json"
    argv = ["--base-url", fake.url, "--num-prompts", str(num_prompts), "--input-len", "16",
            "--output-len", str(output_len), "--out", str(out), "--save-requests", *extra]
    assert serve.main(argv) == 0
    return json.loads(out.read_text())


# ---------------------------------------------------------------- SSE parser
EVENTS_BYTES = (
    b': a comment line\n'
    b'data: {"choices": [{"text": "h\xc3\xa9"}]}\n\n'          # LF, a 2-byte UTF-8 character
    b'event: message\r\ndata: {"a":\r\ndata: 1}\r\nid: 7\r\n\r\n'  # CRLF, 2 data lines, id
    b'data:no-space\rdata:  two spaces\r\r'                     # CR, two data lines, one event
    b'data: [DONE]\n\n'
)
EVENTS = ['{"choices": [{"text": "hé"}]}', '{"a":\n1}', 'no-space\n two spaces', '[DONE]']


def test_sse_parser_whole_stream():
    assert SSEParser().feed(EVENTS_BYTES) == EVENTS


def test_sse_parser_split_in_two_anywhere():
    for cut in range(1, len(EVENTS_BYTES)):  # inside lines, CRLF pairs, a UTF-8 character
        parser = SSEParser()
        got = (parser.feed(EVENTS_BYTES[:cut]) + parser.feed(b"")
               + parser.feed(EVENTS_BYTES[cut:]))
        assert got == EVENTS, cut


def test_sse_parser_one_byte_at_a_time_and_unfinished_event():
    parser = SSEParser()
    got = [e for i in range(len(EVENTS_BYTES)) for e in parser.feed(EVENTS_BYTES[i:i + 1])]
    assert got == EVENTS
    assert parser.feed(b"data: no blank line yet\n") == []  # not complete without a blank line
    assert parser.feed(b"\n") == ["no blank line yet"]


# ---------------------------------------------------------------- workload and metrics
def test_poisson_arrivals_have_the_requested_mean_rate():
    rate, n = 20.0, 40000
    offsets = serve.arrival_offsets(n, rate, np.random.default_rng(1))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and len(offsets) == n and (gaps >= 0).all()
    # mean gap 1/rate; exponential gaps: standard deviation = mean (coefficient of variation 1)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)
    # seeded: the same schedule again, another one for another rate index
    again = serve.arrival_offsets(n, rate, np.random.default_rng(1))
    assert again == offsets
    assert serve.arrival_offsets(5, math.inf, np.random.default_rng(1)) == [0.0] * 5


def test_request_rates_parsed_and_checked():
    assert serve.parse_request_rates("8,32,inf") == [8.0, 32.0, math.inf]
    for bad in ("0", "-1", "fast", "8,,inf"):
        with pytest.raises(ValueError, match="--request-rate"):
            serve.parse_request_rates(bad)


def test_random_requests_lengths_ids_prefix_and_seed():
    def make(rate_index=0):
        return serve.random_requests(500, 100, 20, 0.5, 8, 1000, 5000,
                                     serve.workload_rng(3, rate_index))

    specs = make()
    in_lens = [s.prompt_len - 8 for s in specs]
    out_lens = [s.output_len for s in specs]
    assert min(in_lens) >= 50 and max(in_lens) <= 150 and len(set(in_lens)) > 50
    assert min(out_lens) >= 10 and max(out_lens) <= 30
    assert all(1000 <= t < 5000 for s in specs for t in s.prompt)
    assert all(len(s.prompt) == s.prompt_len for s in specs)
    assert len({tuple(s.prompt[:8]) for s in specs}) == 1  # one shared prefix
    assert [s.prompt for s in make()] == [s.prompt for s in specs]
    assert make(1)[0].prompt != specs[0].prompt  # another rate of a sweep: other prompts
    fixed = serve.random_requests(4, 64, 8, 0.0, 0, 1000, 5000, np.random.default_rng(0))
    assert [(s.prompt_len, s.output_len) for s in fixed] == [(64, 8)] * 4


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"range_ratio": 1.0}, "--range-ratio"),
    ({"min_token_id": 5000}, "--min-token-id"),
    ({"input_len": 0}, "--input-len"),
    ({"prefix_len": -1}, "--prefix-len"),
])
def test_random_requests_rejects_bad_settings(kwargs, match):
    args = {"num_prompts": 2, "input_len": 8, "output_len": 4, "range_ratio": 0.0,
            "prefix_len": 0, "min_token_id": 1000, "vocab_size": 5000, **kwargs}
    with pytest.raises(ValueError, match=match):
        serve.random_requests(**args, rng=np.random.default_rng(0))


def test_latency_stats_match_numpy():
    values = np.random.default_rng(0).lognormal(-3, 1, size=1001)
    stats = latency_stats(values.tolist())
    assert set(stats) == STATS_KEYS
    assert stats["mean"] == pytest.approx(1e3 * values.mean())
    for key, q in (("median", 50), ("p90", 90), ("p99", 99)):
        assert stats[key] == pytest.approx(1e3 * np.percentile(values, q))
    assert latency_stats([0.25])["p99"] == pytest.approx(250.0)
    assert latency_stats([]) == dict.fromkeys(STATS_KEYS)


def test_goodput_slos_parsed_and_applied():
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:2000.5"]) == {
        "ttft": 500.0, "tpot": 50.0, "e2el": 2000.5}
    for bad, match in (("ttft", "METRIC:MS"), ("itl:5", "unknown metric"),
                       ("ttft:soon", "not a number"), ("tpot:0", "> 0")):
        with pytest.raises(ValueError, match=match):
            parse_goodput([bad])
    rec = RequestRecord(0, 10, 11, success=True, ttft_s=0.2, e2el_s=0.7, output_tokens=11)
    assert tpot_s(rec) == pytest.approx(0.05)
    assert meets_slo(rec, {"ttft": 200.1, "tpot": 50.1})
    assert not meets_slo(rec, {"ttft": 199.9})
    assert not meets_slo(rec, {"tpot": 49.9})
    one = RequestRecord(0, 10, 1, success=True, ttft_s=0.1, e2el_s=0.1, output_tokens=1)
    assert tpot_s(one) is None and meets_slo(one, {"tpot": 1.0})  # no TPOT to hold
    whole = RequestRecord(0, 10, 5, success=True, e2el_s=0.1, output_tokens=5)
    assert not meets_slo(whole, {"ttft": 1e6})  # not streamed: no TTFT, cannot show it


def test_concurrency_split_between_processes():
    assert split_concurrency(None, 3) == [None] * 3
    assert split_concurrency(7, 3) == [3, 2, 2]
    with pytest.raises(ValueError, match="--max-concurrency 1"):
        split_concurrency(1, 2)


# ---------------------------------------------------------------- against the fake server
def test_streamed_run_counts_and_latency_bounds(tmp_path):
    behaviour = Behaviour(first_token_delay_s=0.05, token_delay_s=0.01)
    with FakeServer(behaviour) as fake:
        doc = run_bench(fake, tmp_path, "--request-rate", "40", num_prompts=12, output_len=6)
    (s,) = doc["results"]
    assert set(s) == SUMMARY_KEYS | {"requests"}
    assert (s["completed"], s["failed"], s["num_requests"]) == (12, 0, 12)
    assert s["total_output_tokens"] == 12 * 6 and s["total_input_tokens"] == 12 * 16
    assert s["output_tokens_counted_from_chunks"] == 0 and s["short_outputs"] == 0
    # the client's own CPU time: spent (parsing 72 chunks), below its wall time (it mostly waits)
    assert 0.0 < s["client_cpu_s"] < s["duration_s"]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(s[key]) == STATS_KEYS
    for r in s["requests"]:
        assert r["success"] and r["output_tokens"] == 6 and r["output_tokens_from"] == "usage"
        # (uvloop's timers count from the loop's cached clock, so the fake server's sleeps can
        # end up to a millisecond or so early: TIMER_SLACK_S each)
        assert r["ttft_s"] >= 0.05 - TIMER_SLACK_S
        assert r["e2el_s"] >= 0.05 + 5 * 0.01 - 6 * TIMER_SLACK_S
        assert len(r["itl_s"]) == 5  # one gap per output chunk after the first
        assert r["e2el_s"] <= r["end_s"] - r["start_s"] + 1e-9
    assert s["ttft_ms"]["median"] >= 50.0 - 1e3 * TIMER_SLACK_S and s["ttft_ms"]["p99"] < 10_000
    assert 5.0 <= s["tpot_ms"]["median"] < 1000
    assert s["duration_s"] >= max(r["end_s"] for r in s["requests"]) - 1e-9
    assert s["request_throughput"] == pytest.approx(12 / s["duration_s"])
    assert s["output_throughput"] == pytest.approx(72 / s["duration_s"])
    assert s["total_token_throughput"] == pytest.approx((72 + 192) / s["duration_s"])
    assert s["request_rate"] == "40" and s["goodput_slo_ms"] == {"ttft": 500.0, "tpot": 50.0}
    assert set(doc["config"]) == CONFIG_KEYS
    assert doc["config"]["model"] == MODEL and doc["config"]["base_url"] == fake.url
    assert doc["config"]["command"].startswith("pagedrt bench serve --base-url")
    # every request (the probe first) was greedy, exact length, streamed with usage
    probe, *bodies = fake.seen.bodies
    assert probe["max_tokens"] == 1 and len(bodies) == 12
    for body in bodies:
        assert body["model"] == MODEL and body["max_tokens"] == 6 and body["ignore_eos"]
        assert body["temperature"] == 0 and body["stream"]
        assert body["stream_options"] == {"include_usage": True}
        assert len(body["prompt"]) == 16 and all(1000 <= t < 32000 for t in body["prompt"])


def test_goodput_counts_exactly_the_requests_within_slo(tmp_path):
    slow = set(first_ids(12)[::3])  # 4 of 12 requests wait 0.6 s for their first token
    behaviour = Behaviour(first_token_delay_s=0.005, slow_ids=slow, slow_delay_s=0.6)
    with FakeServer(behaviour) as fake:
        doc = run_bench(fake, tmp_path, "--goodput", "ttft:300", "tpot:1000")
    (s,) = doc["results"]
    assert s["completed"] == 12 and s["good_requests"] == 8
    assert s["goodput"] == pytest.approx(8 / s["duration_s"])
    good = {r["index"] for r in s["requests"] if r["ttft_s"] <= 0.3}
    assert good == {i for i, t in enumerate(first_ids(12)) if t not in slow}


def test_failures_are_counted_and_do_not_stop_the_run(tmp_path):
    ids = first_ids(12)
    behaviour = Behaviour(fail_ids={ids[1], ids[5]}, error_event_ids={ids[7]},
                          truncate_ids={ids[10]})
    with FakeServer(behaviour) as fake:
        doc = run_bench(fake, tmp_path, "--request-rate", "inf")
    (s,) = doc["results"]
    assert (s["completed"], s["failed"]) == (8, 4)
    assert s["total_output_tokens"] == 8 * 6
    assert s["errors"] == {"HTTP 500: injected failure": 2,
                           "error event: injected error event": 1,
                           "stream closed before data: [DONE]": 1}
    assert {r["index"] for r in s["requests"] if not r["success"]} == {1, 5, 7, 10}


def test_request_timeout_fails_the_request_and_the_run_ends(tmp_path):
    ids = first_ids(6)
    with FakeServer(Behaviour(hang_ids={ids[2]}, hang_s=5.0)) as fake:
        doc = run_bench(fake, tmp_path, "--request-timeout", "0.5", num_prompts=6)
    (s,) = doc["results"]
    assert (s["completed"], s["failed"]) == (5, 1)
    (error,) = s["errors"]
    assert error.startswith("timed out after 0.5 s")


def test_not_streamed_and_token_count_fallback(tmp_path):
    with FakeServer() as fake:
        whole = run_bench(fake, tmp_path, "--no-stream", num_prompts=4)["results"][0]
    assert whole["completed"] == 4 and whole["total_output_tokens"] == 24
    assert whole["ttft_ms"]["mean"] is None and whole["itl_ms"]["mean"] is None
    assert whole["e2el_ms"]["median"] >= 20.0 + 5 * 5.0
    assert whole["goodput"] is None and whole["good_requests"] is None  # TTFT SLO, no TTFT
    assert not fake.seen.bodies[-1]["stream"] and "stream_options" not in fake.seen.bodies[-1]
    with FakeServer() as fake:
        e2el = run_bench(fake, tmp_path, "--no-stream", "--goodput", "e2el:60000",
                         num_prompts=4)["results"][0]
    assert e2el["good_requests"] == 4
    with FakeServer(Behaviour(send_usage=False)) as fake:
        counted = run_bench(fake, tmp_path, num_prompts=4)["results"][0]
    assert counted["total_output_tokens"] == 24
    assert counted["output_tokens_counted_from_chunks"] == 4


def test_max_concurrency_caps_requests_in_flight(tmp_path):
    with FakeServer() as fake:
        s = run_bench(fake, tmp_path, "--max-concurrency", "3", num_prompts=12)["results"][0]
        assert fake.seen.max_in_flight <= 3
    assert s["completed"] == 12 and s["peak_concurrent_requests"] <= 3
    assert s["max_concurrency"] == 3


def test_two_client_processes_complete_the_same_requests(tmp_path):
    with FakeServer() as fake:
        one = run_bench(fake, tmp_path, "--num-client-processes", "1", num_prompts=16)
        two = run_bench(fake, tmp_path, "--num-client-processes", "2", "--max-concurrency", "4",
                        num_prompts=16)
        assert fake.seen.max_in_flight >= 1
    a, b = one["results"][0], two["results"][0]
    assert a["completed"] == b["completed"] == 16
    assert a["total_output_tokens"] == b["total_output_tokens"] == 96
    assert sorted(r["index"] for r in b["requests"]) == list(range(16))
    assert b["peak_concurrent_requests"] <= 4
    assert two["config"]["num_client_processes"] == 2


def test_sweep_plot_and_cli_entry(tmp_path, capsys):
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    with FakeServer() as fake:
        rc = cli.main(["bench", "serve", "--base-url", fake.url, "--num-prompts", "6",
                       "--input-len", "16", "--output-len", "4", "--request-rate", "50,inf",
                       "--out", str(out), "--plot", str(plot)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [s["request_rate"] for s in doc["results"]] == ["50", "inf"]
    assert all("requests" not in s for s in doc["results"])  # only with --save-requests
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "request rate 50 req/s" in printed and "request rate inf req/s" in printed


def test_model_card_vocab_and_length_checks(tmp_path, capsys):
    card = {"max_model_len": 64, "vocab_size": 1500}
    with FakeServer(Behaviour(card=card)) as fake:
        doc = run_bench(fake, tmp_path, num_prompts=4)
        assert all(1000 <= t < 1500 for b in fake.seen.bodies for t in b["prompt"])
        assert doc["config"]["vocab_size"] == 1500
        rc = cli.main(["bench", "serve", "--base-url", fake.url, "--input-len", "60",
                       "--output-len", "8"])
    assert rc == 2 and "max_model_len 64" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "match"), [
    (["--endpoint", "/v1/chat/completions", "--model", "m"], "--tokenizer"),
    (["--goodput", "ttft"], "METRIC:MS"),
    (["--request-rate", "0"], "--request-rate"),
    (["--base-url", "http://127.0.0.1:9"], "could not read the served model"),
    (["--num-client-processes", "0"], "--num-client-processes 0"),
    (["--num-client-processes", "4", "--max-concurrency", "2"], "--max-concurrency 2"),
    (["--num-prompts", "0"], "--num-prompts 0"),
    (["--min-token-id", "40000"], "--min-token-id 40000"),
])
def test_bad_settings_are_clear_errors(argv, match, capsys):
    with FakeServer() as fake:
        assert cli.main(["bench", "serve", "--base-url", fake.url, *argv]) == 2
        assert fake.seen.bodies == []  # refused before any request
    assert match in capsys.readouterr().err


def test_probe_failure_stops_before_the_run(capsys):
    with FakeServer() as fake:
        assert cli.main(["bench", "serve", "--base-url", fake.url, "--model", "other"]) == 2
        assert len(fake.seen.bodies) == 1
    assert "probe request" in capsys.readouterr().err


def test_chat_stream_skips_the_role_chunk():
    with FakeServer(Behaviour(first_token_delay_s=0.03)) as fake:
        cfg = ClientConfig(url=fake.url + "/v1/chat/completions", model=MODEL, chat=True)
        specs = [RequestSpec(i, "hello there", 2, 5) for i in range(3)]
        records = asyncio.run(run_schedule(specs, [0.0] * 3, cfg, None))
        assert fake.seen.bodies[0]["max_completion_tokens"] == 5
        assert fake.seen.bodies[0]["messages"] == [{"role": "user", "content": "hello there"}]
    for r in records:
        assert r.success and r.output_tokens == 5 and r.prompt_len == 7  # the server's count
        assert r.ttft_s >= 0.03 - TIMER_SLACK_S and len(r.itl_s) == 4
