"""Faults of the served process layout, each on its own `pagedrt serve` (SmolLM2 on CPU): the
engine core killed while clients stream, SIGTERM with streams in flight, and a client that stops
reading. Every wait is bounded; no test times anything beyond "within the bound"."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest
from server_process import api_pids, engine_core_pid, start_server, stop_server

ARGS = ["--num-kv-blocks", "256", "--max-model-len", "2048", "--api-server-count", "1"]


@pytest.fixture
def fresh_server(smollm2_path, tmp_path):
    log_path = tmp_path / "server.log"
    proc, url = start_server(ARGS, log_path)
    try:
        yield proc, url, log_path
    finally:
        stop_server(proc)


class _Stream(threading.Thread):
    """One streamed completion read line by line; records every `data:` payload."""

    def __init__(self, url: str, max_tokens: int = 1500, n: int = 1) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens, self.n = url, max_tokens, n
        self.payloads: list[str] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self.started = threading.Event()

    def run(self) -> None:
        body = {"prompt": "Tell me a long story about the sea.", "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True, "n": self.n}
        try:
            with (httpx.Client(timeout=httpx.Timeout(30.0)) as http,
                  http.stream("POST", f"{self.url}/v1/completions", json=body) as resp):
                self.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        self.payloads.append(line[len("data: "):])
                        if len(self.payloads) >= 3:
                            self.started.set()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            self.error = e
        finally:
            self.started.set()

    @property
    def ended_with_done(self) -> bool:
        return bool(self.payloads) and self.payloads[-1] == "[DONE]"

    def error_events(self) -> list[dict]:
        return [json.loads(p)["error"] for p in self.payloads
                if p != "[DONE]" and "error" in json.loads(p)]


def _start_streams(url: str, count: int) -> list[_Stream]:
    streams = [_Stream(url) for _ in range(count)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.started.wait(120), "no tokens within 120 s"
        assert s.error is None and s.status == 200, (s.error, s.status, s.payloads)
    return streams


def test_killed_engine_core_fails_every_stream_and_health_turns_503(fresh_server):
    proc, url, log_path = fresh_server
    streams = _start_streams(url, 3)
    os.kill(engine_core_pid(log_path), signal.SIGKILL)
    for s in streams:
        s.join(15)
        assert not s.is_alive(), "a client hangs after the engine core died"
    # the API process keeps answering 503 for a moment before it exits
    assert httpx.get(f"{url}/health", timeout=5).status_code == 503
    for s in streams:
        assert s.error is None and s.ended_with_done, (s.error, s.payloads[-3:])
        errors = s.error_events()
        assert len(errors) == 1 and errors[0]["type"] == "server_error", s.payloads[-3:]
        assert "engine core" in errors[0]["message"]
    assert proc.wait(timeout=15) == 1  # exits non-zero: a supervisor restarts it


def test_sigterm_with_streams_in_flight_ends_every_stream_and_exits(fresh_server):
    proc, url, _ = fresh_server
    streams = _start_streams(url, 3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 10
    for s in streams:
        s.join(5)
        assert not s.is_alive()
        # an end ([DONE] after a finish, or after an error event), never a cut-off stream
        assert s.ended_with_done, (s.error, s.payloads[-3:])
        finished = any(c["choices"] and c["choices"][0].get("finish_reason")
                       for p in s.payloads[:-1] if "choices" in (c := json.loads(p)))
        assert finished or s.error_events(), s.payloads[-3:]


def test_sigterm_to_the_whole_group_is_a_stop_not_a_crash(fresh_server):
    """A supervisor's stop (systemd, `timeout`, `kill -- -PGID`) sends SIGTERM to every process
    at once, the engine core among them: the API process must not log the core's end as a
    crash. The core says it is stopping before it exits (engine_core._stopping_notice)."""
    proc, url, log_path = fresh_server
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    core = engine_core_pid(log_path)
    for pid in (core, *api_pids(log_path), proc.pid):  # the core first: its end arrives first
        os.kill(pid, signal.SIGTERM)
    proc.wait(timeout=15)
    log = log_path.read_text()
    assert "engine core process died" not in log and " ERROR " not in log, log[-2000:]


def test_client_that_stops_reading_does_not_hold_back_another(fresh_server):
    _, url, _ = fresh_server
    # a client with a tiny receive window that sends its request and never reads: 4 prompts
    # x n = 2 samples with 5 logprobs per token (about 0.5 KB of events per token; 40 tokens
    # each are ~160 KB) fill its socket buffers, then the server's writes to it wait while its
    # tokens pile up (coalesced) in the API process
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = url.removeprefix("http://").split(":")
    stalled.connect((host, int(port)))
    body = json.dumps({"prompt": ["Count to a million.", "List every prime.", "Name all stars.",
                                  "Write an endless poem."],
                       "max_tokens": 400, "n": 2, "logprobs": 5, "ignore_eos": True,
                       "stream": True}).encode()
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                    b"application/json\r\nContent-Length: " + str(len(body)).encode()
                    + b"\r\n\r\n" + body)
    try:
        before = _generated(url)
        deadline = time.monotonic() + 180
        while _generated(url) - before < 8 * 40:  # the stalled request is well under way
            assert time.monotonic() < deadline, "the stalled request does not advance"
            time.sleep(0.2)
        # another client streams to the end meanwhile
        other = _Stream(url, max_tokens=20)
        other.start()
        other.join(120)
        assert not other.is_alive() and other.error is None and other.ended_with_done
        chunks = [json.loads(p) for p in other.payloads[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        # and the engine went on generating for the stalled one without its client reading
        assert _generated(url) - before > 8 * 40 + 20
    finally:
        stalled.close()


def _generated(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("pagedrt_generation_tokens_total "):
            return float(line.split()[1])
    raise AssertionError("no pagedrt_generation_tokens_total")
