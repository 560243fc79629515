"""The launcher's wait for its API processes (launcher._wait_apis_ready), with stand-ins for
the processes: "serving" is printed only once every API process has said it accepts."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

from pagedrt.entrypoints import launcher


class _Proc:
    """What the wait reads of a process: name, is_alive(), join(), exitcode."""

    def __init__(self, name: str, alive: bool = True, exitcode: int | None = None) -> None:
        self.name, self._alive, self.exitcode = name, alive, exitcode

    def is_alive(self) -> bool:
        return self._alive

    def join(self, timeout: float | None = None) -> None:
        pass


def _later(delay_s: float, fn) -> None:
    threading.Timer(delay_s, fn).start()


def test_waits_for_every_api_process():
    pipes = [mp.Pipe(duplex=False) for _ in range(3)]
    sent_at: dict[int, float] = {}

    def speak(i: int, w) -> None:
        sent_at[i] = time.monotonic()  # taken before the word, so the wait cannot end earlier
        w.send(i)
        w.close()

    for i, (_, w) in enumerate(pipes):
        _later(0.1 * (i + 1), lambda w=w, i=i: speak(i, w))
    ok = launcher._wait_apis_ready([r for r, _ in pipes], [_Proc(f"api-{i}") for i in range(3)],
                                   _Proc("core"), {"signal": None}, timeout_s=10)
    returned_at = time.monotonic()
    assert ok and len(sent_at) == 3
    assert returned_at >= max(sent_at.values())  # not before the last one spoke


def test_an_api_process_that_exits_before_ready_fails_the_start(capsys):
    (r0, w0), (r1, w1) = mp.Pipe(duplex=False), mp.Pipe(duplex=False)
    w0.send(0)
    _later(0.1, w1.close)  # its end closes without a word: the process is gone
    ok = launcher._wait_apis_ready([r0, r1], [_Proc("api-0"), _Proc("api-1", False, 1)],
                                   _Proc("core"), {"signal": None}, timeout_s=10)
    assert not ok
    assert "API process api-1 exited with status 1 before it was ready" in capsys.readouterr().out


def test_a_dead_core_or_a_timeout_ends_the_wait(capsys):
    r, w = mp.Pipe(duplex=False)
    assert not launcher._wait_apis_ready([r], [_Proc("api-0")], _Proc("core", False, -9),
                                         {"signal": None}, timeout_s=10)
    assert "engine core exited with status -9" in capsys.readouterr().out
    start = time.monotonic()
    assert not launcher._wait_apis_ready([r], [_Proc("api-0")], _Proc("core"),
                                         {"signal": None}, timeout_s=0.5)
    assert time.monotonic() - start < 5
    assert "1 API process(es) not ready after 0 s" in capsys.readouterr().out
    w.close()


def test_bind_errors_name_the_option_to_change():
    """A port in use is --port's fault; an address of no interface here is --host's (a fresh
    user's `--host 999.1.1.1` was told to pick another --port)."""
    import pytest

    taken = launcher._bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        taken.listen(1)
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}: .*; pick "
                                             "another --port or stop the process using it"):
            launcher._bind("127.0.0.1", port)
    finally:
        taken.close()
    for host in ("999.1.1.1", "192.0.2.1"):  # not an address; TEST-NET-1, no interface
        with pytest.raises(ValueError, match=f"cannot listen on {host}:0: .*; give --host an "
                                             "address of this machine"):
            launcher._bind(host, 0)


def test_ready_lines_name_a_busy_cpu(monkeypatch):
    """`pagedrt serve` says once, after its "serving" line, that a CPU already busy when it
    started wants PAGEDRT_NUM_THREADS=1 (a fresh user's server answered a 30-token request in
    25.5 s on a shared 2-core CPU, 2.0 s with one thread, and said nothing); not on a GPU, not
    on an idle CPU, not where the user chose the threads."""
    from pagedrt.engine.validation import EngineLimits
    from pagedrt.entrypoints.engine_core import CoreInfo

    monkeypatch.delenv("PAGEDRT_NUM_THREADS", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    limits = EngineLimits(100, 64, 10, 16, 8)

    def lines(device: str, load: float | None, threads: int = 2) -> list[str]:
        info = CoreInfo(limits, "m.gguf", None, device, "float32", 1.5, pid=7,
                        cpu_threads=threads)
        return launcher.ready_lines("m", "http://127.0.0.1:8000", info, [8, 9], 3.25, load, 2)

    busy = lines("cpu", 2.4)
    assert len(busy) == 2
    assert busy[0] == (
        "pagedrt: serving 'm' on http://127.0.0.1:8000 (device cpu float32, 2 CPU threads "
        "(PAGEDRT_NUM_THREADS sets them), max_model_len 64, 10 KV blocks, 2 API process(es), "
        "engine core pid 7, API pids 8,9, ready in 3.2 s, of it the engine 1.5 s)")
    assert "load average 2.4 on 2 cores" in busy[1] and "PAGEDRT_NUM_THREADS=1" in busy[1]
    assert len(lines("cpu", 1.0)) == 1  # a core left
    assert len(lines("cpu", None)) == 1  # no load average on this platform
    assert len(lines("cuda:0", 30.0)) == 1
    assert len(lines("cpu", 2.4, threads=1)) == 1
    monkeypatch.setenv("PAGEDRT_NUM_THREADS", "2")
    assert len(lines("cpu", 2.4)) == 1  # the user chose
