"""The engine under random interleavings of adds, aborts and steps: a hypothesis state machine on
the tiny random-weight Llama (tests/tiny_model.py) in float64 on the CPU with a small KV pool,
so requests are preempted (by recompute or swap), prompts share prefixes (prefix caching on or
off), prefills are chunked, n = 2 requests fork, width-2 beam searches share their slots' blocks
copy-on-write, and aborts land at any point: while waiting, mid-prefill, running, preempted,
swapped out, or (async scheduling) with a step in flight. More configurations: an FP8 cache (its
scales move with swapped blocks; no beam searches: see CONFIGS), multi-step decode (four passes
a plan where every sequence may take part, and the same only while at most 2 sequences decode)
and n-gram speculation (rejected drafts rolled back; greedy requests only).

After every rule, the engine's own integrity check (block manager invariants, device rows
against the host). At the end, with every request finished: no block held, the swap pool empty,
and each request that was not aborted has the tokens it gets alone on an engine with ample
memory (greedy, beam search, or seeded sampling, whose draws do not depend on the batch). In
float64, because a batch of another shape moves a logit by fp32's rounding (4e-6 seen), and a
draw whose two best tokens are that close in the sampler's race then picks the other: a CI run
on 2026-12-07 failed so (a seeded n = 2 sample took 187 for 107, a knife edge that the same
example in float64 does not meet). Examples are derandomized, but the tokens decide which
requests are live to abort, so a run whose tokens differ draws other examples (that CI run drew
one a local run did not). (Checked to fail: swap-ins that copied nothing, and swaps that left
an FP8 cache's scales behind, each gave a seeded n = 2 request other tokens.)
"""

from __future__ import annotations

import copy
import random
from typing import ClassVar

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from test_scheduler import assert_clean, swap_bytes

from pagedrt import LLM, BeamSearchParams, SamplingParams

VOCAB = 384
BLOCK_SIZE = 8
# longest request: a 24-token prefix, a 10-token tail and 20 tokens = 7 blocks (8 with a
# fork's own last block); two running requests of half that fill the pool, so more preempt
NUM_KV_BLOCKS = 10
_rng = random.Random(7)
PREFIXES = ([], [_rng.randrange(VOCAB) for _ in range(24)],
            [_rng.randrange(VOCAB) for _ in range(17)])
KINDS = ("greedy", "seeded", "seeded_n2", "greedy_stop", "beam2")
# a width-2 search's two slots, each with its own copy of the prompt's blocks where prefix
# caching is off, must fit the pool alone: at most 16 prefix + 10 tail + 8 tokens = 5 blocks
BEAM_PREFIX, BEAM_MAX_TOKENS = 16, 8


def params_of(kind: str, max_tokens: int, seed: int) -> SamplingParams:
    if kind == "beam2":  # a beam search of width 2 (its slots share blocks copy-on-write)
        return BeamSearchParams(beam_width=2, max_tokens=min(max_tokens, BEAM_MAX_TOKENS),
                                ignore_eos=True).to_sampling_params()
    if kind == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    if kind == "greedy_stop":  # ends early where the model emits one of these ids
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                              stop_token_ids=list(range(0, VOCAB, 7)))
    return SamplingParams(temperature=0.9, top_k=50, seed=seed, max_tokens=max_tokens,
                          ignore_eos=True, n=2 if kind == "seeded_n2" else 1)


class EngineMachine(RuleBasedStateMachine):
    """One engine per example; the test sets the class's model, config and reference_llm."""

    model = None
    config: ClassVar[dict] = {}
    replaced: ClassVar[tuple[str, ...]] = ()  # kinds this configuration runs as greedy
    reference_llm: LLM | None = None  # ample memory, each request alone, the cache's dtype
    reference: ClassVar[dict] = {}  # (cache dtype, prompt, kind, max_tokens, seed) -> tokens
    counts: ClassVar[list[dict]] = []  # each example's stats

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLM(self.model, dtype=torch.float64, num_kv_blocks=NUM_KV_BLOCKS,
                       block_size=BLOCK_SIZE,
                       max_num_batched_tokens=24, max_num_seqs=6,
                       swap_space_bytes=swap_bytes(self.model, 8, BLOCK_SIZE), **self.config)
        self.engine = self.llm.llm_engine
        self.requests: dict[str, tuple] = {}  # request id -> its key in `reference`
        self.aborted: set[str] = set()
        self.done: dict[str, list[list[int]]] = {}

    def _record(self, outputs) -> None:
        for out in outputs:
            if out.finished:
                assert out.request_id not in self.aborted, out.request_id
                self.done[out.request_id] = [c.token_ids for c in out.outputs]

    @rule(new=st.lists(st.tuples(
        st.sampled_from(PREFIXES), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
        st.sampled_from(KINDS), st.integers(1, 20), st.integers(0, 3)), min_size=1, max_size=3))
    def add(self, new):
        for prefix, tail, kind, max_tokens, seed in new:
            if kind in self.replaced:
                kind = "greedy"
            request_id = f"r{len(self.requests)}"
            if kind == "beam2":
                prefix = prefix[:BEAM_PREFIX]
            prompt = tuple(prefix) + tuple(tail)
            self.engine.add_request(request_id, list(prompt),
                                    params_of(kind, max_tokens, seed), stream=False)
            self.requests[request_id] = (prompt, kind, max_tokens, seed)

    @rule(num_steps=st.integers(1, 4))
    def step(self, num_steps):
        for _ in range(num_steps):
            self._record(self.engine.step())

    @precondition(lambda self: any(r in self.engine.requests for r in self.requests))
    @rule(data=st.data())
    def abort(self, data):
        live = sorted(r for r in self.requests if r in self.engine.requests)
        request_id = data.draw(st.sampled_from(live))
        assert self.engine.abort_request(request_id)
        self.aborted.add(request_id)

    @invariant()
    def integrity(self):
        self.engine.check_integrity()

    def teardown(self):
        while self.engine.has_unfinished_requests():
            self._record(self.engine.step())
        assert_clean(self.llm)
        assert set(self.done) | self.aborted == set(self.requests)
        dtype = self.config.get("kv_cache_dtype", "auto")
        for request_id, tokens in self.done.items():
            key = (dtype, *self.requests[request_id])
            if key not in self.reference:
                _, prompt, kind, max_tokens, seed = key
                alone = self.reference_llm.generate([list(prompt)],
                                                    params_of(kind, max_tokens, seed),
                                                    use_tqdm=False)[0]
                self.reference[key] = [c.token_ids for c in alone.outputs]
            assert tokens == self.reference[key], (request_id, key)
        self.counts.append(self.llm.stats())


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3, "disable_by_batch_size": 6}
CONFIGS = {  # name: (engine settings, request kinds run as greedy instead)
    "recompute-cache": ({"preemption_mode": "recompute"}, ()),
    "swap-cache": ({"preemption_mode": "swap"}, ()),
    "recompute": ({"preemption_mode": "recompute", "enable_prefix_caching": False}, ()),
    "swap": ({"preemption_mode": "swap", "enable_prefix_caching": False}, ()),
    # an FP8 cache (its scales swapped and copied with the blocks), against an FP8 reference.
    # No beams: a matmul's rounding here depends on its row count, and FP8's rounding
    # turns that into changes large enough to reorder a beam search's near-equal sums (seen:
    # two width-2 searches parted at their fifth token), so beams are not reproducible across
    # batch compositions over an FP8 cache
    "swap-cache-fp8": ({"preemption_mode": "swap", "kv_cache_dtype": "fp8"}, ("beam2",)),
    # multi-step decode (several passes a plan; stops and aborts mid-burst, bursts that do
    # not fit the pool fall back to one pass)
    "swap-cache-multistep": ({"preemption_mode": "swap", "num_scheduler_steps": 4}, ()),
    # the same kept to batches of at most 2 (auto's rule at a small scale: bursts start and
    # stop as requests come and go)
    "recompute-cache-multistep-cap": ({"preemption_mode": "recompute", "num_scheduler_steps": 4,
                                       "multi_step_max_num_seqs": 2}, ()),
    # n-gram speculation (rollbacks of rejected drafts), greedy: tokens as without it
    "recompute-cache-ngram": ({"preemption_mode": "recompute", "speculative_config": NGRAM},
                              ("seeded", "seeded_n2", "beam2")),
}
_REFERENCE_LLMS: dict[str, LLM] = {}  # cache dtype -> an engine with ample memory


@pytest.fixture(scope="module")
def tiny64(tiny_model):
    """The tiny model in float64 (its own copy: the session's stays float32)."""
    return tiny_model._replace(model=copy.deepcopy(tiny_model.model).double())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_adds_aborts_and_steps(tiny64, one_thread, scheduling, name):
    tiny = tiny64
    config, replaced = CONFIGS[name]
    dtype = config.get("kv_cache_dtype", "auto")
    if dtype not in _REFERENCE_LLMS:
        _REFERENCE_LLMS[dtype] = LLM(tiny, dtype=torch.float64, num_kv_blocks=512,
                                     block_size=BLOCK_SIZE,
                                     enable_prefix_caching=False, kv_cache_dtype=dtype)
    EngineMachine.model, EngineMachine.config = tiny, config
    EngineMachine.replaced, EngineMachine.reference_llm = replaced, _REFERENCE_LLMS[dtype]
    EngineMachine.counts = []
    run_state_machine_as_test(EngineMachine, settings=settings(
        max_examples=30, stateful_step_count=30, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck),
        # no shrinking: a failure prints its whole run of rules at once (shrinking one took
        # 10 minutes here)
        phases=[Phase.explicit, Phase.reuse, Phase.generate]))
    # (else the pool was too large, or the drafts too rare, to test them; which rules run
    # depends on when requests finish, so these are counted, over 30 examples, not assumed)
    assert sum(c["num_preemptions"] for c in EngineMachine.counts) > 0
    if config["preemption_mode"] == "swap":
        assert sum(c["num_swapped_out_blocks"] for c in EngineMachine.counts) > 0
    if config.get("enable_prefix_caching", True):
        assert sum(c["prefix_cache_hits"] for c in EngineMachine.counts) > 0
    if "num_scheduler_steps" in config:  # plans of several passes ran
        assert sum(c["num_multi_step_plans"] for c in EngineMachine.counts) > 0
    if "multi_step_max_num_seqs" in config:  # and batches above the cap ran too
        assert max(c["peak_batch_size"] for c in EngineMachine.counts) > config[
            "multi_step_max_num_seqs"]
    if "speculative_config" in config:  # drafts verified, some rejected (rolled back)
        drafted = sum(c["spec_decode_num_draft_tokens"] for c in EngineMachine.counts)
        accepted = sum(c["spec_decode_num_accepted_tokens"] for c in EngineMachine.counts)
        assert drafted > accepted
