"""Tensor parallelism over several machines, launched by torchrun (docs/design.md, README).

Every process runs the same command line, e.g. on two machines with one GPU each:

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr HOST0 \\
        --master-port 29500 --no-python pagedrt serve --tensor-parallel-size 2
    torchrun --nnodes 2 --node-rank 1 ... (the same, --node-rank 1)

Rank 0 runs the command (the engine, the server) and drives the others as the engine's rank-0
worker in its own process; ranks 1..N-1 (`run_worker`) are workers only. The `pagedrt` command
sends them there by itself; a Python script calls `run_worker_unless_rank0()` first.

How the command connections form: the process group forms from torchrun's variables
(init_method "env://": MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE); rank 0 listens on a free
TCP port and broadcasts the port and a random token over a gloo group; every other rank
connects to MASTER_ADDR on that port and sends its rank and the token. From then on a rank
receives its commands over that connection (pagedrt/distributed/worker.py), and the end of
file when rank 0's process goes away ends it. A rank that dies on another machine is seen by
rank 0 when its connection closes, also while rank 0's device waits in a step's collective
with it (`Executor._wait_device`); a machine gone silent when TCP keepalive gives up on its
connection (about two minutes; `_keep_alive`) or, while rank 0 is inside a collective with it,
when the collective times out (PAGEDRT_DIST_TIMEOUT_S).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import secrets
import socket
import struct
import sys
import time
from typing import NoReturn

import torch
import torch.distributed as dist

from pagedrt.distributed.group import TPGroup, init_tp_group, torchrun_env
from pagedrt.distributed.sharding import check_devices

logger = logging.getLogger("pagedrt.torchrun")

_HELLO = struct.Struct("!q32s")  # rank, token
_CONNECT_TIMEOUT_S = 120.0
# A command connection whose peer machine vanished (power, network; no FIN or RST ever comes)
# fails after about this long instead of never: TCP keepalive probes when it is idle, and a
# bound on unacknowledged sends (Linux's TCP_USER_TIMEOUT)
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_PROBES = 60, 10, 6

_rank0_peers: tuple | None = None  # rank 0: (TPGroup, [RemoteRank]), formed once per process


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """Each torchrun process uses the GPU of its local rank (or the CPU)."""
    return torch.device("cuda", local_rank) if device.type == "cuda" else torch.device("cpu")


def torchrun_executor(spec, run: tuple[int, int, int], device: torch.device, tokenizer,
                      model_path: str):
    """The executor of torchrun's rank 0: rank 0's worker in this process, the other torchrun
    ranks over their connections. Raises ValueError on a rank other than 0, or when
    tensor_parallel_size is not WORLD_SIZE."""
    from pagedrt.distributed.executor import Executor
    from pagedrt.distributed.worker import Worker

    rank, world_size, local_rank = run
    tp_size = spec.engine_config.tensor_parallel_size
    if rank != 0:
        raise ValueError(
            f"torchrun rank {rank} built an engine: only rank 0 does; the other ranks must "
            "call pagedrt.distributed.torchrun.run_worker_unless_rank0() (the pagedrt command "
            "does this by itself)")
    if tp_size != world_size:
        raise ValueError(
            f"torchrun started {world_size} processes (WORLD_SIZE) but tensor_parallel_size="
            f"{tp_size}; pass --tensor-parallel-size {world_size}")
    device = rank_device(device, local_rank)
    tp, remotes = _connect_rank0(device, world_size)
    return Executor(Worker(spec, tp, device), remotes, tokenizer, model_path,
                    release_on_shutdown=True)


def _check_local_devices(device: torch.device) -> None:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    check_devices(local, device.type, 0,
                  torch.cuda.device_count() if device.type == "cuda" else 0)


def _control_group(device: torch.device):
    """A gloo group of all ranks for the start-up broadcast (the default one is NCCL on CUDA);
    every rank creates it in the same order."""
    return dist.group.WORLD if device.type != "cuda" else dist.new_group(backend="gloo")


def _connect_rank0(device: torch.device, world_size: int) -> tuple[TPGroup, list]:
    """Rank 0: the process group and a connection to every other rank (once per process)."""
    global _rank0_peers
    from multiprocessing.connection import Connection

    from pagedrt.distributed.executor import RemoteRank

    if _rank0_peers is not None:
        tp, remotes = _rank0_peers
        if any(r.conn.closed for r in remotes):
            raise ValueError("the other torchrun ranks were stopped after a fault; start the "
                             "torchrun job again")
        return tp, remotes
    _check_local_devices(device)
    tp = init_tp_group(0, world_size, device, "env://")
    listener = socket.create_server(("", 0))
    port, token = listener.getsockname()[1], secrets.token_bytes(32)
    dist.broadcast_object_list([port, token], src=0, group=_control_group(device))
    try:
        socks = accept_ranks(listener, token, world_size, _CONNECT_TIMEOUT_S)
    finally:
        listener.close()
    remotes = [RemoteRank(rank, Connection(sock.detach())) for rank, sock in sorted(socks.items())]
    _rank0_peers = (tp, remotes)
    atexit.register(_close_peers)
    return tp, remotes


def accept_ranks(listener: socket.socket, token: bytes, world_size: int,
                 timeout_s: float) -> dict[int, socket.socket]:
    """Rank 0: accept the connections of ranks 1..world_size-1 on `listener`, each proving
    itself by its rank and `token` (`_HELLO`) within `timeout_s` in all; returns rank ->
    socket (blocking, keepalive on). A connection that is not a rank's (a wrong token, a rank
    out of range or twice, nothing sent within the time left or 10 s, or closed early) is
    closed and logged, and the others still count.

    Raises:
        ValueError: not every rank connected within `timeout_s`; names those missing.
    """
    deadline = time.monotonic() + timeout_s
    socks: dict[int, socket.socket] = {}
    while len(socks) < world_size - 1:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        listener.settimeout(remaining)
        try:
            sock, addr = listener.accept()
        except TimeoutError:
            break
        sock.settimeout(min(remaining, 10.0))
        try:
            rank, their_token = _HELLO.unpack(_recv_exact(sock, _HELLO.size))
        except OSError as e:  # (a time-out, or ConnectionError from _recv_exact)
            logger.warning("rank 0's command port: a connection from %s sent no hello (%s)",
                           addr, e)
            sock.close()
            continue
        if not secrets.compare_digest(their_token, token) or not 0 < rank < world_size \
                or rank in socks:
            logger.warning("rank 0's command port: a connection from %s is not a rank's (a "
                           "wrong token, or rank %d out of range or seen before)", addr, rank)
            sock.close()
            continue
        sock.settimeout(None)
        _keep_alive(sock)
        socks[rank] = sock
    if len(socks) < world_size - 1:
        for sock in socks.values():
            sock.close()
        missing = sorted(set(range(1, world_size)) - set(socks))
        raise ValueError(
            f"torchrun ranks {missing} did not connect to rank 0 (port "
            f"{listener.getsockname()[1]}) within {timeout_s:.0f} s")
    return socks


def _close_peers() -> None:
    """At exit: the other ranks see end of file and exit; the process group goes (left to the
    interpreter's teardown, gloo's threads abort the process)."""
    if _rank0_peers is not None:
        for r in _rank0_peers[1]:
            r.conn.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_if_rank0(status: int) -> int:
    """For a command's end on rank 0 of a torchrun job whose engine has formed its peers:
    close the peers and the process group (`_close_peers`), then flush stdout and stderr and
    end the process with `status` at once, skipping the interpreter's teardown, as the engine's
    worker processes do (`pagedrt.distributed.worker`). Left to the teardown, rank 0 sometimes
    aborted ("terminate called without an active exception", exit -6) after its output was
    complete, in two full test runs on a loaded 2-core machine
    (tests/test_tensor_parallel.py's two torchrun nodes), even with the group destroyed at
    exit. Elsewhere (no peers formed: not torchrun, or another rank) returns `status`."""
    if _rank0_peers is None:
        return status
    _close_peers()
    exit_without_teardown(status)


def exit_without_teardown(status: int) -> NoReturn:
    """Flush stdout and stderr and end the process with `status` at once: no atexit hooks,
    no interpreter teardown (which gloo's threads can abort or hang)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


def _keep_alive(sock: socket.socket) -> None:
    """Make a command connection fail within about two minutes of its peer machine going
    silent (`_KEEPALIVE_*`), where the platform offers the options (Linux does)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
                        ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", _KEEPALIVE_PROBES),
                        ("TCP_USER_TIMEOUT", 1000 * (_KEEPALIVE_IDLE_S + _KEEPALIVE_INTERVAL_S
                                                     * _KEEPALIVE_PROBES))):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection during the handshake")
        data += chunk
    return data


def run_worker(device: str = "auto") -> int:
    """A torchrun rank other than 0: join the process group, connect to rank 0, run its
    commands until it goes away; returns the exit status (0, or 1 after an error).

    device: as the engine's ("auto", "cuda", "cpu"); it must be of the type rank 0 uses.
    """
    from multiprocessing.connection import Connection

    from pagedrt.distributed.worker import serve
    from pagedrt.engine.llm_engine import resolve_device

    run = torchrun_env()
    assert run is not None and run[0] > 0, f"not a torchrun rank > 0: {run}"
    rank, world_size, local_rank = run
    dev = rank_device(resolve_device(device), local_rank)
    _check_local_devices(dev)
    tp = init_tp_group(rank, world_size, dev, "env://")
    received = [None, None]
    dist.broadcast_object_list(received, src=0, group=_control_group(dev))
    port, token = received
    sock = socket.create_connection((os.environ["MASTER_ADDR"], port),
                                    timeout=_CONNECT_TIMEOUT_S)
    sock.sendall(_HELLO.pack(rank, token))
    sock.settimeout(None)
    _keep_alive(sock)
    try:
        return serve(Connection(sock.detach()), tp, dev)
    finally:
        dist.destroy_process_group()


def run_worker_unless_rank0(device: str = "auto") -> bool:
    """For a script started by torchrun: on ranks > 0, serve rank 0's engine until rank 0's
    process ends and return True (the script should then exit); on rank 0, or outside
    torchrun, return False at once."""
    run = torchrun_env()
    if run is None or run[0] == 0:
        return False
    status = run_worker(device)
    if status:
        raise SystemExit(status)
    return True


def device_option(argv: list[str]) -> str:
    """The value of --device on a pagedrt command line ("auto" without one)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--device", default="auto")
    return p.parse_known_args(argv)[0].device
