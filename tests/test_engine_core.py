"""The engine-core process's loop and messages, in this process: the real loop and zmq sockets
around the tiny model or a stand-in engine that fails on purpose. Every wait is bounded."""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import pickle
import threading
import time

import msgspec
import pytest
import zmq

from pagedrt.config import EngineConfig, resolve_multi_step
from pagedrt.distributed.executor import ExecutorError
from pagedrt.engine.llm_engine import LLMEngine
from pagedrt.engine.sampler import TokenLogprobs
from pagedrt.engine.validation import EngineLimits
from pagedrt.entrypoints.engine_core import (
    Abort,
    Add,
    CoreInfo,
    CoreOutputs,
    EngineCore,
    Failure,
    server_engine_config,
    warm_up,
)
from pagedrt.outputs import TokenEvent
from pagedrt.sampling_params import SamplingParams


def test_a_server_streams_one_token_at_a_time_unless_told():
    """Auto multi-step (the default) bursts on CUDA offline; the server's engine takes it as
    one pass, so streams get single tokens; a number given is kept."""
    served = server_engine_config(EngineConfig(max_num_seqs=3))
    assert served.num_scheduler_steps == 1 and served.max_num_seqs == 3
    assert resolve_multi_step(served, "cuda").num_scheduler_steps == 1
    assert resolve_multi_step(EngineConfig(), "cuda").num_scheduler_steps == 8
    assert server_engine_config(EngineConfig(num_scheduler_steps=4)).num_scheduler_steps == 4


def test_messages_round_trip_through_pickle():
    limits = EngineLimits(100, 64, 10, 16, 8)
    messages = [
        Add(1, "r-0", [1, 2, 3], SamplingParams(temperature=0.5, n=2, stop=["x"], seed=3)),
        Abort(["r-0", "r-1"]),
        CoreOutputs([TokenEvent("r-0", 1, 42, TokenLogprobs(42, -0.5, 1, [(42, -0.5), (7, -1.0)]),
                                "stop", "x")],
                    [Failure("r-1", 400, "bad")], {"num_running": 1}),
        CoreInfo(limits, "/m", None, "cpu", "float32", 1.5),
    ]
    for message in messages:
        assert pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)) == message
    # the per-step outputs travel as typed msgpack: they come back as the same NamedTuples
    out = messages[2]
    back = msgspec.msgpack.Decoder(CoreOutputs).decode(msgspec.msgpack.encode(out))
    assert back == out and isinstance(back.events[0].logprobs, TokenLogprobs)


def _collect(engine: LLMEngine) -> dict[tuple[str, int], list]:
    """Step the engine in token-event mode to the end: tokens and finish reason per sample."""
    events: list = []
    engine.token_events = events
    got: dict[tuple[str, int], list] = {}
    finish: dict[tuple[str, int], str] = {}
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        assert engine.step() == []  # events instead of outputs
        for e in events:
            key = (e.request_id, e.sample_index)
            assert key not in finish, f"a token after the end of {key}"
            got.setdefault(key, []).append(e.token_id)
            if e.finish_reason is not None:
                finish[key] = e.finish_reason
        events.clear()
    assert not engine.has_unfinished_requests()
    assert not engine.requests, "finished requests must be retired"
    return {k: (v, finish.get(k)) for k, v in got.items()}


def test_token_events_give_the_tokens_of_request_outputs(tiny, scheduling):
    prompts = [[1, 2, 3, 4, 5], list(range(10, 40)), [7] * 17]
    params = [SamplingParams(temperature=0, max_tokens=9),
              SamplingParams(temperature=1.0, n=3, seed=5, max_tokens=6, logprobs=2),
              SamplingParams(temperature=0.8, top_k=5, seed=1, max_tokens=12,
                             stop_token_ids=[3])]
    from pagedrt import LLM

    reference = LLM(tiny, num_kv_blocks=64).generate(prompts, params, use_tqdm=False)
    engine = LLM(tiny, num_kv_blocks=64).llm_engine
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_validated_request(str(i), p, sp)
    got = _collect(engine)
    expected = {(str(i), o.index): (o.token_ids, o.finish_reason)
                for i, out in enumerate(reference) for o in out.outputs}
    assert got == expected
    engine.check_integrity()
    assert engine.kv_manager.usage()["num_used_blocks"] == 0


def test_warm_up_leaves_counters_at_zero_and_no_block_held(tiny):
    from pagedrt import LLM

    engine = LLM(tiny, num_kv_blocks=64, max_model_len=128).llm_engine
    warm_up(engine)
    stats = engine.stats()
    assert stats["num_generated_tokens"] == 0 and stats["num_steps"] == 0
    assert stats["prefix_cache_queries"] == 0 and stats["peak_batch_size"] == 0
    assert stats["num_used_blocks"] == 0 and not engine.has_unfinished_requests()
    engine.check_integrity()
    # the server's snapshot: the same counts without the walks over every block
    brief = engine.stats(detailed=False)
    assert "ref_count_histogram" not in brief and "internal_fragmentation_pct" not in brief
    numbers = [k for k, v in brief.items() if not (isinstance(v, float) and math.isnan(v))]
    assert {k: brief[k] for k in numbers} == {k: stats[k] for k in numbers}


class _StandInEngine:
    """Just enough of LLMEngine for EngineCore: request "bad" is refused when added, the
    first step raises, later steps finish every request with one token."""

    tokenizer = None
    model_path = "stand-in"
    device = "cpu"
    dtype = "float32"
    limits = EngineLimits(100, 64, 10, 16, 8)

    def __init__(self):
        self.requests, self.num_steps, self.aborted = {}, 0, []
        self.token_events = None

    def add_validated_request(self, request_id, prompt_token_ids, params, *args, **kwargs):
        if request_id == "bad":
            raise ValueError("prompt token id 999 is not an int in [0, 100)")
        self.requests[request_id] = prompt_token_ids

    def abort_request(self, request_id):
        self.aborted.append(request_id)
        return self.requests.pop(request_id, None) is not None

    def has_unfinished_requests(self):
        return bool(self.requests)

    first_step_error = RuntimeError("boom")

    def step(self):
        self.num_steps += 1
        if self.num_steps == 1:
            raise self.first_step_error
        for rid in list(self.requests):
            self.token_events.append(TokenEvent(rid, 0, 7, None, "length", None))
            del self.requests[rid]
        return []

    def stats(self, detailed=True):
        return {"num_running": len(self.requests)}


@contextlib.contextmanager
def running_core(engine, tmp_path):
    """An EngineCore over `engine` running in a thread, one API process's sockets over ipc in
    `tmp_path`: yields (core thread, command socket, output socket, the test's end of the
    liveness pipe); at the end sends "shutdown" and checks that the thread stopped."""
    ours, theirs = mp.Pipe()
    core = EngineCore(engine, [theirs], f"ipc://{tmp_path}/in", [f"ipc://{tmp_path}/out"])
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{tmp_path}/out")
    push.connect(f"ipc://{tmp_path}/in")
    thread = threading.Thread(target=core.run, daemon=True)
    thread.start()
    try:
        yield thread, push, pull, ours
    finally:
        push.send(pickle.dumps("shutdown"))
        thread.join(10)
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
    assert not thread.is_alive()


@pytest.fixture
def stand_in_core(tmp_path, request):
    """(engine, core thread, command socket, output socket, the test's end of the pipe); the
    engine's first step raises `request.param` where the test is parametrized so."""
    engine = _StandInEngine()
    if hasattr(request, "param"):
        engine.first_step_error = request.param
    with running_core(engine, tmp_path) as (thread, push, pull, ours):
        yield engine, thread, push, pull, ours


def _receive_until(pull, done, timeout_s: float = 10.0) -> tuple[list, list]:
    events, failures = [], []
    deadline = time.monotonic() + timeout_s
    while not done(events, failures):
        assert pull.poll(int(max(0, deadline - time.monotonic()) * 1000)), (events, failures)
        out = msgspec.msgpack.Decoder(CoreOutputs).decode(pull.recv())
        events += out.events
        failures += out.failures
    return events, failures


def test_core_fails_only_the_guilty_request_and_keeps_serving(stand_in_core):
    engine, thread, push, pull, _ = stand_in_core
    params = SamplingParams(max_tokens=1)
    push.send(pickle.dumps(Add(0, "bad", [1], params)))
    push.send(pickle.dumps(Add(0, "a", [1], params)))
    _, failures = _receive_until(pull, lambda e, f: len(f) >= 2)
    by_id = {f.request_id: f for f in failures}
    assert by_id["bad"].status == 400 and "999" in by_id["bad"].message  # refused: that one
    assert by_id["a"].status == 500 and "boom" in by_id["a"].message  # the failed step's
    assert engine.aborted == ["a"]  # its blocks freed
    push.send(pickle.dumps(Add(0, "b", [1], params)))
    events, failures = _receive_until(pull, lambda e, f: e)
    assert [(e.request_id, e.token_id, e.finish_reason) for e in events] == [("b", 7, "length")]
    assert not failures and thread.is_alive()


@pytest.mark.parametrize("stand_in_core", [ExecutorError("worker 1 raised: CUDA error")],
                         indirect=True)
def test_a_worker_fault_fails_the_requests_and_says_so_on_the_pipe(stand_in_core):
    """A step that raises ExecutorError (the tensor-parallel workers are gone) fails every
    request in flight with 500, ends the loop, and then sends ("failed", that message) on the
    liveness pipe: an API process that reads the pipe's end before the failures still answers
    500 (EngineCoreClient._core_died)."""
    _, thread, push, pull, ours = stand_in_core
    push.send(pickle.dumps(Add(0, "a", [1], SamplingParams(max_tokens=1))))
    _, failures = _receive_until(pull, lambda e, f: f)
    assert [(f.request_id, f.status) for f in failures] == [("a", 500)]
    assert "CUDA error" in failures[0].message
    thread.join(10)
    assert not thread.is_alive()
    assert ours.poll(10)
    assert ours.recv() == ("failed", failures[0].message)


def test_core_exits_when_its_peer_is_gone(stand_in_core):
    _, thread, _, _, ours = stand_in_core
    ours.close()  # the API process (or the launcher) died
    thread.join(10)
    assert not thread.is_alive()


@pytest.mark.parametrize("notice,status,text", [
    (("failed", "engine step failed: ExecutorError('worker 1 died')"), 500, "worker 1 died"),
    (("stopping", "SIGTERM"), 503, "stopped on SIGTERM"),
    (None, 503, "process died"),
])
def test_the_client_fails_its_requests_by_what_the_core_said(notice, status, text):
    """The API process's side: the pipe's end (read before any failure message from the
    outputs socket) fails every request in flight with the core's fault (500) where it sent
    one, else 503; `alive` turns False and on_death runs once."""
    import asyncio

    from pagedrt.entrypoints.core_client import EngineCoreClient, RequestRun, RequestState

    async def scenario():
        ours, theirs = mp.Pipe()
        client = EngineCoreClient(ours, None, "", "", 0)
        deaths = []
        client.on_death = lambda: deaths.append(1)
        runs = [RequestRun(), RequestRun()]
        for i, run in enumerate(runs):
            client.states[f"r{i}"] = RequestState(f"r{i}", [1], 1, run, time.monotonic())
        if notice is not None:
            theirs.send(notice)
        theirs.close()
        while client.alive:
            client._on_pipe()
        assert deaths == [1] and not client.states
        for run in runs:
            assert run.wake.is_set() and run.error_status == status and text in run.error
    asyncio.run(scenario())


def test_the_ready_info_carries_a_stats_snapshot_the_client_reports_at_once(tmp_path):
    """CoreInfo holds the engine's stats when the core is built (after the warm-up), and an
    API process's client reports them before any output arrives: /metrics has the pool's
    figures from its first scrape, whatever the race with the core's first publish."""
    from pagedrt.entrypoints.core_client import EngineCoreClient

    engine = _StandInEngine()
    engine.requests = {"a": [1], "b": [2]}  # (its stats: num_running 2)
    ours, theirs = mp.Pipe()
    core = EngineCore(engine, [theirs], f"ipc://{tmp_path}/in", [f"ipc://{tmp_path}/out"])
    try:
        assert core.info.stats == {"num_running": 2}
        restored = pickle.loads(pickle.dumps(core.info))  # (as the launcher's pipe carries it)
        client = EngineCoreClient(ours, restored, "", "", 0)
        snapshot = client.snapshot()
        assert snapshot["num_running"] == 2 and snapshot["server_prompt_tokens"] == 0
    finally:
        core.input.close(linger=0)
        for sock in core.outputs:
            sock.close(linger=0)
        core.zmq_context.term()
