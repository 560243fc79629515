"""Tensor parallelism on CPU (gloo): sharded models against the whole model, the engine with
worker processes against the engine in one process, faults, and the checks made before anything
starts. Worker pools take seconds to start, so each is shared by the tests of one model; every
worker runs one torch thread (PAGEDRT_NUM_THREADS=1, inherited by the spawned processes)."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import random
import signal
import socket
import struct
import threading
import time
import types

import pytest
import torch
from tiny_model import TINY_CONFIG, build_tiny_llama
from tp_helpers import free_port, greedy_logits, process_tree, raise_on_rank, signal_all

from pagedrt import LLM, BeamSearchParams, SamplingParams
from pagedrt.distributed.executor import ExecutorError
from pagedrt.distributed.sharding import check_devices, check_tensor_parallel, valid_tp_sizes
from pagedrt.kv.kv_cache import KVCacheSpec
from pagedrt.models.loader import build_model

VOCAB = TINY_CONFIG.vocab_size
NUM_DECODE_STEPS = 32


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread here and in every worker process (spawned with this environment)."""
    old_env = os.environ.get("PAGEDRT_NUM_THREADS")
    old = torch.get_num_threads()
    os.environ["PAGEDRT_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
    if old_env is None:
        os.environ.pop("PAGEDRT_NUM_THREADS", None)
    else:
        os.environ["PAGEDRT_NUM_THREADS"] = old_env


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def assert_logits_match(tp_llm: LLM, ref_llm: LLM, prompts: list[list[int]]) -> None:
    """Every rank of `tp_llm` decodes the same greedy tokens as the whole model in `ref_llm`
    for NUM_DECODE_STEPS steps, with the same logits within 1e-4 relative at every prefill
    position and every decode step; every rank holds the same (gathered) logits."""
    [ref] = ref_llm.llm_engine.executor.collective_rpc(greedy_logits, prompts, NUM_DECODE_STEPS)
    ranks = tp_llm.llm_engine.executor.collective_rpc(greedy_logits, prompts, NUM_DECODE_STEPS)
    assert len(ranks) == tp_llm.llm_engine.executor.tp_size > 1
    for rank, ours in enumerate(ranks):
        for i, (o, r) in enumerate(zip(ours, ref)):
            assert o.shape == r.shape == (len(prompts[i]) + NUM_DECODE_STEPS, r.shape[1])
            assert torch.equal(o, ranks[0][i]), f"rank {rank} differs from rank 0"
            decoded = slice(len(prompts[i]) - 1, -1)  # rows whose argmax was fed back
            assert o[decoded].argmax(-1).tolist() == r[decoded].argmax(-1).tolist(), (
                f"prompt {i}: greedy tokens differ")
            assert rel_err(o, r) <= 1e-4, f"prompt {i} on rank {rank}: {rel_err(o, r):.2e}"


def greedy(max_tokens: int = NUM_DECODE_STEPS, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def tokens(outs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def assert_all_free(llm: LLM) -> None:
    """No request left, every block free, every rank's rows agree with the host, and none is
    left once the next (empty) plan has dropped those of the last finished requests."""
    engine = llm.llm_engine
    engine.check_integrity()
    assert not engine.has_unfinished_requests() and not engine.requests
    kv = engine.kv_manager
    assert kv.num_free_blocks == kv.num_blocks and not kv.req_to_blocks
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)
    # the rows of the last requests to finish go with the next plan, on every rank
    assert engine.step() == []
    assert engine.executor.row_snapshots() == [{}] * engine.executor.tp_size


# --------------------------------------------------------------------------- real SmolLM2
@pytest.fixture(scope="module")
def smollm2_tp3(smollm2_path):
    """SmolLM2-135M (9 heads, 3 KV heads: one KV head and 3 query heads per rank) over 3
    worker processes, fp32, loaded by each worker from the GGUF's cache entry."""
    llm = LLM(smollm2_path, dtype="float32", device="cpu", tensor_parallel_size=3,
              num_kv_blocks=128, max_num_batched_tokens=512)
    yield llm
    llm.llm_engine.shutdown()


def test_smollm2_tp3_logits_match_one_rank(smollm2_tp3, smollm2):
    tok = smollm2.tokenizer
    prompts = [tok.encode("The history of the printing press begins"), tok.encode("1, 2, 3,")]
    ref = LLM(smollm2, num_kv_blocks=64)
    assert smollm2_tp3.llm_engine.executor.worker_pids  # the model is in other processes
    assert smollm2_tp3.llm_engine.model_runner is None
    assert_logits_match(smollm2_tp3, ref, prompts)


def test_smollm2_tp3_engine_generates_the_text_of_one_rank(smollm2_tp3, smollm2):
    """Through the engine (plans sent to 3 ranks, tokens back from rank 0): the tokens and
    text of the engine with the model in one process."""
    tok = smollm2.tokenizer
    prompts = ["The capital of France is", "def fib(n):"]
    params = SamplingParams(temperature=0.0, max_tokens=10)
    ref = LLM(smollm2, num_kv_blocks=128, max_num_batched_tokens=512)
    expected = ref.generate(prompts, params, use_tqdm=False)
    outs = smollm2_tp3.generate(prompts, params, use_tqdm=False)
    assert tokens(outs) == tokens(expected)
    assert [o.outputs[0].text for o in outs] == [e.outputs[0].text for e in expected]
    assert "Paris" in outs[0].outputs[0].text
    assert tok is smollm2_tp3.get_tokenizer() or tok.vocab == smollm2_tp3.get_tokenizer().vocab
    assert_all_free(smollm2_tp3)


# --------------------------------------------------------------------------- random configs
QWEN2_KV2 = dataclasses.replace(  # Qwen2: q/k/v bias, tied embeddings
    TINY_CONFIG, architecture="Qwen2ForCausalLM", attention_bias=True, tie_word_embeddings=True,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=390)
QWEN2_MQA = dataclasses.replace(QWEN2_KV2, num_key_value_heads=1, vocab_size=391,
                                intermediate_size=96)


def test_random_qwen2_with_a_replicated_kv_head_matches_one_rank():
    """More ranks than KV heads (Qwen2 with q/k/v bias and tied embeddings, one KV head over
    2 ranks): logits and greedy tokens of the engine as with one rank; each rank holds two
    query heads and the KV head, and so does its cache; the vocabulary (391) does not split
    evenly (the last rank's shard is padded)."""
    loaded = build_tiny_llama(seed=1, config=QWEN2_MQA)
    g = random.Random(0)
    prompts = [[g.randrange(QWEN2_MQA.vocab_size) for _ in range(n)] for n in (1, 8, 17, 30)]
    ref = LLM(loaded, num_kv_blocks=64, block_size=8)
    llm = LLM(loaded, tensor_parallel_size=2, num_kv_blocks=64, block_size=8)
    try:
        assert llm.llm_engine.executor.collective_rpc(_num_heads) == [(2, 1, 1)] * 2
        assert_logits_match(llm, ref, prompts)
        expected = tokens(ref.generate(prompts, greedy(), use_tqdm=False))
        assert tokens(llm.generate(prompts, greedy(), use_tqdm=False)) == expected
        assert_all_free(llm)
    finally:
        llm.llm_engine.shutdown()


def _num_heads(worker) -> tuple[int, int, int]:
    attn = worker.model.model.layers[0].self_attn
    return attn.num_heads, attn.num_kv_heads, worker.kv_cache.spec.num_kv_heads


# --------------------------------------------------------------------------- engine scenarios
def _workload():
    """Prompts sharing a 16-token prefix (prefix-cache hits) and mixed lengths (chunked
    prefill beside decodes), n = 4 seeded samples (forks, copy-on-write), n = 2 greedy,
    logprobs, unseeded sampling; the engines below are small enough to preempt."""
    rng = random.Random(3)
    shared = [rng.randrange(VOCAB) for _ in range(16)]
    prompts = [shared + [rng.randrange(VOCAB) for _ in range(rng.randint(2, 30))]
               for _ in range(10)]
    kinds = [SamplingParams(temperature=0.8, seed=11, max_tokens=16, ignore_eos=True, n=4),
             SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, n=2),
             SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2),
             SamplingParams(temperature=1.0, top_k=20, max_tokens=16, ignore_eos=True)]
    return prompts, [kinds[i % len(kinds)] for i in range(len(prompts))]


def _engine_kwargs(mode: str, tp_size: int) -> dict:
    # as many swap blocks on every rank as with one rank (a rank's blocks are smaller), so
    # that both engines schedule alike
    per_block = KVCacheSpec.for_model(TINY_CONFIG, 8, torch.float32, tp_size).bytes_per_block
    return {"num_kv_blocks": 40, "block_size": 8, "max_num_batched_tokens": 32,
            "preemption_mode": mode, "swap_space_bytes": 64 * per_block}


@pytest.fixture(scope="module")
def tp2_engines(tiny_model):
    """The tiny Llama (4 heads, 2 KV heads) over 2 worker processes, twice: preemption by
    recompute with steps one after the other, and by swap with async scheduling."""
    llms = {"recompute": LLM(tiny_model, tensor_parallel_size=2, async_scheduling=False,
                             **_engine_kwargs("recompute", 2)),
            "swap": LLM(tiny_model, tensor_parallel_size=2, async_scheduling=True,
                        **_engine_kwargs("swap", 2))}
    yield llms
    for llm in llms.values():
        llm.llm_engine.shutdown()


def test_tiny_tp2_logits_match_one_rank(tp2_engines, tiny_model):
    prompts = [[3], list(range(5, 21)), list(range(40, 73))]  # 1 token, 2 blocks, one past 4
    assert_logits_match(tp2_engines["recompute"], LLM(tiny_model, num_kv_blocks=64), prompts)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_engine_scenarios_give_the_tokens_of_one_rank(tp2_engines, tiny_model, mode):
    """Mixed prefill/decode steps, prefix hits, forks with copy-on-write, n = 4 seeded,
    preemption by `mode` and resumption: every token (sampled ones too: the schedule, and so
    each row's random stream, is the same) and every logprob of the one-rank engine, every
    rank's rows in step with the host after each step, every block free at the end."""
    llm = tp2_engines[mode]
    engine = llm.llm_engine
    prompts, params = _workload()
    ref = LLM(tiny_model, async_scheduling=mode == "swap", **_engine_kwargs(mode, 1))
    expected = ref.generate(prompts, params, use_tqdm=False)
    steps = 0
    step = engine.step

    def checked_step():
        nonlocal steps
        out = step()
        steps += 1
        if steps % 7 == 0:  # all ranks' rows against the host (one RPC per rank)
            engine.check_integrity()
        return out

    engine.step = checked_step
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        del engine.step
    assert tokens(outs) == tokens(expected)
    for o, e in zip(outs, expected):
        for c, d in zip(o.outputs, e.outputs):
            if d.logprobs is not None:
                assert [t.token_id for t in c.logprobs] == [t.token_id for t in d.logprobs]
                assert all(abs(a.logprob - b.logprob) < 1e-4
                           for a, b in zip(c.logprobs, d.logprobs))
    stats, ref_stats = llm.stats(), ref.stats()
    assert stats[f"num_preemptions_{mode}"] > 0
    assert stats["num_preemptions"] == ref_stats["num_preemptions"]
    assert stats["prefix_cache_hits"] == ref_stats["prefix_cache_hits"] > 0
    assert stats["num_chunked_prefill_steps"] > 0
    assert_all_free(llm)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_token_controls_at_tp2_match_one_rank(tp2_engines, tiny_model, mode):
    """Prompt logprobs (chunked prompts: max_num_batched_tokens 32; every rank runs the LM
    head over the same positions), logit_bias and allowed_token_ids on two ranks: the tokens
    and prompt logprobs of one rank, every block free at the end."""
    llm = tp2_engines[mode]
    prompts, _ = _workload()
    greedy = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
    kinds = [SamplingParams(prompt_logprobs=3, **greedy),
             SamplingParams(logit_bias={5: 100.0, 6: -100.0}, **greedy),
             SamplingParams(allowed_token_ids=[9, 10, 11], prompt_logprobs=0, **greedy),
             SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True,
                            logit_bias={7: 5.0})]
    params = [kinds[i % len(kinds)] for i in range(len(prompts))]
    ref = LLM(tiny_model, async_scheduling=mode == "swap", **_engine_kwargs(mode, 1))
    expected = ref.generate(prompts, params, use_tqdm=False)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert tokens(outs) == tokens(expected)
    for o, e, p in zip(outs, expected, params):
        if p.prompt_logprobs is None:
            assert o.prompt_logprobs is None
            continue
        assert len(o.prompt_logprobs) == len(o.prompt_token_ids) and o.prompt_logprobs[0] is None
        for a, b in zip(o.prompt_logprobs[1:], e.prompt_logprobs[1:]):
            assert (a.token_id, a.rank) == (b.token_id, b.rank)
            assert abs(a.logprob - b.logprob) < 1e-4
            assert [t for t, _ in a.top_logprobs] == [t for t, _ in b.top_logprobs]
    assert_all_free(llm)


def test_beam_search_at_tp2_matches_one_rank(tp2_engines, tiny_model):
    """Beam searches (widths 2 and 4, beside sampled requests, under preemption) on two ranks:
    each rank expands and re-parents its own rows and cache shard alike, and the sequences
    and scores are those of one rank."""
    llm = tp2_engines["swap"]
    prompts, params = _workload()
    beams = [BeamSearchParams(beam_width=w, max_tokens=12).to_sampling_params() for w in (2, 4)]
    params = [beams[i % 2] if i % 2 == 0 else p for i, p in enumerate(params)]
    ref = LLM(tiny_model, async_scheduling=True, **_engine_kwargs("swap", 1))
    expected = ref.generate(prompts, params, use_tqdm=False)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for i, (o, e) in enumerate(zip(outs, expected)):
        if params[i].beam_search is None:
            continue
        assert [c.token_ids for c in o.outputs] == [c.token_ids for c in e.outputs], i
        assert all(abs(c.cumulative_logprob - d.cumulative_logprob) < 1e-4
                   for c, d in zip(o.outputs, e.outputs))
    llm.llm_engine.check_integrity()
    assert llm.stats()["num_preemptions"] > 0
    assert_all_free(llm)


# --------------------------------------------------------------------------- faults
def worker_processes() -> set[int]:
    """Pids of this process's live worker processes (module fixtures keep some)."""
    return {p.pid for p in multiprocessing.active_children() if "pagedrt-tp" in p.name}


def _started_requests(llm: LLM, num_steps: int) -> None:
    rng = random.Random(5)
    for i in range(6):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(5, 40))]
        llm.llm_engine.add_request(f"r{i}", prompt, greedy(200))
    for _ in range(num_steps):
        llm.llm_engine.step()


def _assert_stopped(llm: LLM, pids: list[int]) -> None:
    """Every worker process is gone, every request ended with its blocks freed, and the next
    step fails at once with the same error."""
    engine = llm.llm_engine
    assert not any(p.pid in pids and p.is_alive() for p in multiprocessing.active_children())
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped
    assert not engine.requests and not engine.has_unfinished_requests()
    engine.kv_manager.check_integrity()
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_blocks
    with pytest.raises(ExecutorError, match="workers have stopped"):
        engine.step()
    with pytest.raises(ExecutorError):
        llm.generate([[1, 2, 3]], greedy(4), use_tqdm=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_bursts_at_tp2_give_the_tokens_of_one_rank(tiny_model, async_scheduling):
    """Multi-step decode over two ranks (`num_scheduler_steps` 4; each rank moves its own
    inputs on between passes from the samples it drew itself): the one-rank one-pass engine's
    tokens and logprobs (greedy, seeded with penalties and min_tokens, n = 2, stop ids inside
    bursts), every block free at the end."""
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 30))] for _ in range(4)]
    stops = list(range(0, VOCAB, 11))
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, seed=3, max_tokens=18, ignore_eos=True,
                             stop_token_ids=stops, min_tokens=5),
              SamplingParams(temperature=0.9, seed=4, n=2, max_tokens=15, ignore_eos=True,
                             repetition_penalty=1.2),
              SamplingParams(temperature=0.0, max_tokens=22, ignore_eos=True,
                             stop_token_ids=stops)]
    kw = {"num_kv_blocks": 64, "block_size": 8, "async_scheduling": async_scheduling}
    expected = LLM(tiny_model, **kw).generate(prompts, params, use_tqdm=False)
    llm = LLM(tiny_model, tensor_parallel_size=2, num_scheduler_steps=4, **kw)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert tokens(outs) == tokens(expected)
        got, want = outs[0].outputs[0].logprobs, expected[0].outputs[0].logprobs
        assert [t.token_id for t in got] == [t.token_id for t in want]
        assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(got, want))
        assert llm.stats()["num_multi_step_plans"] > 0
        assert_all_free(llm)
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.timeout(120)
def test_a_killed_worker_ends_the_requests_with_an_error(tiny_model):
    llm = LLM(tiny_model, tensor_parallel_size=2, num_kv_blocks=64, block_size=8)
    pids = llm.llm_engine.executor.worker_pids
    _started_requests(llm, num_steps=3)
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(ExecutorError, match=rf"pid {pids[1]}\) exited with status -9"):
        for _ in range(1000):  # a step or two at most: the monitor kills rank 0 at once
            llm.llm_engine.step()
    _assert_stopped(llm, pids)


@pytest.mark.timeout(120)
def test_a_worker_that_raises_stops_them_all(tiny_model, caplog):
    llm = LLM(tiny_model, tensor_parallel_size=2, num_kv_blocks=64, block_size=8)
    executor = llm.llm_engine.executor
    pids = executor.worker_pids
    _started_requests(llm, num_steps=2)
    with pytest.raises(ExecutorError, match="rank 1: RuntimeError: injected failure on rank 1$"):
        executor.collective_rpc(raise_on_rank, 1)
    assert "raise_on_rank" in caplog.text  # the traceback is logged, not in the message
    assert "injected failure" in executor.dead
    with pytest.raises(ExecutorError, match="injected failure"):
        llm.llm_engine.step()
    _assert_stopped(llm, pids)


def test_a_process_group_that_cannot_form_is_a_value_error(tiny_model, monkeypatch):
    """The store's port is taken: rank 0 cannot listen on it. The reason reaches the caller,
    and no worker is left behind."""
    before = worker_processes()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        monkeypatch.setenv("PAGEDRT_DIST_INIT_METHOD", f"tcp://127.0.0.1:{port}")
        with pytest.raises(ValueError, match=r"process group \(gloo, tcp://127\.0\.0\.1:"
                                             rf"{port}, rank 0 of 2\) failed to form: .*"):
            LLM(tiny_model, tensor_parallel_size=2, num_kv_blocks=16)
    assert worker_processes() == before


@pytest.mark.timeout(120)
def test_an_error_sent_just_before_a_rank_exits_is_still_the_reason(tiny_model, monkeypatch):
    """Both ranks refuse a draft model at load (a ValueError each), send it and exit. The
    executor may read rank 0's message, see rank 1's death, and only then find rank 1's
    message in its pipe: it must report the ValueError, not "exited with status 1" (a race
    seen twice in CI; forced here by hiding the queue from the first drain)."""
    from pagedrt.distributed import executor as executor_module

    drains = []
    queued = executor_module.Executor._queued_errors

    def late_queue(self):
        drains.append(1)
        return {} if len(drains) == 1 else queued(self)

    monkeypatch.setattr(executor_module.Executor, "_queued_errors", late_queue)
    before = worker_processes()
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        LLM(tiny_model, tensor_parallel_size=2, num_kv_blocks=64, block_size=8,
            speculative_config={"method": "draft_model", "num_speculative_tokens": 2,
                                "model": "unused-path"})
    assert len(drains) >= 2
    assert worker_processes() == before


def test_an_answer_that_comes_before_rank_0_runs_its_part_is_not_lost():
    """collective_rpc sends the command, runs rank 0's part, then gathers the others' answers.
    A rank that answers before rank 0's part starts has its answer read by the error poll
    there; it must still be the gathered answer (it was dropped, and the engine waited until
    its time-out: the torchrun test's hang on a loaded 2-core machine). Forced here: the
    remote rank's answer is in the pipe before the call."""
    from multiprocessing import Pipe

    from pagedrt.distributed.executor import Executor, RemoteRank

    class Rank0:
        def load_model(self):
            return "rank 0's answer"

    ours, theirs = Pipe()
    executor = Executor(Rank0(), [RemoteRank(1, ours)], tokenizer=None, model_path="")
    theirs.send_bytes(pickle.dumps(("ok", 1, "rank 1's answer", 1)))  # to command 1
    assert executor.collective_rpc("load_model", timeout_s=5) == [
        "rank 0's answer", "rank 1's answer"]
    method, args, _reply, seq = pickle.loads(theirs.recv_bytes())  # what rank 1 was sent
    assert (method, args, seq) == ("load_model", (), 1)
    # two answers early, the second for the next command: each goes to its own gather
    theirs.send_bytes(pickle.dumps(("ok", 1, "first", 2)))
    theirs.send_bytes(pickle.dumps(("ok", 1, "second", 3)))
    assert executor.collective_rpc("load_model", timeout_s=5)[1] == "first"
    assert executor.collective_rpc("load_model", timeout_s=5)[1] == "second"
    theirs.close()
    executor.shutdown()


class _StuckEvent:
    """A step's device event that completes only when `done` is set (a device waiting in an
    all-reduce for a rank that left it never does)."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def query(self) -> bool:
        return self.done.is_set()


def _rank0_with_a_step():
    """An Executor whose rank 0 is a stand-in with a model runner, and a remote rank 1 over a
    pipe; returns (executor, rank 1's end, the step, the stand-in's fetch log)."""
    from multiprocessing import Pipe

    from pagedrt.distributed.executor import Executor, RemoteRank

    fetched = []

    class Runner:
        def fetch(self, step):
            fetched.append(step.event.query())
            return "tokens"

    class Rank0:
        model_runner = Runner()

    ours, theirs = Pipe()
    executor = Executor(Rank0(), [RemoteRank(1, ours)], tokenizer=None, model_path="")
    step = types.SimpleNamespace(step_id=7, event=_StuckEvent())
    return executor, theirs, step, fetched


@pytest.mark.parametrize("how", ["error", "exit"])
def test_a_remote_rank_that_fails_mid_step_fails_rank_0s_wait_at_once(how):
    """Rank 0 in this process (the torchrun layout) waits for its step's device work while
    rank 1 fails: its error message (or the end of its connection) must end the wait now,
    not when NCCL's collective times out (the device of rank 0 would wait in the step's
    all-reduce for a rank that left it)."""
    executor, theirs, step, fetched = _rank0_with_a_step()

    def rank1_fails():
        theirs.recv_bytes()  # the fetch command
        if how == "error":
            theirs.send_bytes(pickle.dumps(("error", 1, False, "RuntimeError: rank 1 broke",
                                            "")))
        theirs.close()

    threading.Timer(0.2, rank1_fails).start()
    start = time.monotonic()
    expected = "rank 1 broke" if how == "error" else "rank 1 exited"
    with pytest.raises(ExecutorError, match=expected):
        executor.fetch(step)
    assert time.monotonic() - start < 5
    assert fetched == []  # rank 0's own fetch never ran on the stuck step
    with pytest.raises(ExecutorError, match=expected):  # and later calls say why
        executor.fetch(step)


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: an illegal memory access"),
                                   KeyboardInterrupt()], ids=["device_error", "interrupt"])
def test_an_error_in_rank_0s_own_wait_stops_every_rank(error):
    """A device error (or Ctrl-C) while rank 0 waits for its step's event is rank 0's fault
    like one in its fetch: the executor stops the ranks and says why from then on."""
    executor, theirs, step, fetched = _rank0_with_a_step()

    def failing_query():
        raise error

    step.event.query = failing_query
    expected = ExecutorError if isinstance(error, Exception) else KeyboardInterrupt
    with pytest.raises(expected):
        executor.fetch(step)
    assert executor.dead is not None and fetched == []
    theirs.recv_bytes()  # the fetch command, then what stopping the ranks sent
    assert pickle.loads(theirs.recv_bytes())[0] == "shutdown"
    with pytest.raises(ExecutorError, match="rank 0"):
        executor.fetch(step)


def test_rank_0s_wait_returns_the_step_when_the_device_finishes():
    executor, theirs, step, fetched = _rank0_with_a_step()
    threading.Timer(0.1, step.event.done.set).start()
    assert executor.fetch(step) == "tokens"
    assert fetched == [True]  # rank 0's fetch ran once the device was done
    method, args, _reply, _seq = pickle.loads(theirs.recv_bytes())
    assert (method, args) == ("fetch", (7,))
    executor.shutdown()
    theirs.close()


def _echo(worker, value):
    """collective_rpc's function form: rank 0 (a worker) answers at once, the remote rank
    (no worker: serve was never sent init) after 0.5 s."""
    if worker is None:
        time.sleep(0.5)
    return value


def _interrupt_rank0(worker, value):
    if worker is not None:
        raise KeyboardInterrupt
    return value


def _executor_with_a_thread_rank():
    """An Executor whose rank 0 is a stand-in object and whose rank 1 is worker.serve in a
    thread, over a pipe; returns (executor, the thread)."""
    import threading
    from multiprocessing import Pipe

    from pagedrt.distributed.executor import Executor, RemoteRank
    from pagedrt.distributed.group import TPGroup
    from pagedrt.distributed.worker import serve

    ours, theirs = Pipe()
    remote = threading.Thread(target=serve, args=(theirs, TPGroup(1, 2), torch.device("cpu")),
                              daemon=True)
    remote.start()
    return Executor(object(), [RemoteRank(1, ours)], tokenizer=None, model_path=""), remote


def test_an_interrupted_gather_does_not_shift_the_later_answers(monkeypatch):
    """A KeyboardInterrupt while rank 0 waits for the others' answers (Ctrl-C in a notebook;
    LLM.generate aborts its requests and the engine stays usable) leaves the remote rank's
    answer to come. The next command must get its own answers, not that one: every later
    answer was one command late before answers carried their command's number. The remote
    rank here is worker.serve in a thread, over a pipe."""
    from pagedrt.distributed import executor as executor_module

    executor, remote = _executor_with_a_thread_rank()
    real_wait = executor_module.wait

    def interrupted_wait(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(executor_module, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        executor.collective_rpc(_echo, "call 1", timeout_s=10)
    monkeypatch.setattr(executor_module, "wait", real_wait)
    for call in ("call 2", "call 3"):
        assert executor.collective_rpc(_echo, call, timeout_s=10) == [call, call]
    executor.shutdown()
    remote.join(10)
    assert not remote.is_alive()  # it was told to shut down


def test_an_interrupt_in_rank_0s_own_part_stops_the_workers():
    """Interrupted inside its own part (maybe inside a collective with the others), rank 0 is
    out of step with the other ranks: the executor stops them and says so afterwards."""
    from pagedrt.distributed.executor import ExecutorError

    executor, remote = _executor_with_a_thread_rank()
    with pytest.raises(KeyboardInterrupt):
        executor.collective_rpc(_interrupt_rank0, "call 1", timeout_s=10)
    remote.join(10)
    assert not remote.is_alive()  # told to shut down (it answered the call without error)
    with pytest.raises(ExecutorError, match="rank 0 was interrupted"):
        executor.collective_rpc(_echo, "call 2", timeout_s=10)


# --------------------------------------------------------------------------- checks first
def test_a_split_the_model_does_not_allow_is_refused_before_anything_starts(tiny_model):
    before = worker_processes()
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not divide "
                                         r"num_attention_heads=4; .* can use "
                                         r"tensor_parallel_size 1, 2, 4$"):
        LLM(tiny_model, tensor_parallel_size=3, num_kv_blocks=16)
    assert worker_processes() == before


def test_sharding_checks():
    smollm2 = dataclasses.replace(TINY_CONFIG, num_attention_heads=9, num_key_value_heads=3,
                                  intermediate_size=1536, head_dim=64, hidden_size=576)
    assert valid_tp_sizes(smollm2) == [1, 3]  # 9 does not divide intermediate_size 1536
    with pytest.raises(ValueError, match="tensor_parallel_size=9 does not divide "
                                         "intermediate_size=1536"):
        check_tensor_parallel(smollm2, 9)
    odd_kv = dataclasses.replace(TINY_CONFIG, num_attention_heads=12, num_key_value_heads=4,
                                 intermediate_size=120)
    with pytest.raises(ValueError, match="tensor_parallel_size=6 neither divides "
                                         "num_key_value_heads=4 nor is a multiple of it"):
        check_tensor_parallel(odd_kv, 6)
    assert valid_tp_sizes(odd_kv) == [1, 2, 4, 12]
    with pytest.raises(ValueError, match="needs 4 GPUs, but 1 is visible"):
        check_devices(4, "cuda", 0, 1)
    with pytest.raises(ValueError, match="needs 2 GPUs from cuda:1 on, but 2 are visible"):
        check_devices(2, "cuda", 1, 2)
    check_devices(2, "cuda", 0, 2)
    check_devices(8, "cpu", 0, 0)


def test_kv_cache_spec_holds_the_heads_of_one_rank():
    spec = KVCacheSpec.for_model
    assert spec(TINY_CONFIG, 8, torch.float32, 2).num_kv_heads == 1
    assert spec(TINY_CONFIG, 8, torch.float32, 4).num_kv_heads == 1  # replicated
    assert spec(TINY_CONFIG, 8, torch.float32).num_kv_heads == 2
    assert (spec(TINY_CONFIG, 8, torch.float32, 2).bytes_per_block * 2
            == spec(TINY_CONFIG, 8, torch.float32).bytes_per_block)


def test_torchrun_world_size_must_be_the_tensor_parallel_size(tiny_model, monkeypatch):
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="torchrun started 2 processes .* "
                                         "pass --tensor-parallel-size 2"):
        LLM(tiny_model, num_kv_blocks=16)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="torchrun rank 1 built an engine: only rank 0 does"):
        LLM(tiny_model, tensor_parallel_size=2, num_kv_blocks=16)


def test_sharded_shapes_and_weight_loading_without_a_group():
    """A shard built for rank r of N (no process group needed to build and load one) holds
    rows / columns of the full weights where sharding.py says; the padded vocabulary rows of
    the last rank are zero."""
    from pagedrt.distributed.group import TPGroup

    full = build_tiny_llama(seed=2, config=QWEN2_KV2)
    weights = full.model.hf_state_dict()
    d = QWEN2_KV2.head_dim
    for rank in range(4):
        shard = build_model(QWEN2_KV2, torch.float32, torch.device("cpu"), TPGroup(rank, 4))
        shard.load_weights(weights.items())
        attn = shard.model.layers[1].self_attn
        q = weights["model.layers.1.self_attn.q_proj.weight"][rank * d:(rank + 1) * d]
        kv_head = rank // 2  # 2 KV heads over 4 ranks: each on 2 ranks
        k = weights["model.layers.1.self_attn.k_proj.weight"][kv_head * d:(kv_head + 1) * d]
        v_bias = weights["model.layers.1.self_attn.v_proj.bias"][kv_head * d:(kv_head + 1) * d]
        assert torch.equal(attn.qkv_proj.weight, torch.cat([q, k, weights[
            "model.layers.1.self_attn.v_proj.weight"][kv_head * d:(kv_head + 1) * d]]))
        assert torch.equal(attn.qkv_proj.bias[2 * d:], v_bias)
        o = weights["model.layers.1.self_attn.o_proj.weight"]
        assert torch.equal(attn.o_proj.weight, o[:, rank * d:(rank + 1) * d])
        emb = shard.model.embed_tokens.weight  # 390 rows: 98 per rank, 96 on the last
        rows = weights["model.embed_tokens.weight"][rank * 98:(rank + 1) * 98]
        assert emb.shape[0] == 98 and torch.equal(emb[: rows.shape[0]], rows)
        assert rank < 3 or (rows.shape[0] == 96 and not emb[96:].any())
        assert shard.lm_head.weight is emb  # tied


# --------------------------------------------------------------------------- torchrun
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rank_0_takes_only_the_ranks_connections():
    """Rank 0's command port skips connections that are not a rank's (a wrong token, one
    closed before its hello, a rank out of range, a rank seen twice) and still takes the real
    ranks'; ranks that never connect are a ValueError naming them."""
    from pagedrt.distributed.torchrun import _HELLO, accept_ranks

    token = os.urandom(32)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()
        clients = []
        for rank, their_token in ((2, os.urandom(32)), (None, None), (7, token), (2, token),
                                  (2, token), (1, token)):
            client = socket.create_connection(address)
            if rank is None:
                client.close()  # closed before its hello
                continue
            client.sendall(_HELLO.pack(rank, their_token))
            clients.append(client)
        socks = accept_ranks(listener, token, 3, timeout_s=10)
        assert sorted(socks) == [1, 2]
        for rank, sock in socks.items():  # each is the connection its rank opened
            sock.sendall(struct.pack("!q", rank))
        # clients: wrong token, rank 7, rank 2, rank 2 again, rank 1
        assert [struct.unpack("!q", c.recv(8))[0] for c in (clients[2], clients[4])] == [2, 1]
        for sock in [*socks.values(), *clients]:
            sock.close()

        lone = socket.create_connection(address)
        lone.sendall(_HELLO.pack(1, token))
        with pytest.raises(ValueError, match=r"torchrun ranks \[2\] did not connect"):
            accept_ranks(listener, token, 3, timeout_s=0.5)
        lone.close()


def test_torchrun_command_connections_probe_a_silent_peer():
    """The command connections between torchrun ranks keep TCP keepalive on with short
    timers, so a peer machine that vanishes without closing its end is noticed (a blocking
    receive on a plain socket would wait forever)."""
    from pagedrt.distributed import torchrun

    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_connection(listener.getsockname()) as sock:
        torchrun._keep_alive(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 60
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 6
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 120_000


@pytest.mark.timeout(300)
def test_two_torchrun_nodes_on_loopback_generate_the_text_of_one_rank(tmp_path, smollm2_path):
    """`torchrun --nnodes 2 --node-rank R ... -m pagedrt.entrypoints.cli generate ...` twice on
    this machine (two "nodes" over loopback, gloo), as the README shows: rank 0 prints the
    answers, rank 1 serves as its worker and exits with it; the text is that of the same
    model in one process. The model: the tiny Llama with SmolLM2's vocabulary size and
    tokenizer, written as a Hugging Face folder."""
    import subprocess
    import sys

    from tp_helpers import save_hf_folder

    from pagedrt.models.loader import resolve_checkpoint

    config = dataclasses.replace(TINY_CONFIG, vocab_size=49152, bos_token_id=1,
                                 eos_token_ids=(2,))
    folder = save_hf_folder(build_tiny_llama(seed=3, config=config), str(tmp_path / "model"),
                            resolve_checkpoint(smollm2_path).tokenizer_dir)
    prompts = ["Once upon a time", "The capital of France is"]
    port = free_port()
    # (PYTHONFAULTHANDLER: on a hang, SIGABRT makes every Python process print its stacks;
    # unbuffered, the logs show how far each got; a collective waits 60 s at most, not 300)
    env = dict(os.environ, PYTHONPATH=ROOT, PAGEDRT_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1", PAGEDRT_DIST_TIMEOUT_S="60")
    env.pop("PAGEDRT_DIST_INIT_METHOD", None)
    log_files = [open(tmp_path / f"node{rank}.log", "w+") for rank in (0, 1)]  # noqa: SIM115
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
         str(rank), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
         str(port), "-m", "pagedrt.entrypoints.cli", "generate", *prompts, "--model", folder,
         "--no-chat", "--max-tokens", "12", "--quiet", "--device", "cpu",
         "--tensor-parallel-size", "2", "--num-kv-blocks", "64"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        for rank, log in zip((0, 1), log_files)]
    deadline, hung, trees = time.monotonic() + 200, False, []
    try:
        for node in nodes:
            node.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        hung = True
        # every process's Python stacks into its node's log, one process at a time (the
        # workers, then the agents, which die of it)
        trees = [process_tree(node.pid) for node in nodes]  # (before an agent dies)
        for pid in [pid for tree in trees for pid in tree[1:]] + [tree[0] for tree in trees]:
            signal_all([pid], signal.SIGABRT)
            time.sleep(1)
    finally:
        for node in nodes:  # the agents and their workers, wherever they are
            if node.poll() is None:
                trees.append(process_tree(node.pid))
        signal_all([pid for tree in trees for pid in tree], signal.SIGKILL)
        for node in nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=10)
    logs = []
    for rank, f in enumerate(log_files):
        f.seek(0)
        logs.append(f"--- node {rank} ---\n{f.read()}")
        f.close()
    assert not hung, "the nodes did not finish in 200 s; their logs:\n" + "\n".join(logs)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(logs)
    llm = LLM(folder, dtype="float32", device="cpu", num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    for prompt, out in zip(prompts, llm.generate(prompts, params, use_tqdm=False)):
        assert f">>> {prompt}\n{out.outputs[0].text.strip()}\n" in logs[0], logs[0]
        assert len(out.outputs[0].token_ids) == 12
    assert ">>>" not in logs[1]  # rank 1 only served
