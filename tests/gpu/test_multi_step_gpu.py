"""Multi-step decode on the GPU (EngineConfig.num_scheduler_steps; docs/design.md, "Multi-step
decode"): the passes replay the captured decode graphs with their staged inputs moved on by
each pass (and with the per-input copies, PAGEDRT_STAGED_GRAPH_INPUTS=0), sampling on the
device between them; the tokens must be the one-pass engine's."""

from __future__ import annotations

import random

import pytest
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams


def _llm(monkeypatch, staged: bool, **kw) -> LLM:
    monkeypatch.setenv("PAGEDRT_STAGED_GRAPH_INPUTS", "1" if staged else "0")
    loaded = build_tiny_llama(seed=0)
    loaded = loaded._replace(model=loaded.model.to("cuda"))
    return LLM(loaded, num_kv_blocks=256, block_size=16, max_num_seqs=6, **kw)


@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_tokens_match_the_one_pass_engine(monkeypatch, staged, async_scheduling):
    """Greedy, seeded with filters and penalties, stop ids and min_tokens, in batches that
    shrink through the graphs' sizes; 8 passes a plan where they fit."""
    rng = random.Random(0)
    prompts = [[rng.randrange(200) for _ in range(rng.randint(1, 70))] for _ in range(6)]
    stops = list(range(0, 384, 13))
    kinds = [{"temperature": 0.0},
             {"temperature": 0.9, "top_k": 30, "seed": 1},
             {"temperature": 0.0, "stop_token_ids": stops},
             {"temperature": 0.8, "top_p": 0.9, "min_p": 0.05, "seed": 2,
              "repetition_penalty": 1.2, "frequency_penalty": 0.3, "min_tokens": 9,
              "stop_token_ids": stops}]
    params = [SamplingParams(max_tokens=20 + 7 * i, ignore_eos=True, **kinds[i % 4])
              for i in range(6)]
    outs = {}
    for steps in (1, 8):
        llm = _llm(monkeypatch, staged, async_scheduling=async_scheduling,
                   num_scheduler_steps=steps)
        outs[steps] = [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                    use_tqdm=False)]
        stats = llm.stats()
        if steps > 1:
            assert stats["num_multi_step_plans"] > 0
        kv = llm.llm_engine.kv_manager
        assert kv.num_free_blocks == kv.num_blocks
    assert outs[8] == outs[1]


@pytest.mark.parametrize("staged", [True, False])
def test_logprobs_match_the_one_pass_engine(monkeypatch, staged):
    """Requests asking for logprobs take part in bursts on the GPU too: each pass's logprobs
    (greedy and seeded, beside a row asking none) as one pass gives them."""
    rng = random.Random(1)
    prompts = [[rng.randrange(200) for _ in range(rng.randint(1, 40))] for _ in range(3)]
    params = [SamplingParams(temperature=0.0, max_tokens=21, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, seed=3, max_tokens=17, ignore_eos=True,
                             logprobs=1),
              SamplingParams(temperature=0.0, max_tokens=19, ignore_eos=True)]
    outs = {}
    for steps in (1, 8):
        llm = _llm(monkeypatch, staged, async_scheduling=True, num_scheduler_steps=steps)
        outs[steps] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        if steps > 1:
            assert llm.stats()["num_multi_step_plans"] > 0
    for got, want in zip(outs[8], outs[1]):
        assert got.token_ids == want.token_ids
        if want.logprobs is None:
            assert got.logprobs is None
            continue
        assert [(g.token_id, g.rank) for g in got.logprobs] == [
            (w.token_id, w.rank) for w in want.logprobs]
        assert [g.logprob for g in got.logprobs] == pytest.approx(
            [w.logprob for w in want.logprobs], abs=1e-4)


def test_the_default_bursts_at_small_batches(monkeypatch):
    """The default (num_scheduler_steps None, auto) on CUDA with graphs: bursts of
    AUTO_SCHEDULER_STEPS while the batch is within AUTO_MULTI_STEP_MAX_NUM_SEQS, with the one-pass
    engine's tokens (greedy and seeded)."""
    from pagedrt.config import AUTO_MULTI_STEP_MAX_NUM_SEQS, AUTO_SCHEDULER_STEPS

    rng = random.Random(2)
    prompts = [[rng.randrange(200) for _ in range(rng.randint(1, 50))] for _ in range(4)]
    params = [SamplingParams(max_tokens=15 + 6 * i, ignore_eos=True,
                             **({"temperature": 0.0} if i % 2 else {"temperature": 0.9, "seed": i}))
              for i in range(4)]
    outs = {}
    for steps in (1, None):
        llm = _llm(monkeypatch, True, num_scheduler_steps=steps)
        config = llm.llm_engine.config
        outs[steps] = [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                    use_tqdm=False)]
        if steps is None:
            assert config.num_scheduler_steps == AUTO_SCHEDULER_STEPS
            assert config.multi_step_max_num_seqs == AUTO_MULTI_STEP_MAX_NUM_SEQS
            assert llm.stats()["num_multi_step_plans"] > 0
    assert outs[None] == outs[1]
