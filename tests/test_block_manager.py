"""KV block manager: deterministic unit tests with exact block ids, plus a hypothesis state
machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedrt.core.beam import assign_slots
from pagedrt.engine.request import Request
from pagedrt.kv.block_pool import NULL_BLOCK, BlockPool, hash_block_tokens
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=8))


def admit(kv: KVCacheManager, req: Request):
    hits, n_hit = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - req.num_computed_tokens - n_hit, hits)
    if new is not None:
        req.num_computed_tokens = req.num_tokens
    return new, n_hit


def test_allocate_append_free_exact_ids():
    kv = KVCacheManager(num_blocks=6, block_size=BS, enable_caching=False)
    a = make_request("a", list(range(6)))  # 6 tokens -> 2 blocks
    assert admit(kv, a)[0] is not None
    assert kv.block_ids("a") == [0, 1]
    a.output_token_ids.append(99)  # 7th token fits in block 1
    assert kv.allocate_slots(a, 1) == []
    a.num_computed_tokens += 1
    a.output_token_ids.append(98)  # 8th token still block 1
    assert kv.allocate_slots(a, 1) == []
    a.num_computed_tokens += 1
    a.output_token_ids.append(97)  # 9th token needs a third block
    assert [b.block_id for b in kv.allocate_slots(a, 1)] == [2]
    assert kv.num_free_blocks == 3
    kv.free(a)
    assert kv.num_free_blocks == 6
    kv.check_integrity()


def test_shortage_returns_none_and_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=BS, enable_caching=False)
    a = make_request("a", list(range(9)))  # needs 3 blocks
    assert kv.allocate_slots(a, 9) is None
    assert kv.num_free_blocks == 2 and "a" not in kv.req_to_blocks
    kv.check_integrity()


def test_prefix_hit_and_last_token_always_computed():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    a = make_request("a", list(range(8)))  # exactly 2 full blocks
    admit(kv, a)
    b = make_request("b", list(range(8)))
    hits, n_hit = kv.get_computed_blocks(b)
    # every block hits, but the last token must still be computed: only 1 block is reused
    assert n_hit == 4 and [h.block_id for h in hits] == kv.block_ids("a")[:1]
    c = make_request("c", list(range(10)))
    hits, n_hit = kv.get_computed_blocks(c)
    assert n_hit == 8 and [h.block_id for h in hits] == kv.block_ids("a")
    kv.allocate_slots(c, 2, hits)
    assert c.num_computed_tokens == 0  # the scheduler counts the hits, not the KV manager
    assert kv.block_ids("c")[:2] == kv.block_ids("a")
    assert [kv.pool.blocks[i].ref_cnt for i in kv.block_ids("a")] == [2, 2]
    kv.check_integrity()


def test_lru_eviction_order_and_unhash_on_reuse():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a = make_request("a", list(range(8)))  # blocks 0, 1
    admit(kv, a)
    kv.free(a)  # freed tail first: queue is 2, 3, 1, 0
    assert kv.pool.num_evictable_blocks == 2
    b = make_request("b", [50 + i for i in range(12)])  # needs 3 blocks: 2, 3, then evicts 1
    admit(kv, b)
    assert kv.block_ids("b") == [2, 3, 1]
    assert kv.pool.blocks[1].block_hash != hash_block_tokens(
        hash_block_tokens(None, (0, 1, 2, 3)), (4, 5, 6, 7))
    assert kv.pool.num_evictions == 1
    # block 0 (a's first block) is still cached and hits
    c = make_request("c", list(range(5)))
    assert kv.get_computed_blocks(c)[1] == 4
    kv.check_integrity()


def test_free_blocks_are_used_before_cached_ones_are_evicted():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a = make_request("a", list(range(6)))  # block 0 full (cached), block 1 partial
    admit(kv, a)
    kv.free(a)  # block 1 (uncached) and block 0 (cached) both return
    assert kv.pool.evictable_block_ids() == [0]
    b = make_request("b", [50 + i for i in range(12)])  # 3 blocks: the free 2, 3, 1 first
    admit(kv, b)
    assert kv.block_ids("b") == [2, 3, 1] and kv.pool.num_evictions == 0
    assert kv.get_computed_blocks(make_request("c", list(range(5))))[1] == 4
    kv.check_integrity()


def test_duplicate_copies_of_a_block_stay_cached():
    """Two requests computed the same full block before either was cached (the recomputed
    last block of a full hit): evicting one copy keeps the prefix cached in the other."""
    kv = KVCacheManager(num_blocks=6, block_size=BS)
    a = make_request("a", list(range(8)))
    admit(kv, a)
    b = make_request("b", list(range(8)))  # hits block 0 only; computes its own second block
    admit(kv, b)
    (second_a, second_b) = (kv.block_ids("a")[1], kv.block_ids("b")[1])
    assert second_a != second_b
    assert len(kv.pool.cached_blocks[kv.pool.blocks[second_a].block_hash]) == 2
    kv.free(a)
    kv.free(b)
    # 4 blocks: the 3 free ones first, then the least recently used cached one: a's copy
    assert kv.pool.evictable_block_ids() == [second_a, second_b, 0]
    c = make_request("c", [90 + i for i in range(16)])
    admit(kv, c)
    assert kv.pool.num_evictions == 1 and second_a in kv.block_ids("c")
    d = make_request("d", list(range(9)))
    assert kv.get_computed_blocks(d)[1] == 8  # both blocks still hit
    kv.check_integrity()


def test_hash_chain_depends_on_parent_and_extra_keys():
    h1 = hash_block_tokens(None, (1, 2, 3, 4))
    assert hash_block_tokens(h1, (5, 6, 7, 8)) != hash_block_tokens(None, (5, 6, 7, 8))
    assert hash_block_tokens(None, (1, 2, 3, 4), ("salt",)) != h1


def test_fork_and_copy_on_write_of_partial_block():
    kv = KVCacheManager(num_blocks=6, block_size=BS)
    parent = make_request("p", list(range(6)))  # block 0 full, block 1 holds 2 tokens
    admit(kv, parent)
    child = make_request("c", list(range(6)))
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens  # as the scheduler does
    shared = kv.block_ids("p")
    assert kv.block_ids("c") == shared and kv.pool.blocks[shared[1]].ref_cnt == 2
    # the plan's block changes: the parent's admission; none for the fork (the device side
    # copies the parent's table)
    assert kv.take_block_changes() == {"p": (0, shared)}
    parent.output_token_ids.append(100)
    kv.allocate_slots(parent, 1)  # writes into the shared partial block -> copy
    pending = kv.take_pending_copies()
    assert len(pending.copy) == 1 and pending.copy[0][0] == shared[1]
    new_last = pending.copy[0][1]
    assert kv.block_ids("p") == [shared[0], new_last]
    assert kv.take_block_changes() == {"p": (1, [new_last])}  # the copy replaces entry 1
    assert kv.pool.blocks[shared[1]].ref_cnt == 1  # now private to the child
    child.output_token_ids.append(200)
    kv.allocate_slots(child, 1)  # sole owner: writes in place, no copy
    assert not kv.take_pending_copies().copy
    assert kv.block_ids("c") == shared
    assert kv.take_block_changes() == {}
    kv.check_integrity()
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 6
    kv.check_integrity()


def test_swap_out_and_in():
    kv = KVCacheManager(num_blocks=4, block_size=BS, num_cpu_blocks=3)
    a = make_request("a", list(range(10)))  # 3 blocks
    admit(kv, a)
    gpu_ids = kv.block_ids("a")
    assert kv.swap_out(a)
    pending = kv.take_pending_copies()
    assert [g for g, _ in pending.swap_out] == gpu_ids
    assert kv.num_free_cpu_blocks == 0 and "a" not in kv.req_to_blocks
    kv.check_integrity()
    b = make_request("b", list(range(100, 105)))  # 2 blocks
    admit(kv, b)
    assert kv.swap_out(b) is False  # the CPU pool is full: nothing changes
    assert kv.block_ids("b") and not kv.take_pending_copies()
    assert not kv.can_swap_in(a, 1)  # a needs 3 blocks, b holds 2 of 4
    kv.free(b)
    assert kv.can_swap_in(a, 1)
    kv.swap_in(a)
    pending = kv.take_pending_copies()
    assert len(pending.swap_in) == 3 and kv.num_free_cpu_blocks == 3
    kv.check_integrity()
    kv.free(a)
    assert kv.num_free_blocks == 4


def test_pool_rejects_bad_size():
    with pytest.raises(ValueError, match="num_blocks=0"):
        BlockPool(0)


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / free / swap / cache hit / evict sequences, and beam
    searches (fork into W slots, then steps that prune beams and re-parent slots), keep every
    invariant. A shadow of the cache contents checks that every live request reads its own
    KV: a prefix hit never returns another prefix's KV, a fork never sees its sibling's
    writes, and a re-parented beam slot reads its parent's history. The KV of position p
    depends on every token up to p, so the shadow slot holds the whole prefix tokens[:p + 1];
    copy-on-write, swaps and a beam's partial-block copy copy shadow blocks as the device
    would.

    With WINDOW set (a model whose every layer has that sliding window), the manager gives
    back blocks as windows move: each request must still read its own tokens over the window
    of its next token, the entries before it are released (NULL_BLOCK), and a cache hit is
    promised only while the holder still has the blocks inside the hit's window."""

    WINDOW: int | None = None

    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(num_blocks=12, block_size=BS, num_cpu_blocks=6,
                                 sliding_window=self.WINDOW)
        self.live: dict[str, Request] = {}
        self.swapped: dict[str, Request] = {}
        self.history: list[list[int]] = []  # prompts seen so far, for cache-hit rules
        self.slots: dict[int, list] = {}  # device block id -> per slot, the prefix it encodes
        self.cpu_slots: dict[int, list] = {}
        self.kv_of_hash: dict[bytes, tuple] = {}
        self.device_tables: dict[str, list[int]] = {}  # as the device side rebuilds them
        self.counter = 0
        self.unique = 1000  # token ids that no other prompt uses
        # beam searches: slots in slot order, and the length they were forked at
        self.beams: list[tuple[list[Request], int]] = []
        self.in_beam: set[str] = set()

    def _new_id(self) -> str:
        self.counter += 1
        return f"r{self.counter}"

    # ----------------------------------------------------------------- shadow device
    def _apply_pending(self) -> None:
        pending = self.kv.take_pending_copies()
        for g, c in pending.swap_out:
            self.cpu_slots[c] = list(self.slots.get(g, [None] * BS))
        for src, dst in pending.copy:
            self.slots[dst] = list(self.slots.get(src, [None] * BS))
        for c, g in pending.swap_in:
            self.slots[g] = list(self.cpu_slots[c])

    def _write(self, req: Request, start: int, end: int) -> None:
        """The forward of tokens [start, end) of `req`: each token lands in its slot."""
        self._apply_pending()
        ids = self.kv.block_ids(req.request_id)
        tokens = req.all_token_ids
        for pos in range(start, end):
            block = self.slots.setdefault(ids[pos // BS], [None] * BS)
            block[pos % BS] = tuple(tokens[: pos + 1])

    def _singles(self) -> list[Request]:
        """Live requests outside beam searches (a search's slots move only together)."""
        return sorted((r for r in self.live.values() if r.request_id not in self.in_beam),
                      key=lambda r: r.request_id)

    def _admit(self, tokens: list[int]) -> tuple[Request | None, int]:
        req = make_request(self._new_id(), tokens)
        hits, n_hit = self.kv.get_computed_blocks(req)
        new = self.kv.allocate_slots(req, req.num_tokens - n_hit, hits)
        if new is None:
            assert req.request_id not in self.kv.req_to_blocks
            return None, n_hit
        assert req.num_computed_tokens == 0  # the scheduler counts the hits
        self.device_tables[req.request_id] = []  # a new row: the change gives the whole table
        self._mirror_changes()
        self._write(req, n_hit, req.num_tokens)
        req.num_computed_tokens = req.num_tokens
        self.live[req.request_id] = req
        self.history.append(tokens)
        return req, n_hit

    # ----------------------------------------------------------------- rules
    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def allocate(self, prefix, tail):
        self._admit(prefix + tail)

    @precondition(lambda self: self.history)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 3), max_size=5))
    def cache_hit(self, data, extra):
        """Re-send an earlier prompt (maybe extended): while a live request still holds that
        prompt, all its full blocks but the one with the last token must hit."""
        old = data.draw(st.sampled_from(self.history))
        tokens = old + extra
        holder = next((r for r in self.live.values()
                       if r.all_token_ids[: len(old)] == old
                       and r.num_computed_tokens >= len(old)), None)
        expected = min(len(old) // BS, (len(tokens) - 1) // BS) * BS
        if holder is not None and self.WINDOW is not None:
            # the hit needs the blocks in the window of its next token; the holder may have
            # given some back already (they are then cached only until evicted)
            first_needed = max(expected - self.WINDOW + 1, 0) // BS
            if self.kv.num_released_blocks(holder.request_id) > first_needed:
                holder = None
        _req, n_hit = self._admit(tokens)
        if holder is not None:
            assert n_hit >= expected, f"hit {n_hit} tokens of {tokens}, expected >= {expected}"

    @rule(num_blocks=st.integers(1, 12))
    def evict(self, num_blocks):
        """A prompt of fresh tokens needing `num_blocks` blocks: when that exceeds the free
        (uncached) blocks, cached ones are evicted, least recently used first, and un-hashed."""
        pool = self.kv.pool
        evictable_before = pool.evictable_block_ids()  # LRU first
        num_uncached = pool.num_free_blocks - len(evictable_before)
        evictions_before = pool.num_evictions
        tokens = list(range(self.unique, self.unique + num_blocks * BS))
        self.unique += num_blocks * BS
        req, _ = self._admit(tokens)
        if req is None:
            assert num_blocks > len(evictable_before) + num_uncached
            return
        num_evicted = max(0, num_blocks - num_uncached)  # free blocks go first
        assert pool.num_evictions - evictions_before == num_evicted
        reused = set(self.kv.block_ids(req.request_id))
        for i in evictable_before[:num_evicted]:
            assert i in reused, f"block {i} should have been evicted first"
        for i in evictable_before[num_evicted:]:
            assert pool.blocks[i].block_hash is not None, f"block {i} evicted out of LRU order"

    @precondition(lambda self: self._singles())
    @rule(data=st.data(), token=st.integers(0, 3))
    def append(self, data, token):
        req = data.draw(st.sampled_from(self._singles()))
        req.output_token_ids.append(token)
        if self.kv.allocate_slots(req, 1) is not None:
            self._write(req, req.num_computed_tokens, req.num_computed_tokens + 1)
            req.num_computed_tokens += 1
        else:
            req.output_token_ids.pop()
            assert not self.kv.pending.copy

    @precondition(lambda self: self._singles())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self._singles()))
        child = make_request(self._new_id(), parent.prompt_token_ids)
        child.output_token_ids = list(parent.output_token_ids)
        self.kv.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens  # as the scheduler does
        self._mirror_changes()  # the parent's changes first, then its table is copied
        self.device_tables[child.request_id] = list(self.device_tables[parent.request_id])
        self.live[child.request_id] = child

    @precondition(lambda self: self._singles())
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(self._singles())).request_id
        self.kv.free(self.live.pop(rid))
        del self.device_tables[rid]

    @precondition(lambda self: self._singles())
    @rule(data=st.data())
    def swap_out(self, data):
        rid = data.draw(st.sampled_from(self._singles())).request_id
        if self.kv.swap_out(self.live[rid]):
            self.swapped[rid] = self.live.pop(rid)
            del self.device_tables[rid]
        self._apply_pending()

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        rid = data.draw(st.sampled_from(sorted(self.swapped)))
        req = self.swapped[rid]
        if self.kv.can_swap_in(req, 1):
            self.kv.swap_in(req)
            self.live[rid] = self.swapped.pop(rid)
            self.device_tables[rid] = []  # a new row: the change gives the whole table
        self._apply_pending()

    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def admit_then_undo(self, prefix, tail):
        """An admission undone before its KV is computed (a beam search that does not fit
        whole): the blocks hashed at allocation lose their hashes (the cache invariant below
        would see them holding no KV) and every reference goes back."""
        req = make_request(self._new_id(), prefix + tail)
        hits, n_hit = self.kv.get_computed_blocks(req)
        free_before = self.kv.num_free_blocks
        if self.kv.allocate_slots(req, req.num_tokens - n_hit, hits) is None:
            return
        self.kv.unallocate(req, n_hit // BS)
        assert self.kv.num_free_blocks == free_before
        assert req.request_id not in self.kv.take_block_changes()

    # ----------------------------------------------------------------- beam search
    @precondition(lambda self: self._singles())
    @rule(data=st.data(), width=st.integers(2, 4))
    def beam_fork(self, data, width):
        """A request becomes slot 0 of a beam search of `width` slots sharing its blocks."""
        parent = data.draw(st.sampled_from(self._singles()))
        slots = [parent]
        for _ in range(width - 1):
            child = make_request(self._new_id(), parent.prompt_token_ids)
            child.output_token_ids = list(parent.output_token_ids)
            self.kv.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            self._mirror_changes()
            self.device_tables[child.request_id] = list(self.device_tables[parent.request_id])
            self.live[child.request_id] = child
            slots.append(child)
        self.beams.append((slots, parent.num_tokens))
        self.in_beam.update(s.request_id for s in slots)

    @precondition(lambda self: self.beams)
    @rule(data=st.data(), num_steps=st.integers(1, 6))
    def beam_steps(self, data, num_steps):
        slots, _ = data.draw(st.sampled_from(self.beams))
        for _ in range(num_steps):
            if not self._beam_step(data, slots):
                break

    def _beam_step(self, data, slots: list[Request]) -> bool:
        """One expansion: each new beam (best first) has a parent slot and a token; a parent's
        first child keeps its slot, the others take pruned beams' slots (assign_slots). As
        the engine does: the device copies the partial last block of a moved slot from its
        parent's; the KV manager re-parents the tables (pruned blocks freed); then every slot
        computes its new token, with room made for all of them first. False: no room."""
        width = len(slots)
        parents = data.draw(st.lists(st.integers(0, width - 1), min_size=width,
                                     max_size=width))
        tokens = data.draw(st.lists(st.integers(0, 3), min_size=width, max_size=width))
        placed = assign_slots(parents)
        slot_parent, slot_token = [0] * width, [0] * width
        for rank, slot in enumerate(placed):
            slot_parent[slot], slot_token[slot] = parents[rank], tokens[rank]
        length = slots[0].num_tokens
        assert all(s.num_tokens == s.num_computed_tokens == length for s in slots)
        # room for the new tokens first: the engine never starts a step it cannot finish
        # (the tables after re-parenting decide the copy-on-writes; a pruned beam's blocks
        # come back first, so re-parenting never takes room)
        self._apply_pending()
        num_blocks = length // BS
        tables = [self.kv.block_ids(s.request_id) for s in slots]
        if length % BS:  # the device's copy, gather-first (a source is never a target)
            contents = {s: list(self.slots.get(tables[slot_parent[s]][num_blocks],
                                               [None] * BS))
                        for s in range(width) if slot_parent[s] != s}
        outputs = [list(s.output_token_ids) for s in slots]
        for s, slot in enumerate(slots):
            slot.output_token_ids = outputs[slot_parent[s]] + [slot_token[s]]
        free_before = self.kv.num_free_blocks
        assert all(p == s or slot_parent[p] == p for s, p in enumerate(slot_parent))
        self.kv.reparent_slots([(slots[s].request_id, slots[p].request_id, num_blocks)
                                for s, p in enumerate(slot_parent) if p != s])
        assert self.kv.num_free_blocks >= free_before
        if length % BS:
            for s, content in contents.items():
                self.slots[tables[s][num_blocks]] = content
        for s in range(width):
            if slot_parent[s] != s:
                rid = slots[s].request_id
                self.device_tables[rid] = (self.device_tables[slots[slot_parent[s]].request_id]
                                           [:num_blocks] + self.device_tables[rid][num_blocks:])
        need = self.kv.num_blocks_to_allocate(slots, [1] * width)
        if need > self.kv.num_free_blocks:  # no room: the slots wait (the engine would preempt)
            for slot in slots:
                slot.output_token_ids.pop()
            # re-parented tables stay: they hold the histories now in the slots
            return False
        free_before = self.kv.num_free_blocks
        for slot in slots:
            allocated = self.kv.allocate_slots(slot, 1)
            assert allocated is not None
            self._write(slot, length, length + 1)
            slot.num_computed_tokens = length + 1
        taken = free_before - self.kv.num_free_blocks
        # exact; with a window an upper bound (allocation first gives back blocks it left)
        assert taken == need if self.WINDOW is None else taken <= need
        # the invariants after every step, not only after the rule: a block hashed with a
        # slot's history must be seen while that history is the slot's
        self.every_request_reads_its_own_tokens()
        self.block_changes_rebuild_the_tables()
        self.cached_blocks_hold_their_tokens()
        return True

    @precondition(lambda self: self.beams)
    @rule(data=st.data())
    def beam_end(self, data):
        entry = data.draw(st.sampled_from(self.beams))
        self.beams.remove(entry)
        for slot in entry[0]:
            self.kv.free(self.live.pop(slot.request_id))
            del self.device_tables[slot.request_id]
            self.in_beam.discard(slot.request_id)

    # ----------------------------------------------------------------- invariants
    @invariant()
    def beam_memory_bound(self):
        """A search holds at most the full blocks it was forked with plus W x (blocks of its
        generated tail + 1)."""
        for slots, forked_at in self.beams:
            held = {b for s in slots for b in self.kv.block_ids(s.request_id)}
            generated = slots[0].num_tokens - forked_at
            limit = forked_at // BS + len(slots) * (-(-generated // BS) + 1)
            assert len(held) <= limit, (held, limit)

    @invariant()
    def integrity(self):
        self.kv.check_integrity()
        for req in self.live.values():
            assert len(self.kv.req_to_blocks[req.request_id]) >= self.kv.blocks_for(
                req.num_computed_tokens)

    def _mirror_changes(self) -> None:
        """Apply take_block_changes() to the mirror of the device side's block tables."""
        for rid, (start, ids) in self.kv.take_block_changes().items():
            assert rid in self.device_tables, f"a change {start, ids} for {rid} without a row"
            assert start <= len(self.device_tables[rid]), (rid, start, self.device_tables[rid])
            self.device_tables[rid] = self.device_tables[rid][:start] + ids

    @invariant()
    def block_changes_rebuild_the_tables(self):
        """The tables the device side rebuilds from take_block_changes() (a fork copying the
        parent's, a swap-in or admission starting over) equal the KV manager's, across
        appends, copy-on-write, swaps and frees."""
        self._mirror_changes()
        for rid in self.live:
            released = self.kv.num_released_blocks(rid)  # stale on the device: never read
            assert self.device_tables[rid][released:] == self.kv.block_ids(rid)[released:], (
                rid, self.device_tables[rid], self.kv.block_ids(rid))

    @invariant()
    def every_request_reads_its_own_tokens(self):
        """Over every computed position, or with a window over that of the next token (the
        entries before it released)."""
        for req in self.live.values():
            ids = self.kv.block_ids(req.request_id)
            tokens = req.all_token_ids
            first = 0
            if self.WINDOW is not None:
                first = max(req.num_computed_tokens - self.WINDOW + 1, 0)
                table = self.kv.req_to_blocks[req.request_id]
                released = self.kv.num_released_blocks(req.request_id)
                assert released <= first // BS, (req.request_id, released, first)
                assert all(b is NULL_BLOCK for b in table[:released])
            for p in range(first, req.num_computed_tokens):
                seen = self.slots.get(ids[p // BS], [None] * BS)[p % BS]
                assert seen == tuple(tokens[: p + 1]), (
                    f"{req.request_id} position {p} reads the KV of {seen}, its tokens are "
                    f"{tokens}")

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        """A hashed block's slots hold the KV of the prefix its chained hash was computed from."""
        for req in self.live.values():  # record hash -> block tokens while requests are live
            parent = None
            tokens = req.all_token_ids
            for i in range(req.num_computed_tokens // BS):
                block_tokens = tuple(tokens[i * BS:(i + 1) * BS])
                parent = hash_block_tokens(parent, block_tokens)
                self.kv_of_hash[parent] = tuple(
                    tuple(tokens[: j + 1]) for j in range(i * BS, (i + 1) * BS))
        for block_hash, holders in self.kv.pool.cached_blocks.items():
            for block in holders.values():
                content = tuple(self.slots.get(block.block_id, ()))
                assert content == self.kv_of_hash[block_hash], (
                    f"{block} holds {content}, its hash is of {self.kv_of_hash[block_hash]}")

    def teardown(self):
        for req in list(self.live.values()) + list(self.swapped.values()):
            self.kv.free(req)
        self.kv.check_integrity()
        pool = self.kv.pool
        assert all(b.ref_cnt == 0 for b in pool.blocks), "a block is still in use after teardown"
        assert pool.num_free_blocks == pool.num_blocks  # every block free or cached-evictable
        assert self.kv.num_free_cpu_blocks == self.kv.num_cpu_blocks


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


class WindowedBlockManagerMachine(BlockManagerMachine):
    """The same rules for a model whose every layer has a 6-token window (blocks of 4: the
    window ends mid-block)."""

    WINDOW = 6


TestWindowedBlockManagerMachine = WindowedBlockManagerMachine.TestCase
TestWindowedBlockManagerMachine.settings = settings(max_examples=60, stateful_step_count=40,
                                                    deadline=None)
