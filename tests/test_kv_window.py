"""The KV manager with a sliding window: exact block ids as the window moves, what the prefix
cache keeps, forks and swaps; then end to end on a tiny windowed model, prefix caching and
preemption give the same greedy tokens and leave every block free.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from tiny_model import TINY_CONFIG, build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.engine.request import Request
from pagedrt.kv.block_pool import NULL_BLOCK, hash_block_tokens
from pagedrt.kv.kv_cache_manager import KVCacheManager

BS, WINDOW = 4, 6  # the window ends mid-block


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=64))


def held(kv: KVCacheManager, rid: str) -> list[int]:
    """Ids of the blocks the request still holds (after its released entries)."""
    table = kv.req_to_blocks[rid]
    released = kv.num_released_blocks(rid)
    assert all(b is NULL_BLOCK for b in table[:released])
    return [b.block_id for b in table[released:]]


def admit(kv: KVCacheManager, req: Request) -> int:
    hits, n_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - n_hit, hits) is not None
    req.num_computed_tokens = req.num_tokens
    return n_hit


def decode(kv: KVCacheManager, req: Request, token: int = 7) -> None:
    req.output_token_ids.append(token)
    assert kv.allocate_slots(req, 1) is not None
    req.num_computed_tokens += 1


def test_blocks_return_to_the_pool_as_the_window_moves():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_caching=False,
                        sliding_window=WINDOW)
    a = make_request("a", list(range(10)))  # blocks 0, 1, 2
    admit(kv, a)
    assert held(kv, "a") == [0, 1, 2]  # the prefill's queries needed all of them
    # the next query (position 10) sees 5 .. 10: block 0 (0 .. 3) is given back
    decode(kv, a)
    assert held(kv, "a") == [1, 2] and kv.num_released_blocks("a") == 1
    assert kv.num_free_blocks == 6
    decode(kv, a)  # position 11 sees 6 .. 11: still blocks 1, 2
    assert held(kv, "a") == [1, 2]
    decode(kv, a)  # position 12 sees 7 .. 12: a new block (free queue 3 .. 7, then 0)
    assert held(kv, "a") == [1, 2, 3]
    decode(kv, a)  # position 13 sees 8 .. 13: block 1 (4 .. 7) goes
    assert held(kv, "a") == [2, 3] and kv.num_released_blocks("a") == 2
    assert kv.block_ids("a") == [NULL_BLOCK.block_id] * 2 + [2, 3]
    for _ in range(20):  # a long decode never holds more than the window's blocks + 1
        decode(kv, a)
        assert len(held(kv, "a")) <= -(-WINDOW // BS) + 1
        kv.check_integrity()
    kv.free(a)
    assert kv.num_free_blocks == 8
    kv.check_integrity()


def test_released_blocks_stay_cached_and_a_hit_needs_only_the_window():
    """Blocks that left the window keep their hash (evictable, oldest first). A later prompt
    with the same prefix hits even after the blocks before its window were evicted: those
    come back as NULL_BLOCK, the window's blocks as the cached ones."""
    kv = KVCacheManager(num_blocks=10, block_size=BS, sliding_window=WINDOW)
    prompt = list(range(100, 116))  # 4 full blocks: 0 .. 3
    a = make_request("a", prompt)
    admit(kv, a)
    decode(kv, a)  # position 16 sees 11 .. 16: blocks 0 and 1 go, cached
    assert held(kv, "a") == [2, 3, 4]
    assert kv.pool.evictable_block_ids() == [0, 1]
    assert all(kv.pool.blocks[i].block_hash is not None for i in (0, 1))
    kv.free(a)  # block 4 (one token) is not cached; 3 and 2 join the evictable queue
    assert kv.pool.evictable_block_ids() == [0, 1, 3, 2]
    evictor = make_request("e", list(range(500, 532)))  # 8 blocks: 6 free ones, evicts 0, 1
    admit(kv, evictor)
    assert kv.pool.num_evictions == 2 and kv.pool.evictable_block_ids() == [3, 2]
    kv.free(evictor)
    b = make_request("b", prompt + [9])
    hits, n_hit = kv.get_computed_blocks(b)
    # the first new token (position 16) sees 11 .. 16: blocks 2 and 3 suffice
    assert n_hit == 16 and hits[:2] == [NULL_BLOCK] * 2
    assert [h.block_id for h in hits[2:]] == [2, 3]
    assert kv.allocate_slots(b, 1, hits) is not None
    assert held(kv, "b")[:2] == [2, 3] and kv.num_released_blocks("b") == 2
    assert kv.stats.prefix_cache_hits == 16
    kv.check_integrity()
    # full attention would have needed block 0 too, which is gone: no hit at all
    assert kv.pool.get_cached_block(hash_block_tokens(None, prompt[:BS])) is None
    kv.free(b)
    assert kv.num_free_blocks == 10
    kv.check_integrity()


def test_fork_and_swap_keep_released_entries_released():
    kv = KVCacheManager(num_blocks=10, block_size=BS, enable_caching=False, num_cpu_blocks=4,
                        sliding_window=WINDOW)
    parent = make_request("p", list(range(14)))  # blocks 0 .. 3, the last with 2 tokens
    admit(kv, parent)
    decode(kv, parent)  # position 14 sees 9 .. 14: blocks 0, 1 go
    assert held(kv, "p") == [2, 3]
    child = make_request("c", list(range(14)))
    child.output_token_ids = list(parent.output_token_ids)
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens
    assert kv.num_released_blocks("c") == 2 and held(kv, "c") == [2, 3]
    assert [kv.pool.blocks[i].ref_cnt for i in (2, 3)] == [2, 2]
    decode(kv, child, 9)  # writes into the shared partial block 3: copy-on-write
    assert kv.take_pending_copies().copy == [(3, held(kv, "c")[-1])]
    for _ in range(4):  # both move on: block 2 (8 .. 11) leaves both windows
        decode(kv, parent)
        decode(kv, child)
    assert kv.pool.blocks[2].ref_cnt == 0 and 2 not in held(kv, "p") + held(kv, "c")
    kv.check_integrity()
    # swap the child out and back: only the blocks it holds travel
    kept = held(kv, "c")
    assert kv.swap_out(child)
    assert [g for g, _ in kv.take_pending_copies().swap_out] == kept
    assert kv.can_swap_in(child, 1)
    kv.swap_in(child)
    assert kv.num_released_blocks("c") == 3 and len(held(kv, "c")) == len(kept)
    assert kv.take_block_changes()["c"][0] == 0  # the whole table, released entries as 0
    decode(kv, child)
    kv.check_integrity()
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 10 and kv.num_free_cpu_blocks == 4
    kv.check_integrity()


# --------------------------------------------------------------------------- tiny model
WINDOWED = dataclasses.replace(TINY_CONFIG, architecture="MistralForCausalLM",
                               sliding_window=12, layer_types=("sliding_attention",) * 2)
MIXED = dataclasses.replace(WINDOWED, layer_types=("sliding_attention", "full_attention"))


@pytest.fixture(scope="module", params=[WINDOWED, MIXED], ids=["windowed", "mixed"])
def windowed_model(request):
    return build_tiny_llama(seed=1, config=request.param)


@pytest.fixture(autouse=True)
def _one_thread():
    """The tiny model's matmuls are too small to split over threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def tokens_of(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def assert_clean(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.check_integrity()
    assert not engine.has_unfinished_requests()
    kv = engine.kv_manager
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks), "a block is still in use"
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.num_free_cpu_blocks == kv.num_cpu_blocks


def run_checked(llm: LLM, prompts, params) -> list[list[int]]:
    """Step by step, checking the engine's invariants between steps."""
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        engine.check_integrity()
    return [done[str(i)] for i in range(len(prompts))]


@pytest.mark.usefixtures("scheduling")
def test_prefix_caching_and_preemption_give_the_same_tokens(windowed_model):
    """Prompts longer than the window sharing prefixes that end mid-block: the same greedy
    tokens with prefix caching on (first and second pass), and in a cache too small for the
    batch (recompute and swap preemption); every block free at the end. The all-windowed
    model holds at most the window's blocks per sequence; the mixed one keeps them all."""
    rng = random.Random(4)
    shared = [rng.randrange(384) for _ in range(29)]
    prompts = [shared + [rng.randrange(384) for _ in range(n)] for n in (3, 17, 38)]
    prompts.append([rng.randrange(384) for _ in range(50)])
    params = greedy(20)
    ref_llm = LLM(windowed_model, block_size=8, num_kv_blocks=128, enable_prefix_caching=False)
    ref = tokens_of(ref_llm.generate(prompts, params, use_tqdm=False))
    assert_clean(ref_llm)
    windowed = windowed_model.model_config.kv_sliding_window is not None
    assert ref_llm.llm_engine.kv_manager.sliding_window == (12 if windowed else None)

    llm = LLM(windowed_model, block_size=8, num_kv_blocks=128)
    assert run_checked(llm, prompts, params) == ref
    assert_clean(llm)
    first_hits = llm.stats()["prefix_cache_hits"]
    assert run_checked(llm, prompts, params) == ref  # a second pass: every prompt hits
    assert llm.stats()["prefix_cache_hits"] - first_hits >= sum(
        (len(p) - 1) // 8 * 8 for p in prompts)
    assert_clean(llm)

    for mode in ("recompute", "swap"):
        # the four sequences need 29 blocks of 8 at their longest with full attention; the
        # windowed model holds at most 3 per decoding sequence, so 8 blocks (64 slots, less
        # than the longest sequence) suffice for it; the mixed one needs 11 for that one alone
        small = LLM(windowed_model, block_size=8, num_kv_blocks=8 if windowed else 12,
                    preemption_mode=mode, max_num_batched_tokens=32, swap_space_bytes=1 << 20)
        assert run_checked(small, prompts, params) == ref
        assert sum(small.llm_engine.scheduler.num_preemptions.values()) > 0
        assert_clean(small)


def test_windowed_limits_admit_a_sequence_longer_than_the_cache():
    """With every layer windowed a sequence holds at most window + one step's tokens, so one
    longer than the whole cache is admitted (the validation counts those blocks), and runs."""
    model = build_tiny_llama(seed=1, config=WINDOWED)
    llm = LLM(model, block_size=8, num_kv_blocks=8, max_num_batched_tokens=16)
    assert llm.llm_engine.limits.max_blocks_per_seq == -(-(11 + 16) // 8) + 2
    prompt = list(range(3, 40))  # 37 + 40 tokens: 10 blocks of 8 > 8
    out = llm.generate([prompt], greedy(40), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 40
    assert_clean(llm)
    full = LLM(build_tiny_llama(seed=1), block_size=8, num_kv_blocks=8)
    with pytest.raises(ValueError, match="KV blocks"):
        full.generate([prompt], greedy(40), use_tqdm=False)
