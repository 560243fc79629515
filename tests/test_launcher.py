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
