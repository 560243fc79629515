"""The batched sampler (`Sampler.sample_rows`, settings and penalty counts persistent per row in
`SamplingState`) against the plain one (`Sampler.__call__`, settings built per request from
Python lists): the same tokens, step after step, in mixed batches whose rows join, leave, fork
and are preempted and resumed between steps (CPU, fast)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pagedrt import LLM, SamplingParams
from pagedrt.core.plan import NewRequestData, StepPlan
from pagedrt.engine import sampler as sampler_module
from pagedrt.engine.bad_words import OutputHistory
from pagedrt.engine.input_batch import InputBatch
from pagedrt.engine.sampler import Sampler, SamplingRow

VOCAB = 40
EOS = (3,)


def _clone(generator: torch.Generator) -> torch.Generator:
    return torch.Generator().set_state(generator.get_state())


def _random_params(rng: random.Random, filters: bool | str = True) -> SamplingParams:
    """filters=False: no top-k, top-p or min-p (the Triton race's one-pass case); "top_k":
    every request has a top-k of at most VOCAB // 4 (the candidates-only case)."""
    kw = {"temperature": rng.choice([0.0, 0.0, 0.6, 1.0, 1.7]),
          "seed": rng.choice([None, rng.randrange(1000)]),
          "max_tokens": 64, "ignore_eos": rng.random() < 0.3}
    if filters == "top_k":
        kw["top_k"] = rng.choice([1, 3, 5, VOCAB // 4])
    elif filters and rng.random() < 0.5:
        kw["top_k"] = rng.choice([-1, 1, 5, VOCAB, VOCAB + 3])
    if filters and rng.random() < 0.5:
        kw["top_p"] = rng.choice([1.0, 0.9, 0.3, 1e-4])
    if filters and rng.random() < 0.4:
        kw["min_p"] = rng.choice([0.0, 0.05, 0.5])
    if rng.random() < 0.5:
        kw["repetition_penalty"] = rng.choice([1.0, 1.3, 0.7])
        kw["frequency_penalty"] = rng.choice([0.0, 0.4, -0.5])
        kw["presence_penalty"] = rng.choice([0.0, 1.1, -2.0])
    if rng.random() < 0.3:
        kw["min_tokens"] = rng.randrange(1, 6)
        kw["stop_token_ids"] = rng.sample(range(VOCAB), rng.randrange(0, 3))
    if rng.random() < 0.2:
        kw["logprobs"] = rng.randrange(0, 4)
    return SamplingParams(**kw)


class Harness:
    """An InputBatch driven by hand-made plans; every step samples all its rows both ways."""

    def __init__(self, seed: int, kernel: bool = False, filters: bool | str = True) -> None:
        self.kernel = kernel  # sample_rows through the Triton race (the interpreter on CPU)
        self.filters = filters  # requests may have top-k, top-p, min-p ("top_k": all top-k)
        self.rng = random.Random(seed)
        self.batch = InputBatch(max_model_len=128, device=torch.device("cpu"), num_rows=4)
        self.default = torch.Generator().manual_seed(seed)
        self.active: list[str] = []
        self.parked: dict[str, tuple[list[int], list[int], SamplingParams]] = {}
        self.step_id = 0
        self.next_id = 0
        self.num_sampled = 0

    def new_request(self) -> NewRequestData:
        rid = f"r{self.next_id}"
        self.next_id += 1
        prompt = [self.rng.randrange(VOCAB) for _ in range(self.rng.randrange(1, 12))]
        return NewRequestData(rid, prompt, [], _random_params(self.rng, self.filters), 0, EOS,
                              [], 0)

    def run(self, logits_of, num_steps: int = 40) -> None:
        """Three requests, then `num_steps` random steps; asserts over 100 rows sampled."""
        for _ in range(3):
            new = self.new_request()
            self.batch.apply(StepPlan(new_requests=[new], req_ids=[new.req_id]))
            self.active.append(new.req_id)
        for _ in range(num_steps):
            self.step(logits_of)
        assert self.num_sampled > 100

    def step(self, logits_of) -> None:
        """Random joins, finishes, preemptions, resumptions and forks, then sample."""
        rng, batch = self.rng, self.batch
        plan = StepPlan(step_id=self.step_id)
        for rid in list(self.active):
            roll = rng.random()
            if roll < 0.08:
                plan.finished_req_ids.append(rid)
                self.active.remove(rid)
            elif roll < 0.14:
                row = batch.row_of[rid]
                state = batch.states[row]
                self.parked[rid] = (list(state.prompt_token_ids), state.output_token_ids,
                                    state.params)
                plan.preempted_req_ids.append(rid)
                self.active.remove(rid)
        for rid in list(self.parked):
            if rng.random() < 0.3:
                prompt, outputs, params = self.parked.pop(rid)
                plan.new_requests.append(NewRequestData(rid, prompt, outputs, params, 0, EOS,
                                                        [], 0))
                self.active.append(rid)
            elif rng.random() < 0.05:  # finished while preempted
                self.parked.pop(rid)
                plan.finished_req_ids.append(rid)
        for _ in range(rng.choice([0, 0, 1, 3])):
            new = self.new_request()
            plan.new_requests.append(new)
            self.active.append(new.req_id)
        plan.req_ids = list(self.active)
        rows = batch.apply(plan)
        if len(rows) and rng.random() < 0.15:  # fork a row into two more samples
            parent = int(rows[rng.randrange(len(rows))])
            pid = batch.states[parent].req_id
            children = [batch.fork(parent, f"{pid}#{self.step_id}.{k}", k) for k in (1, 2)]
            self.active += [batch.states[c].req_id for c in children]
            rows = batch.rows(self.active)
        self.step_id += 1
        if not len(rows):
            return
        ids = [batch.states[r].req_id for r in rows.tolist()]
        logits = torch.stack([logits_of(rid, len(batch.states[r].output_token_ids))
                              for rid, r in zip(ids, rows.tolist())])
        sample_plain_and_batched(batch, rows, logits, self.default, self.kernel)
        self.num_sampled += len(rows)


def sample_plain_and_batched(batch: InputBatch, rows: np.ndarray, logits: torch.Tensor,
                             default: torch.Generator, kernel: bool = False) -> list[int]:
    """Sample the rows both ways (the plain way on a copy of the default generator; the batched way
    through the Triton race when `kernel`), assert the same tokens and logprobs, and write the
    tokens into the rows."""
    states = [batch.states[r] for r in rows.tolist()]
    plain_rows = [SamplingRow(s.params, s.seed, list(s.prompt_token_ids),
                              s.output_token_ids, s.eos_token_ids, s.sample_index) for s in states]
    original = logits.clone()
    expected = Sampler()(logits, plain_rows, _clone(default))
    history = OutputHistory(batch.token_ids, batch.pending, None)  # (bad-word sequences)
    got = Sampler(kernel=kernel).sample_rows(logits, batch.sampling, rows, batch.states,
                                             batch.num_tokens, default, history=history)
    assert torch.equal(logits, original)
    assert torch.equal(got.token_ids, expected.token_ids), (
        [s.params for s in states], got.token_ids, expected.token_ids)
    assert got.logprobs == expected.logprobs
    tokens = got.token_ids.tolist()
    step_id = batch.pending_step.max() + 1
    positions = batch.append_sampled(rows, step_id)
    batch.write_sampled([s.req_id for s in states], rows, batch.epoch[rows], positions, tokens,
                        step_id)
    return tokens


def _logits_of(seed: int):
    def logits_of(req_id: str, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((seed, req_id.split("#")[0], step)) % 2**31)
        x = torch.randn(VOCAB, generator=g) * 2.5
        x[::9] = float("-inf")  # some tokens impossible
        return x
    return logits_of


@pytest.mark.parametrize("seed, kernel, filters", [
    (0, False, True), (1, False, True), (2, False, True), (3, False, True),
    (0, True, True), (1, True, False), (2, True, False)])
def test_batched_equals_plain_in_changing_mixed_batches(seed, kernel, filters):
    """Also with the Triton race (pagedrt/ops/sample_triton.py, under the interpreter), which
    draws the same noise: the same tokens in every setting (filters, penalties, min_tokens,
    seeds, logprobs, greedy rows among sampled ones); without filters every step takes its
    one-pass form (temperature in the kernel, 32-bit or the model's logits as they are)."""
    if kernel:
        pytest.importorskip("triton")
    h = Harness(seed, kernel, filters)
    h.run(_logits_of(seed))
    # every penalized row's device counts are its host tokens' counts
    sampling = h.batch.sampling
    for rid, row in h.batch.row_of.items():
        slot = int(sampling.penalty_slot[row])
        if slot >= 0:
            outputs = h.batch.states[row].output_token_ids
            expected = torch.bincount(torch.tensor(outputs, dtype=torch.int64), minlength=VOCAB)
            assert torch.equal(sampling.output_counts[slot].long(), expected), rid


@pytest.mark.parametrize("seed, kernel", [(4, False), (5, False), (6, True)])
def test_candidates_only_sampling_equals_the_full_rows(seed, kernel, monkeypatch):
    """Batches whose sampled rows all have a top-k of at most a quarter of the vocabulary are
    drawn among each row's k_max candidates alone (`_sample_candidates`), with top-p, min-p,
    penalties, min_tokens, seeds, logprobs and greedy rows mixed in: the same tokens and
    logprobs as the plain sampler's full rows, step after step; and that path is taken."""
    if kernel:
        pytest.importorskip("triton")
    calls = []
    original = sampler_module._sample_candidates
    monkeypatch.setattr(sampler_module, "_sample_candidates",
                        lambda *a, **kw: calls.append(a[1]) or original(*a, **kw))
    h = Harness(seed, kernel, filters="top_k")
    h.run(_logits_of(seed))
    assert len(calls) >= 10 and max(calls) <= VOCAB // 4, calls


def test_plain_greedy_batch_takes_the_argmax_of_the_model_dtype():
    batch = InputBatch(max_model_len=16, device=torch.device("cpu"))
    new = [NewRequestData(f"g{i}", [1, 2], [], SamplingParams(temperature=0.0), 0, EOS, [], 0)
           for i in range(5)]
    rows = batch.apply(StepPlan(new_requests=new, req_ids=[n.req_id for n in new]))
    logits = torch.randn(5, VOCAB).to(torch.bfloat16)
    out = Sampler().sample_rows(logits, batch.sampling, rows, batch.states, batch.num_tokens)
    assert torch.equal(out.token_ids, logits.float().argmax(-1))
    assert batch.sampling.output_counts is None  # no penalty slot was ever made


@pytest.mark.parametrize("kwargs", [
    {"temperature": 0.8, "top_k": 5, "top_p": 0.8, "min_p": 0.05},
    {"temperature": 1.0, "repetition_penalty": 1.4, "frequency_penalty": 0.3,
     "presence_penalty": 0.5, "min_tokens": 4, "stop_token_ids": [7]},
])
def test_a_seeded_row_gives_its_tokens_in_any_batch(kwargs):
    """A seeded row's tokens depend on its seed and its logits only, not on which rows share
    its batch, when they join or leave, or where its row sits."""
    logits_of = _logits_of(99)
    params = SamplingParams(seed=1234, max_tokens=64, **kwargs)

    def run(num_others: int, churn: bool) -> list[int]:
        h = Harness(num_others)
        for _ in range(num_others):
            new = h.new_request()
            h.batch.apply(StepPlan(new_requests=[new], req_ids=[new.req_id]))
            h.active.append(new.req_id)
        target = NewRequestData("target", [5, 6, 7], [], params, 0, EOS, [], 0)
        h.batch.apply(StepPlan(new_requests=[target], req_ids=[*h.active, "target"]))
        h.active.append("target")
        tokens = []
        for _ in range(12):
            if churn:
                h.step(logits_of)  # (may preempt and resume the target: same tokens)
                if "target" not in h.batch.row_of:
                    continue
            else:
                rows = h.batch.rows(h.active)
                logits = torch.stack([logits_of(rid, len(h.batch.states[r].output_token_ids))
                                      for rid, r in zip(h.active, rows.tolist())])
                sample_plain_and_batched(h.batch, rows, logits, h.default)
            row = h.batch.row_of["target"]
            tokens = h.batch.states[row].output_token_ids
        return tokens

    alone = run(0, churn=False)
    assert len(alone) == 12
    for num_others, churn in ((3, False), (6, True), (9, True)):
        got = run(num_others, churn)
        assert got == alone[: len(got)], (num_others, churn)


def test_engine_batched_sampler_equals_plain_sampler(tiny):
    """End to end on the tiny model: the engine sampling with the persistent batch gives the
    tokens of the same engine sampling every step through the plain sampler (n > 1 forks,
    penalties, filters, seeds, min_tokens, and preemptions from a small KV cache), and so does
    it with async scheduling (penalty counts on the device; a preempted row's parked counts
    hold its token still being sampled)."""
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 300) for _ in range(rng.randrange(4, 30))] for _ in range(12)]
    params = []
    for i in range(12):
        p = _random_params(rng)
        # seeded: the default generator's draws depend on the batch, which async scheduling
        # changes (a row stopped by the step in flight still runs once)
        params.append(SamplingParams(**{
            **p.__dict__, "n": 2 if i % 4 == 0 else 1, "seed": i, "stop": [],
            "max_tokens": rng.randrange(4, 30),
            "presence_penalty": 0.8 if i % 2 else p.presence_penalty}))
    outs = {}
    for plain, async_scheduling in ((False, False), (True, False), (False, True)):
        llm = LLM(tiny, num_kv_blocks=20, block_size=8, seed=3,
                  async_scheduling=async_scheduling)
        runner = llm.llm_engine.model_runner
        if plain:
            def run_plain(logits, rows, runner=runner):
                if not len(rows):
                    return None
                states = runner.batch.states
                sampling_rows = [SamplingRow(s.params, s.seed, list(s.prompt_token_ids),
                                             s.output_token_ids, s.eos_token_ids, s.sample_index)
                                 for s in (states[r] for r in rows.tolist())]
                return runner.sampler(logits, sampling_rows, runner.generator)
            runner._run_sampler = run_plain
        res = llm.generate(prompts, params, use_tqdm=False)
        outs[plain, async_scheduling] = [[c.token_ids for c in o.outputs] for o in res]
        assert llm.llm_engine.stats()["num_preemptions"] > 0
        llm.llm_engine.check_integrity()
    assert outs[False, False] == outs[True, False]
    assert outs[False, True] == outs[True, False]


def test_a_forced_kernel_on_a_cpu_needs_the_interpreter(tiny, monkeypatch):
    """PAGEDRT_SAMPLE_KERNEL=1 (kernel=True) for a CPU device outside TRITON_INTERPRET=1 is a
    ValueError at start-up naming both variables (it used to fail at the first sampled token
    with Triton's "0 active drivers"); with the interpreter, or the kernel off, it passes."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="PAGEDRT_SAMPLE_KERNEL=1.*TRITON_INTERPRET=1"):
        Sampler(kernel=True).check_device(torch.device("cpu"))
    Sampler(kernel=False).check_device(torch.device("cpu"))
    Sampler(kernel=True).check_device(torch.device("cuda"))
    monkeypatch.setenv("PAGEDRT_SAMPLE_KERNEL", "1")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        LLM(tiny, num_kv_blocks=16, block_size=8)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    Sampler().check_device(torch.device("cpu"))
