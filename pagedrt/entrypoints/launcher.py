"""`pagedrt serve`: start the engine-core process and the API process(es), watch them, stop them.

    launcher (this process, the one `pagedrt serve` started)
      |-- engine-core process    LLMEngine busy loop (engine_core.py)
      |-- API process 0..N-1     FastAPI + uvicorn on one shared listening socket
                                 (openai_server.py, core_client.py)

Start-up: the core loads the model and warms up, then reports `CoreInfo`; only then does the
launcher open the port (so clients are refused, not kept waiting, while the model loads) and
start the API processes, which all accept on that one socket (the kernel spreads connections).
The launcher prints its "serving ..." line once every API process has said it accepts (a few
seconds of imports and tokenizer loading each, which must not land in a client's first request).

Stop: SIGTERM or SIGINT to the launcher is passed to the API processes, which drain for
`--shutdown-timeout` seconds (see openai_server.py) and each tell the core they are leaving, so
that it serves the others' drains to their end; once they are gone the launcher closes its own
pipe and the core exits; anything still alive `_STOP_MARGIN_S` after the drain is killed (9 s in all
by default). If the core dies, the API processes fail their
requests, answer 503 for a moment and exit with 1; the launcher then exits with 1 too (a
supervisor such as systemd or Kubernetes restarts it: reloading a model in place would serve
503s just as long and could not recover a device left in an error state). If an API process
dies, the others are stopped and the launcher exits with 1.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from pagedrt.entrypoints.cpu_threads import busy_cpu_hint, cpu_threads_note, load_average
from pagedrt.entrypoints.engine_core import CoreInfo, CoreSpec, profiled, run_engine_core
from pagedrt.entrypoints.guards import HttpOptions, default_allowed_hosts

logger = logging.getLogger("pagedrt.launcher")

# Seconds from the end of the drain (--shutdown-timeout) until every process is gone.
_STOP_MARGIN_S = 5.0
# Seconds an API process may take from its start to accepting connections (imports, tokenizer).
API_START_TIMEOUT_S = 120.0


@dataclass
class ApiSpec:
    """What an API process needs besides the core's CoreInfo (pickled to it)."""

    index: int
    input_address: str
    output_address: str
    served_model_name: str
    http: HttpOptions
    verbose: bool


def http_options(args) -> HttpOptions:
    """HttpOptions from `pagedrt serve`'s options; raises ValueError for bad values."""
    def names(value: str | None) -> tuple[str, ...]:
        return tuple(x.strip() for x in (value or "").split(",") if x.strip())

    hosts = names(args.allowed_hosts) or default_allowed_hosts(args.host)
    return HttpOptions(allowed_hosts=hosts, allowed_origins=names(args.allowed_origins),
                       api_key=args.api_key, max_request_bytes=args.max_request_bytes,
                       read_timeout_s=args.read_timeout,
                       shutdown_timeout_s=args.shutdown_timeout,
                       max_prompts_per_request=args.max_prompts_per_request,
                       trust_request_chat_template=bool(
                           getattr(args, "trust_request_chat_template", False)))


def run_server(args) -> int:
    """Serve until stopped; returns the exit status (0 after SIGTERM/SIGINT, 1 after a crash,
    2 if the port cannot be bound or the engine refuses its settings, such as a model path that
    is not a model)."""
    started = time.monotonic()
    load_before = load_average()  # (other processes' load: before the core loads the model)
    from pagedrt.config import EngineConfig
    from pagedrt.entrypoints.engine_args import engine_kwargs
    from pagedrt.entrypoints.openai_server import default_model_name

    num_api = args.api_server_count
    if num_api is None:
        num_api = default_api_server_count()
    if num_api < 1:
        raise ValueError(f"--api-server-count={num_api} must be >= 1")
    config = EngineConfig(**engine_kwargs(args))
    http = http_options(args)
    listener = _bind(args.host, args.port)  # fail now, before minutes of model loading
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="pagedrt-")
    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    core = None
    apis: list = []
    try:
        input_address = f"ipc://{tmp}/core-in"
        output_addresses = [f"ipc://{tmp}/api-{i}-out" for i in range(num_api)]
        pipes = [ctx.Pipe() for _ in range(num_api + 1)]  # [0]: the launcher's own
        spec = CoreSpec(args.model, args.dtype, args.device, config, input_address,
                        output_addresses, warm_up=not args.no_warm_up,
                        verbose=bool(getattr(args, "verbose", False)))
        core = ctx.Process(target=run_engine_core, args=(spec, [p[1] for p in pipes]),
                           name="pagedrt-engine-core")
        core.start()
        for _, core_end in pipes:
            core_end.close()
        conn = pipes[0][0]
        info = _wait_ready(conn, core, stop)
        if info is None:
            return 0 if stop["signal"] is not None else 1
        name = args.served_model_name or default_model_name(args.model or info.model_path)
        listener.listen(2048)
        ready_conns = []
        for i in range(num_api):
            api = ApiSpec(i, input_address, output_addresses[i], name, http,
                          bool(getattr(args, "verbose", False)))
            ready_r, ready_w = ctx.Pipe(duplex=False)
            process = ctx.Process(target=run_api_process,
                                  args=(api, info, listener, pipes[i + 1][0], ready_w),
                                  name=f"pagedrt-api-{i}")
            process.start()
            pipes[i + 1][0].close()
            ready_w.close()
            ready_conns.append(ready_r)
            apis.append(process)
        listener.close()
        # "serving" only once every API process accepts: a client sent right after the line
        # must not meet processes still importing (their start-up would count in its timing)
        if not _wait_apis_ready(ready_conns, apis, core, stop):
            return 0 if stop["signal"] is not None else 1
        for line in ready_lines(name, f"http://{args.host}:{args.port}", info,
                                [p.pid for p in apis], time.monotonic() - started,
                                load_before, os.cpu_count()):
            print(line, flush=True)
        return _supervise(core, apis, conn, stop,
                          http.shutdown_timeout_s + _STOP_MARGIN_S)
    finally:
        for s, handler in old_handlers.items():
            signal.signal(s, handler)
        _stop_all(core, apis)
        listener.close()
        shutil.rmtree(tmp, ignore_errors=True)


def ready_lines(name: str, url: str, info: CoreInfo, api_pids: list[int], ready_s: float,
                load_before: float | None, cores: int | None) -> list[str]:
    """What `pagedrt serve` prints once every process is ready: the "serving" line (the
    model's name, URL, device and dtype with the core's CPU threads, the limits, the pids, the
    start-up time) and, on a CPU that was already busy when the command started
    (`load_before`, the 1-minute load average then, against `cores`), `busy_cpu_hint`'s line:
    said once, at the start, since a server's requests would crawl all its life (a fresh
    user's 30-token request took 25.5 s on a shared 2-core CPU, 2.0 s with one thread)."""
    limits = info.limits
    serving = (f"pagedrt: serving {name!r} on {url} (device {info.device} {info.dtype}"
               f"{cpu_threads_note(info.device, info.cpu_threads)}, max_model_len "
               f"{limits.max_model_len}, {limits.num_blocks} KV blocks, {len(api_pids)} API "
               f"process(es), engine core pid {info.pid}, API pids "
               f"{','.join(str(pid) for pid in api_pids)}, ready in {ready_s:.1f} s, of it "
               f"the engine {info.warm_up_s:.1f} s)")
    lines = [serving]
    busy = busy_cpu_hint(info.device, info.cpu_threads, load_before, cores)
    if busy:
        lines.append(busy)
    return lines


def default_api_server_count() -> int:
    """(cores - 2) / 2 API processes, between 1 and 8: the engine core and, on a benchmark
    host, the clients need cores too (7 on the 16-core H200 host of BENCHMARKS.md's serving
    figures); a 2-core machine gets 1."""
    return max(1, min(8, ((os.cpu_count() or 1) - 2) // 2))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            fix = "pick another --port or stop the process using it"
        else:  # an unknown name or an address of no interface here (socket.gaierror too)
            fix = "give --host an address of this machine (127.0.0.1, or 0.0.0.0 for all)"
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}; {fix}") from None
    sock.set_inheritable(True)
    return sock


def _wait_ready(conn: Connection, core, stop: dict) -> CoreInfo | None:
    """The core's CoreInfo once it is ready; None if it died or a signal came first.

    Raises:
        ValueError: the core refused its settings (its ValueError's message), which the CLI
            prints as its other bad-input errors, exit status 2.
    """
    while stop["signal"] is None:
        if conn.poll(0.2):
            try:
                kind, payload = conn.recv()
            except EOFError:
                break
            if kind == "ready":
                return payload
            if kind == "invalid":
                raise ValueError(payload)
            print(f"pagedrt: {payload}", flush=True)
            return None
        if not core.is_alive():
            break
    if stop["signal"] is None:
        print(f"pagedrt: the engine core exited with status {core.exitcode} before it was "
              "ready", flush=True)
    return None


def _wait_apis_ready(ready_conns: list[Connection], apis: list, core, stop: dict,
                     timeout_s: float = API_START_TIMEOUT_S) -> bool:
    """Wait until every API process has said it accepts connections; False (with the reason
    printed) if one died, the core died, a signal came, or `timeout_s` passed first."""
    pending = dict(zip(ready_conns, apis))
    deadline = time.monotonic() + timeout_s
    while pending and stop["signal"] is None:
        for conn in wait(list(pending), timeout=0.2):
            process = pending.pop(conn)
            try:
                conn.recv()
            except EOFError:  # it closed its end without a word: it is exiting
                process.join(2.0)
                print(f"pagedrt: API process {process.name} exited with status "
                      f"{process.exitcode} before it was ready", flush=True)
                return False
        if not core.is_alive():
            print(f"pagedrt: the engine core exited with status {core.exitcode} while the API "
                  "processes started", flush=True)
            return False
        if time.monotonic() > deadline:
            print(f"pagedrt: {len(pending)} API process(es) not ready after {timeout_s:.0f} s; "
                  "stopping", flush=True)
            return False
    return stop["signal"] is None


def _supervise(core, apis: list, conn: Connection, stop: dict, stop_timeout_s: float) -> int:
    """Wait until a signal or a process exit; returns the launcher's exit status.
    `stop_timeout_s`: seconds from then until the API processes must be gone."""
    sentinels = {core.sentinel: core, **{p.sentinel: p for p in apis}}
    while stop["signal"] is None:
        done = wait(list(sentinels), timeout=0.2)
        if done:
            for sentinel in done:  # reap it: a process whose sentinel fired can still look
                sentinels[sentinel].join(1.0)  # alive for a moment while it exits
            break
    if stop["signal"] is not None:
        logger.info("signal %s: stopping", stop["signal"])
        for p in apis:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        _join_all(apis, time.monotonic() + stop_timeout_s - 1.0)
        conn.close()  # the core's last pipe: it exits (each API process left its own)
        return 0
    if not core.is_alive():
        # the API processes fail their requests, answer 503 briefly and exit on their own
        print(f"pagedrt: the engine core died (exit status {core.exitcode}); stopping",
              flush=True)
        _join_all(apis, time.monotonic() + stop_timeout_s - 1.0)
        return 1
    dead = [p for p in apis if not p.is_alive()]
    print(f"pagedrt: API process {dead[0].name} exited with status {dead[0].exitcode}; "
          "stopping", flush=True)
    for p in apis:
        if p.is_alive():
            os.kill(p.pid, signal.SIGTERM)
    _join_all(apis, time.monotonic() + stop_timeout_s - 1.0)
    return 1


def _join_all(processes: list, deadline: float) -> None:
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))


def _stop_all(core, apis: list) -> None:
    """Make sure nothing outlives the launcher (the core exits by itself once its pipes
    close; anything still alive is terminated, then killed)."""
    procs = [p for p in (*apis, core) if p is not None]
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)


# ---------------------------------------------------------------- API process
def run_api_process(api: ApiSpec, info: CoreInfo, listener: socket.socket,
                    conn: Connection, ready: Connection) -> None:
    """Entry point of one API process: tokenizer, app, uvicorn on the shared socket. Exits
    with 1 if the engine core died, else 0."""
    import asyncio

    import torch
    import uvicorn

    from pagedrt.entrypoints.core_client import EngineCoreClient
    from pagedrt.entrypoints.guards import HeaderTimeoutProtocol
    from pagedrt.entrypoints.openai_server import DEAD_CORE_EXIT_DELAY_S, build_app

    torch.set_num_threads(1)  # no tensor math here: no idle OpenMP threads spinning on cores
    logging.basicConfig(level=logging.INFO if api.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    conn.recv()  # the core's "ready" (it is, or the launcher would not be here)
    tokenizer = None
    if info.tokenizer_path is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(info.tokenizer_path)
    client = EngineCoreClient(conn, info, api.input_address, api.output_address, api.index)
    app = build_app(client, tokenizer, api.served_model_name, api.http)
    server_api = app.state.server

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # tell the launcher this process accepts connections
                ready.send(api.index)
                ready.close()

        def handle_exit(self, sig, frame) -> None:
            if not server_api.shutting_down:
                loop = asyncio.get_event_loop()
                loop.call_soon_threadsafe(loop.create_task,
                                          server_api.drain(api.http.shutdown_timeout_s))
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets=sockets)
            # drained (here, not after run(): uvicorn re-raises the captured SIGTERM when
            # serve() returns, which ends the process): the core may go on serving the
            # other API processes' drains
            if exit_status["code"] == 0:
                with contextlib.suppress(OSError, ValueError):
                    conn.send(("leaving", api.index))

    # uvicorn bounds header size and time only through our protocol (guards.py)
    config = uvicorn.Config(app, log_level="info" if api.verbose else "warning",
                            http=HeaderTimeoutProtocol.configured(api.http.read_timeout_s),
                            timeout_graceful_shutdown=api.http.shutdown_timeout_s + 2.0,
                            access_log=api.verbose)
    server = Server(config)
    exit_status = {"code": 0}

    def on_core_death() -> None:
        exit_status["code"] = 1

        def stop() -> None:
            server.should_exit = True

        asyncio.get_running_loop().call_later(DEAD_CORE_EXIT_DELAY_S, stop)

    client.on_death = on_core_death
    with profiled(f"api-{api.index}"):
        server.run(sockets=[listener])
    raise SystemExit(exit_status["code"])
