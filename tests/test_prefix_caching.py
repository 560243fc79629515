"""Prefix caching, copy-on-write and n > 1 samples, end to end.

Greedy tokens must be identical with prefix caching on and off (fp32, exact equality). Real
text runs on SmolLM2-135M-Instruct; the many-request and eviction scenarios run on a tiny
random-weight Llama (tests/tiny_model.py), whose logits are far from flat.
"""

from __future__ import annotations

import random

import pytest

from pagedrt import LLM, SamplingParams

BS = 16
TEXT = (
    "A lighthouse keeper's day began before dawn. He climbed the spiral stairs, trimmed the "
    "wick, polished the great lens until no smear could scatter the beam, and wrote the "
    "weather into a log that nobody would read for a hundred years. Ships passed far out at "
    "sea, their crews trusting a light they would never see up close. In winter the storms "
    "threw spray over the gallery rail, and the keeper counted the seconds between flashes to "
    "be sure the clockwork had not stopped. When electricity came to the coast the keepers "
    "left one by one, and the towers went on shining without them."
)


# every test runs twice: without and with async scheduling (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("scheduling")


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def tokens_of(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def assert_clean(llm: LLM) -> None:
    """After a scenario: no request lost or left behind, every block free or cached-evictable,
    the CPU swap pool empty, and every block-manager invariant holds."""
    engine = llm.llm_engine
    engine.check_integrity()
    assert engine.in_flight is None
    assert not engine.has_unfinished_requests() and not engine.requests
    kv = engine.kv_manager
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks), "a block is still in use"
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.num_free_cpu_blocks == kv.num_cpu_blocks and not kv.req_to_cpu_blocks


@pytest.fixture(scope="module")
def text_ids(smollm2) -> list[int]:
    ids = smollm2.tokenizer.encode(TEXT)
    assert len(ids) >= 100, len(ids)
    return ids


# --------------------------------------------------------------------------- SmolLM2, real text
def test_shared_prefix_ending_mid_block_and_second_pass(smollm2, text_ids):
    """Prompts sharing 2 * 16 + 5 tokens (the shared prefix ends inside a block): same greedy
    tokens with caching on and off; the second pass hits every full block but the one holding
    each prompt's last token."""
    shared = text_ids[: 2 * BS + 5]
    tails = [[], text_ids[40:43], text_ids[50:61], text_ids[60:76], text_ids[70:90]]
    prompts = [shared + t for t in tails]
    ref = tokens_of(LLM(smollm2, num_kv_blocks=64, enable_prefix_caching=False)
                    .generate(prompts, greedy(6), use_tqdm=False))
    llm = LLM(smollm2, num_kv_blocks=64, enable_prefix_caching=True)
    assert tokens_of(llm.generate(prompts, greedy(6), use_tqdm=False)) == ref
    first = llm.stats()
    # first pass: admitted in one step, the later prompts hit the 2 full shared blocks that
    # the first prompt computes in that same forward
    assert first["prefix_cache_hits"] == 4 * 2 * BS
    assert_clean(llm)
    assert tokens_of(llm.generate(prompts, greedy(6), use_tqdm=False)) == ref
    second = llm.stats()
    expected_hits = sum((len(p) - 1) // BS * BS for p in prompts)
    assert second["prefix_cache_hits"] - first["prefix_cache_hits"] == expected_hits
    assert second["prefix_cache_queries"] - first["prefix_cache_queries"] == sum(map(len, prompts))
    assert 0 < second["prefix_cache_hit_rate"] < 1
    assert_clean(llm)


def test_n4_greedy_samples_share_prompt_blocks_with_copy_on_write(smollm2, text_ids):
    """n = 4 greedy samples equal one greedy sample. After the prefill the 4 sequences share
    all 3 prompt blocks (the last one partial); their first writes copy the partial block for
    3 of them, and the 4th writes in place."""
    prompt = text_ids[: 2 * BS + 5]
    llm = LLM(smollm2, num_kv_blocks=64)
    single = tokens_of(llm.generate([prompt], greedy(8), use_tqdm=False))[0]
    assert_clean(llm)
    engine = llm.llm_engine
    engine.add_request("n4", prompt, greedy(8, n=4))
    engine.step()  # prefill, fork into 4 sequences, each samples its first token
    stats = llm.stats()
    assert stats["ref_count_histogram"] == {4: 3}, stats["ref_count_histogram"]
    assert stats["num_used_blocks"] == 3
    engine.step()  # each writes its first token into the shared partial block
    stats = llm.stats()
    assert stats["num_cow_copies"] == 3
    assert stats["ref_count_histogram"] == {4: 2, 1: 4}, stats["ref_count_histogram"]
    # fragmentation: 4 sequences of 38 computed tokens in 2 shared + 4 private blocks
    assert stats["internal_fragmentation_slots"] == 6 * BS - (2 * BS + 4 * 6)
    outputs = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs = out
    assert [c.index for c in outputs.outputs] == [0, 1, 2, 3]
    assert all(c.token_ids == single for c in outputs.outputs)
    assert_clean(llm)


def test_n4_seeded_samples_differ_are_reproducible_and_never_see_each_other(smollm2, text_ids):
    """Seeded n = 4 samples diverge at their first token, inside the shared partial block.
    Each must equal the same sample generated alone (sample i of seed s uses seed s + i): a
    sequence that read a sibling's KV would draw from another distribution."""
    prompt = text_ids[: 2 * BS + 5]
    params = SamplingParams(n=4, temperature=1.0, top_k=50, seed=77, max_tokens=8,
                            ignore_eos=True)
    llm = LLM(smollm2, num_kv_blocks=64)
    first = [c.token_ids for c in llm.generate([prompt], params, use_tqdm=False)[0].outputs]
    assert len({tuple(s) for s in first}) == 4, f"samples should differ: {first}"
    assert len({s[0] for s in first}) > 1, "samples should diverge inside the partial block"
    assert llm.stats()["num_cow_copies"] >= 3
    assert_clean(llm)
    # again, now batched with another request: the same 4 samples
    other = text_ids[30:60]
    outs = llm.generate([other, prompt], [greedy(8), params], use_tqdm=False)
    assert [c.token_ids for c in outs[1].outputs] == first
    assert_clean(llm)
    # each sample alone, without any sharing
    alone = LLM(smollm2, num_kv_blocks=64, enable_prefix_caching=False)
    singles = [SamplingParams(temperature=1.0, top_k=50, seed=77 + i, max_tokens=8,
                              ignore_eos=True) for i in range(4)]
    assert tokens_of(alone.generate([prompt] * 4, singles, use_tqdm=False)) == first
    assert_clean(alone)


# --------------------------------------------------------------------------- tiny model
def _random_prompts(rng: random.Random, lengths: list[int]) -> list[list[int]]:
    return [[rng.randrange(384) for _ in range(n)] for n in lengths]


def test_block_aligned_prompts_twice_then_8_copies(tiny):
    """Prompts of exactly 16, 32 and 48 tokens sent twice, then 8 copies at once: full hits
    (all blocks but the last, whose last token is always computed), same tokens as without
    caching."""
    prompts = _random_prompts(random.Random(1), [16, 32, 48])
    ref_llm = LLM(tiny, num_kv_blocks=64, enable_prefix_caching=False)
    ref = tokens_of(ref_llm.generate(prompts, greedy(12), use_tqdm=False))
    ref_copies = tokens_of(ref_llm.generate([prompts[2]] * 8, greedy(12), use_tqdm=False))
    assert ref_copies == [ref[2]] * 8

    llm = LLM(tiny, num_kv_blocks=64)
    assert tokens_of(llm.generate(prompts, greedy(12), use_tqdm=False)) == ref
    assert llm.stats()["prefix_cache_hits"] == 0
    assert_clean(llm)
    assert tokens_of(llm.generate(prompts, greedy(12), use_tqdm=False)) == ref
    stats = llm.stats()
    assert stats["prefix_cache_hits"] == 0 + 16 + 32
    assert stats["prefix_cache_queries"] == 2 * (16 + 32 + 48)
    assert_clean(llm)
    outs = llm.generate([prompts[2]] * 8, greedy(12), use_tqdm=False)
    assert tokens_of(outs) == ref_copies
    assert [o.num_cached_tokens for o in outs] == [32] * 8
    assert llm.stats()["prefix_cache_hits"] == 48 + 8 * 32
    assert_clean(llm)


def test_small_cache_evicts_and_reuses_blocks_between_passes(tiny):
    """A cache of 24 blocks: pass B evicts most of pass A's cached blocks, A again hits what
    is left; tokens never change, and evicted blocks come back un-hashed."""
    rng = random.Random(2)
    a = _random_prompts(rng, [40, 45, 50, 70])
    b = _random_prompts(rng, [60, 61, 62])
    ref_llm = LLM(tiny, num_kv_blocks=256, enable_prefix_caching=False)
    ref_a = tokens_of(ref_llm.generate(a, greedy(10), use_tqdm=False))
    ref_b = tokens_of(ref_llm.generate(b, greedy(10), use_tqdm=False))

    llm = LLM(tiny, num_kv_blocks=24, max_num_batched_tokens=256)
    pool = llm.llm_engine.kv_manager.pool
    assert tokens_of(llm.generate(a, greedy(10), use_tqdm=False)) == ref_a
    assert pool.num_evictable_blocks > 0 and pool.num_evictions == 0
    assert_clean(llm)
    assert tokens_of(llm.generate(b, greedy(10), use_tqdm=False)) == ref_b
    assert pool.num_evictions > 0
    assert_clean(llm)
    hits = llm.stats()["prefix_cache_hits"]
    for _ in range(2):
        assert tokens_of(llm.generate(a, greedy(10), use_tqdm=False)) == ref_a
        assert_clean(llm)
    assert llm.stats()["prefix_cache_hits"] > hits
    assert sum(len(h) for h in pool.cached_blocks.values()) == pool.num_evictable_blocks


def test_cached_prefix_is_never_another_prompts(tiny):
    """Prompts that share blocks of tokens at different positions, or differ only in a block's
    last token, never hit each other's blocks (the hash chains the parent)."""
    rng = random.Random(3)
    x, y = _random_prompts(rng, [16, 16])
    prompts = [x + y + x[:5], y + x + x[:5], x + y[:15] + [7] + x[:5], x + y + x[:5] + [1]]
    ref = tokens_of(LLM(tiny, num_kv_blocks=64, enable_prefix_caching=False)
                    .generate(prompts, greedy(8), use_tqdm=False))
    llm = LLM(tiny, num_kv_blocks=64)
    for _ in range(2):
        for p, expected in zip(prompts, ref):
            assert tokens_of(llm.generate([p], greedy(8), use_tqdm=False)) == [expected]
    assert_clean(llm)


def test_stats_blocks_and_fragmentation(tiny):
    """One 20-token request after its prefill: 2 blocks in use, 12 empty slots (37.5 %)."""
    llm = LLM(tiny, num_kv_blocks=10)
    engine = llm.llm_engine
    engine.add_request("r", list(range(20)), greedy(3))
    engine.step()
    s = llm.stats()
    assert (s["num_used_blocks"], s["num_free_blocks"], s["num_cached_blocks"]) == (2, 8, 0)
    assert s["internal_fragmentation_slots"] == 12
    assert s["internal_fragmentation_pct"] == pytest.approx(37.5)
    assert s["ref_count_histogram"] == {1: 2}
    while engine.has_unfinished_requests():
        engine.step()
    s = llm.stats()
    assert (s["num_used_blocks"], s["num_cached_blocks"]) == (0, 1)  # the full block stays cached
    assert s["ref_count_histogram"] == {}
    assert_clean(llm)


def test_bench_memory_counts_blocks_through_the_manager(tmp_path):
    """`pagedrt bench memory`: paged <= contiguous, sharing < paged, exact block counts for
    the sharing rows, a PNG and a BENCHMARKS.md section that replaces only itself."""
    import json

    from pagedrt.bench import memory

    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n## Other\n\nkeep me\n")
    for _ in range(2):  # the second run replaces the section instead of appending it
        assert memory.main(["--out", str(tmp_path), "--benchmarks-md", str(md)]) == 0
    text = md.read_text()
    assert text.count("## KV memory efficiency") == 1 and "keep me" in text
    assert (tmp_path / "memory.png").stat().st_size > 0
    doc = json.loads((tmp_path / "memory.json").read_text())
    rows = {r["scenario"]: r for r in doc["shapes"]["smollm2-135m"]}
    for r in rows.values():
        assert r["paged_blocks"] * BS >= r["num_tokens"]
        assert r["paged_bytes"] < r["contiguous_bytes"]
    system = rows["8 requests, shared system prompt"]
    assert system["shared_blocks"] == 1024 // BS + 8 * (128 + 256) // BS  # 64 shared + 8 x 24
    samples = rows["n = 8 samples of one prompt"]
    # 62 full prompt blocks shared; each sample: its copy of the partial block (8 prompt
    # tokens) plus 256 generated tokens = 264 tokens = 17 blocks
    assert samples["shared_blocks"] == 62 + 8 * 17
    assert samples["paged_blocks"] == 8 * -(-(1000 + 256) // BS)
