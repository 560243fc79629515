"""KVCacheManager: per-request block tables on top of the BlockPool.

What it does for the scheduler:
  * `get_computed_blocks`: the longest chain of cached full blocks matching a new request's
    tokens (automatic prefix caching), always leaving at least one token to compute;
  * `allocate_slots`: blocks for the next `num_new_tokens` tokens, or None (changing nothing)
    when the pool cannot supply them: the scheduler then preempts or waits;
  * `fork`: share every block of a sequence with a new one (n > 1 samples, beam slots);
  * `reparent_slots`: beam search moves beams between slots: a slot takes its parent's full
    blocks (by reference) and keeps its own partial last block, whose contents the device
    copies; the blocks only the pruned beam held are freed at once (the moved slots of a
    whole step in one call);
  * `num_blocks_to_allocate`: what `allocate_slots` would take for a set of sequences, so the
    scheduler can make room for a beam search's slots before allocating any of them;
  * copy-on-write: a sequence about to write into a partial block that another sequence holds
    too gets a private copy first; the (src, dst) pair is queued for the model runner;
  * `swap_out` / `swap_in`: move a preempted request's blocks to and from the CPU pool;
  * `allocate_decode`: `allocate_slots` for every request of a decode step, visiting only
    those whose call can change anything (one or two steps in block_size per request);
  * `free`: drop a request's references (tail blocks first, so they are evicted first);
  * `trim`: drop the blocks past a request's computed tokens (rejected speculative drafts);
  * sliding window (`sliding_window`, for a model whose every layer is windowed): blocks that
    no later query can see go back to the pool as the window moves, and prefix-cache hits
    need only the blocks inside the window of the first computed token.

Block tables are append-only while a request runs; only copy-on-write replaces the last entry,
`trim` cuts the entries that held only rejected drafts, and a sliding window replaces leading
entries by `NULL_BLOCK`:

    positions:  0 ........................... p - W + 1 ........ p = num_computed_tokens
    table:     [NULL | NULL | ... | NULL | b_k | b_k+1 | ... | b_last]
                given back (no query at p or later sees them)   held

A released block keeps its hash: it goes to the evictable queue, so the prefix cache keeps
serving it until the pool needs the space (oldest first). The device side is not told: its
table keeps the old ids there, which no kernel reads (docs/design.md, "Sliding window").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from pagedrt.core.request import Request
from pagedrt.kv.block_pool import NULL_BLOCK, BlockPool, KVBlock, hash_token_blocks, root_hash


@dataclass
class KVStats:
    prefix_cache_queries: int = 0  # tokens looked up at admission
    prefix_cache_hits: int = 0  # of those, tokens found in the cache
    num_cow_copies: int = 0
    num_swapped_out_blocks: int = 0
    num_swapped_in_blocks: int = 0


@dataclass
class PendingCopies:
    """Block copies the model runner performs before the next forward. `KVCache.apply` runs
    the swap-outs first, then the copy-on-write copies, then the swap-ins (not the order of
    the fields)."""

    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, cpu block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, device block)
    copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) device blocks (COW)

    def __bool__(self) -> bool:
        return bool(self.swap_out or self.swap_in or self.copy)


class KVCacheManager:
    """Block tables, prefix caching, copy-on-write and the CPU swap pool's bookkeeping."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        num_cpu_blocks: int = 0,
        sliding_window: int | None = None,
    ) -> None:
        """sliding_window: the window in tokens when every layer of the model attends within
        one (`ModelConfig.kv_sliding_window`); blocks before it are then given back. None for
        full attention, or when any layer is global."""
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window}; give tokens >= 1 or None")
        self.block_size = block_size
        self.sliding_window = sliding_window
        # request id -> leading entries of its block table given back (NULL_BLOCK now)
        self._num_released: dict[str, int] = {}
        self.pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self._block_hashes: dict[str, list[bytes]] = {}  # hashes of the full blocks of a request
        self._num_cached_blocks: dict[str, int] = {}  # leading blocks already offered to the cache
        # request id -> first index of its block table changed since the last step plan
        self._changed: dict[str, int] = {}
        # request id -> an end (computed + new tokens) below which `allocate_slots` without
        # prefix hits changes nothing (see allocate_decode); dropped by every change of the
        # request's table, hashes or released blocks, recomputed when next asked for
        self._headroom: dict[str, int] = {}
        self.num_cpu_blocks = num_cpu_blocks
        self._free_cpu_blocks = list(range(num_cpu_blocks - 1, -1, -1))
        self.req_to_cpu_blocks: dict[str, list[int]] = {}
        self.pending = PendingCopies()
        self.stats = KVStats()

    # ----------------------------------------------------------------- sizes
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Free plus cached-evictable blocks."""
        return self.pool.num_free_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._free_cpu_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table as ids (NULL_BLOCK's where blocks were given back)."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def num_released_blocks(self, request_id: str) -> int:
        """Leading entries of the request's block table given back by the sliding window."""
        return self._num_released.get(request_id, 0)

    def _release_before_window(self, request_id: str, num_computed: int) -> None:
        """Give back the blocks that hold only positions before the window of the next query
        (position `num_computed`): no query from there on sees them. Oldest first, so the
        prefix cache evicts them first."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        first_needed = max(num_computed - self.sliding_window + 1, 0) // self.block_size
        done = self._num_released.get(request_id, 0)
        end = min(first_needed, len(blocks))
        if end <= done:
            return
        released = blocks[done:end]
        blocks[done:end] = [NULL_BLOCK] * (end - done)
        self._num_released[request_id] = end
        self._headroom.pop(request_id, None)
        self.pool.free_blocks(released)

    def take_block_changes(self) -> dict[str, tuple[int, list[int]]]:
        """The block-table changes since the last call, for the step plan: request id ->
        (start, block ids): from index `start` on, the table is now those ids. Appends give
        the new ids, a copy-on-write the replaced last entry on, a swap-in the whole table.
        Tables freed or swapped out since are left out, and so are forked children's (the
        device side copies the parent's)."""
        changes = {}
        for request_id, start in self._changed.items():
            blocks = self.req_to_blocks[request_id]
            changes[request_id] = (start, [b.block_id for b in blocks[start:]])
        self._changed = {}
        return changes

    @property
    def has_block_changes(self) -> bool:
        """Some block table changed since the last `take_block_changes`."""
        return bool(self._changed)

    def _note_change(self, request_id: str, start: int) -> None:
        self._changed[request_id] = min(self._changed.get(request_id, start), start)

    # ----------------------------------------------------------------- prefix cache
    def _request_block_hashes(self, request: Request, num_full_blocks: int) -> list[bytes]:
        """Hashes of the first `num_full_blocks` full blocks of the request (memoized)."""
        hashes = self._block_hashes.get(request.request_id)
        if hashes is None:
            hashes = self._block_hashes[request.request_id] = []
        num_hashed = len(hashes)
        if num_hashed < num_full_blocks:
            bs = self.block_size
            parent = hashes[-1] if hashes else root_hash(request_extra_keys(request))
            start, end = num_hashed * bs, num_full_blocks * bs
            num_prompt = len(request.prompt_token_ids)
            tokens = (request.output_token_ids[start - num_prompt: end - num_prompt]
                      if start >= num_prompt else request.token_array(start, end))
            hashes += hash_token_blocks(parent, tokens, bs)
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of a request with no KV yet: (blocks, number of tokens).

        At most `num_tokens - 1` tokens hit, so the step still computes the last token and
        produces logits. Changes nothing; `allocate_slots` takes the references.

        With a sliding window, a prefix of k blocks hits when the blocks inside the window of
        its next token (position k * block_size) are cached, whether or not the ones before
        are: those come back as NULL_BLOCK (their tokens count as hit, nothing reads them).
        """
        if not self.enable_caching or request.num_computed_tokens:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._request_block_hashes(request, max_blocks)
        if self.sliding_window is not None:
            return self._window_hits(hashes)
        hits = []
        for block_hash in hashes:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def _window_hits(self, hashes: list[bytes]) -> tuple[list[KVBlock], int]:
        """The longest k with blocks [first_needed(k), k) all cached, where first_needed(k) =
        the first block in the window of position k * block_size; one pass, tracking the run
        of cached blocks that ends at each index."""
        bs, window = self.block_size, self.sliding_window
        found: list[KVBlock | None] = []
        best, run = 0, 0
        for i, block_hash in enumerate(hashes):
            block = self.pool.get_cached_block(block_hash)
            found.append(block)
            run = run + 1 if block is not None else 0
            k = i + 1
            if run >= k - max(k * bs - window + 1, 0) // bs:
                best = k
        first_needed = max(best * bs - window + 1, 0) // bs
        hits = [NULL_BLOCK] * first_needed + found[first_needed:best]
        return hits, best * bs

    # ----------------------------------------------------------------- allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVBlock] | None = None,
    ) -> list[KVBlock] | None:
        """Make room for `num_new_tokens` more tokens after the request's computed ones.

        `new_computed_blocks` (from `get_computed_blocks`, at admission) are taken as cache
        hits: the new tokens come after them (the caller, the scheduler, then counts them in
        `request.num_computed_tokens`; nothing here writes request state). Returns the newly
        allocated blocks, or None when the pool is short, with no state changed.
        """
        assert num_new_tokens >= 1, f"num_new_tokens={num_new_tokens}"
        bs = self.block_size
        if self.sliding_window is not None:  # even when this call then returns None
            self._release_before_window(request.request_id, request.num_computed_tokens)
        blocks = self.req_to_blocks.get(request.request_id, [])
        end = request.num_computed_tokens + num_new_tokens
        if (not new_computed_blocks and end <= len(blocks) * bs
                and (request.num_computed_tokens % bs == 0 or blocks[-1].ref_cnt == 1)):
            # the common decode step: the new tokens fit in the request's own last block
            if self.enable_caching and end // bs > self._num_cached_blocks.get(
                    request.request_id, 0):
                self._cache_full_blocks(request, end)
                self._headroom.pop(request.request_id, None)
            return []
        hits = new_computed_blocks or []
        num_computed = request.num_computed_tokens + len(hits) * self.block_size
        total_blocks = self.blocks_for(num_computed + num_new_tokens)
        num_new_blocks = max(total_blocks - len(blocks) - len(hits), 0)
        cow = bool(blocks) and num_computed % self.block_size != 0 and blocks[-1].ref_cnt > 1
        held_hits = [b for b in hits if b is not NULL_BLOCK]
        num_hits_from_free_queue = sum(1 for b in held_hits if b.ref_cnt == 0)
        if num_new_blocks + cow + num_hits_from_free_queue > self.pool.num_free_blocks:
            return None

        if hits:
            self.stats.prefix_cache_queries += request.num_tokens
            self.stats.prefix_cache_hits += len(hits) * self.block_size
            self.pool.touch(held_hits)
            if len(held_hits) < len(hits):  # a windowed hit: its leading entries are released
                self._num_released[request.request_id] = len(hits) - len(held_hits)
        elif self.enable_caching and request.num_computed_tokens == 0 and not blocks:
            self.stats.prefix_cache_queries += request.num_tokens
        self._headroom.pop(request.request_id, None)
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        first_changed = len(blocks) - cow
        blocks.extend(hits)
        if cow:
            (copy,) = self.pool.get_new_blocks(1)
            shared = blocks[-1]
            self.pool.free_blocks([shared])
            blocks[-1] = copy
            self.pending.copy.append((shared.block_id, copy.block_id))
            self.stats.num_cow_copies += 1
        new_blocks = self.pool.get_new_blocks(num_new_blocks) or []
        blocks.extend(new_blocks)
        if len(blocks) > first_changed:
            self._note_change(request.request_id, first_changed)
        self._cache_full_blocks(request, num_computed + num_new_tokens)
        return new_blocks

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Hash every block that is full of known tokens once `num_tokens` are in the cache."""
        if not self.enable_caching:
            return
        request_id = request.request_id
        # (num_known_tokens spelled out: this runs for every block a decode fills)
        num_known = (len(request.prompt_token_ids) + len(request.output_token_ids)
                     - request.num_pending_tokens)
        num_full = min(num_tokens, num_known) // self.block_size
        start = self._num_cached_blocks.get(request_id, 0)
        if num_full <= start:
            return
        blocks = self.req_to_blocks[request_id][start:num_full]
        hashes = self._request_block_hashes(request, num_full)[start:num_full]
        if NULL_BLOCK in blocks:  # a released block was cached before it left
            pairs = [(b, h) for b, h in zip(blocks, hashes) if b is not NULL_BLOCK]
            blocks, hashes = [b for b, _ in pairs], [h for _, h in pairs]
        self.pool.cache_blocks(blocks, hashes)
        self._num_cached_blocks[request_id] = num_full

    def trim(self, request: Request) -> None:
        """Free the blocks past the request's computed tokens: speculative decoding's rollback
        (`Scheduler.update`), once the scheduler has lowered `num_computed_tokens` by the
        rejected drafts. Their slots in the kept last block are written over by later steps.
        Returns without a change when no block lies past them.

        No freed block is hashed: a block is hashed only once it is full of known tokens
        (`_cache_full_blocks`), and drafts are not known tokens until accepted."""
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        keep = self.blocks_for(request.num_computed_tokens)
        if keep >= len(blocks):
            return
        assert self._num_cached_blocks.get(request.request_id, 0) <= keep, (
            f"{request}: {self._num_cached_blocks[request.request_id]} blocks hashed, "
            f"trimming to {keep}")
        dropped = blocks[keep:]
        del blocks[keep:]
        self._headroom.pop(request.request_id, None)
        self.pool.free_blocks(list(reversed(dropped)))
        self._note_change(request.request_id, keep)

    def cache_computed_blocks(self, request: Request) -> None:
        """Offer the request's blocks full of computed, known tokens to the prefix cache now
        (after a step accepted drafts: several blocks may have filled at once)."""
        self._cache_full_blocks(request, request.num_computed_tokens)
        self._headroom.pop(request.request_id, None)

    def num_blocks_to_allocate(self, requests: list[Request], num_new_tokens: list[int]) -> int:
        """Blocks that `allocate_slots(request, n)` would take for each pair in turn (no prefix
        hits: running sequences), copy-on-write included; changes nothing. With a sliding
        window an upper bound: allocation first gives back the blocks the window left."""
        bs = self.block_size
        need = 0
        refs: dict[int, int] = {}  # ref counts of shared last blocks as the copies go
        for req, num_new in zip(requests, num_new_tokens, strict=True):
            blocks = self.req_to_blocks.get(req.request_id, ())
            need += max(self.blocks_for(req.num_computed_tokens + num_new) - len(blocks), 0)
            if blocks and req.num_computed_tokens % bs:
                last = blocks[-1]
                ref = refs.get(last.block_id, last.ref_cnt)
                if ref > 1:  # a copy-on-write: one block, and one holder less
                    need += 1
                    refs[last.block_id] = ref - 1
        return need

    def allocate_decode(self, requests: list[Request], request_ids: list[str],
                        ends: np.ndarray) -> bool:
        """`allocate_slots(request, 1)` for every request of a decode step, in order, with the
        same result, without a Python call per request: only the requests whose call can
        change anything are visited (a new block: the step's token is past the last slot; a
        copy-on-write: the partial last block is shared; blocks to hash for the prefix cache:
        a block fills; blocks the sliding window gives back): per request one or two steps in
        block_size (a block fills, then the next token needs a new block; with async
        scheduling the fill is hashed a step late, with the new block).

        requests: the step's running requests, each holding blocks; request_ids: their ids;
        ends: [n] int64 each one's computed tokens after the step (`num_computed_tokens` + 1).
        Returns False, having changed nothing, when fewer blocks are free than requests that
        may need one (the caller then allocates one by one, preempting as needed).

        Per request this reads one hint (`_headroom`, made on first use after any change of
        the request's blocks, hashes or released entries; such a change drops it): the end
        from which a call may change something. A hint is conservative: it may name a request
        whose call then changes nothing, never the reverse."""
        n = len(requests)
        headroom = np.fromiter(map(self._headroom.get, request_ids, repeat(-1)), np.int64, n)
        for i in np.flatnonzero(headroom < 0).tolist():
            headroom[i] = self._headroom_of(request_ids[i])
        work = np.flatnonzero(ends >= headroom)
        # one block at most each: a new one (the end passes the last slot, which is then full:
        # no copy) or a copy of a shared partial last block
        if len(work) > self.pool.num_free_blocks:
            return False
        if self.sliding_window is not None or not headroom[work].all():
            # a window gives blocks back between allocations, a copy-on-write frees: one by one
            for i in work.tolist():
                allocated = self.allocate_slots(requests[i], 1)
                assert allocated is not None, f"{requests[i]}: no block, {len(work)} were free"
            return True
        # exclusive last blocks, no window: the new blocks (taken in order, as one call each
        # would), then the blocks that filled are hashed, in order; then each one's hint
        bs = self.block_size
        req_to_blocks = self.req_to_blocks
        work_list, ends_of = work.tolist(), ends[work].tolist()
        grow = []
        for i, end in zip(work_list, ends_of):
            blocks = req_to_blocks[request_ids[i]]
            if end > len(blocks) * bs:
                grow.append((request_ids[i], blocks))
        for (request_id, blocks), block in zip(grow, self.pool.get_new_blocks(len(grow))):
            self._note_change(request_id, len(blocks))
            blocks.append(block)
        hints = self._headroom
        if self.enable_caching:
            num_cached = self._num_cached_blocks
            for i, end in zip(work_list, ends_of):
                self._cache_full_blocks(requests[i], end)
                request_id = request_ids[i]
                hints[request_id] = min(len(req_to_blocks[request_id]) * bs + 1,
                                        (num_cached.get(request_id, 0) + 1) * bs)
        else:
            for i in work_list:
                hints[request_ids[i]] = len(req_to_blocks[request_ids[i]]) * bs + 1
        return True

    def _headroom_of(self, request_id: str) -> int:
        """The least end (computed + new tokens) at which `allocate_slots` (no prefix hits)
        may change anything for this request, from its state now; remembered unless it is 0
        (no blocks, or a last block held by other sequences too, which can change without a
        call for this request)."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks or blocks[-1].ref_cnt > 1:
            return 0
        bs = self.block_size
        bound = len(blocks) * bs + 1  # a token past the last slot needs a new block
        if self.enable_caching:  # the end reaches a block boundary: that block is hashed
            bound = min(bound, (self._num_cached_blocks.get(request_id, 0) + 1) * bs)
        if self.sliding_window is not None:
            # the block after the released ones leaves the window of a computed count of
            # (released + 1) * bs + window - 1, the count before a one-token step to that end
            done = self._num_released.get(request_id, 0)
            bound = min(bound, (done + 1) * bs + self.sliding_window)
        self._headroom[request_id] = bound
        return bound

    def reparent_slots(self, moves: list[tuple[str, str, int]]) -> None:
        """Beam search (docs/design.md, "Beam search"): each moved slot continues its parent's
        beam, for any number of searches: (slot's request id, its parent's, num_blocks) each.
        The slot's first `num_blocks` table entries (the full blocks of the history both share)
        become the parent's, by reference; its entries from `num_blocks` on (its own partial
        block, blocks appended since) stay. Blocks no table holds any more are freed at once,
        tail first. No parent may be a moved slot, so every table read here is
        unchanged while others are written. Only the entries where the two tables differ
        change, in place (the tables share a common ancestor's blocks, and differ after them);
        every block taken is referenced before any released is freed.

        Records no block-table change: the device side re-parents its rows by the same rule.
        The prefix-cache hashes of the shared blocks follow them."""
        tables = self.req_to_blocks
        # the moved slots' hints are stale (re-made on use); their parents' are dropped too, to
        # be safe. A block taken is a full block of a history, never a partial last block
        # that would now be shared, so no other holder's hint changes; a block released may
        # leave a holder's last block exclusive, whose hint (0: visit) is then merely
        # conservative
        hints = self._headroom
        for rid, pid, _ in moves:
            hints.pop(rid, None)
            hints.pop(pid, None)
        window = self.sliding_window is not None
        cached, all_hashes, num_released = (self._num_cached_blocks, self._block_hashes,
                                            self._num_released)
        assert not {rid for rid, _, _ in moves} & {pid for _, pid, _ in moves}, (
            f"a moved slot is a parent: {moves}")
        taken: list[KVBlock] = []
        released: list[KVBlock] = []
        for rid, pid, num_blocks in moves:
            own, src = tables[rid], tables[pid]
            assert len(own) >= num_blocks <= len(src), (
                f"re-parenting {num_blocks} blocks of tables of {len(own)} and {len(src)}")
            assert self._changed.get(rid, num_blocks) >= num_blocks, (
                f"{rid}: a block change from {self._changed[rid]} not yet planned")
            start = num_blocks
            while start and own[start - 1] is not src[start - 1]:
                start -= 1
            if start < num_blocks:
                released += own[num_blocks - 1: start - 1 if start else None: -1]  # tail first
                own[start:num_blocks] = src[start:num_blocks]
                taken += own[start:num_blocks]
            cached[rid] = min(cached.get(pid, 0), num_blocks)
            if pid in num_released:
                num_released[rid] = num_released[pid]
            hashes = all_hashes.get(pid)
            all_hashes[rid] = hashes[:num_blocks] if hashes else []
        if window:  # (entries the sliding window gave back are NULL_BLOCK in both: never here)
            taken = [b for b in taken if b is not NULL_BLOCK]
            released = [b for b in released if b is not NULL_BLOCK]
        self.pool.touch(taken)
        self.pool.free_blocks(released)

    def fork(self, parent: Request, child: Request) -> None:
        """Give `child` the parent's blocks (one more reference each). Records no block-table
        change: the device side copies the parent's table when it forks the row."""
        blocks = self.req_to_blocks[parent.request_id]
        self.pool.touch([b for b in blocks if b is not NULL_BLOCK])
        self._headroom.pop(parent.request_id, None)  # its last block is shared now
        self._headroom.pop(child.request_id, None)
        self.req_to_blocks[child.request_id] = list(blocks)
        self._num_cached_blocks[child.request_id] = self._num_cached_blocks.get(
            parent.request_id, 0)
        if parent.request_id in self._num_released:
            self._num_released[child.request_id] = self._num_released[parent.request_id]

    def unallocate(self, request: Request, num_hit_blocks: int) -> None:
        """Undo an admission made in this plan, before any of its KV was computed: the blocks
        after its first `num_hit_blocks` (prefix hits) hold nothing yet, so the hashes they
        were given at allocation are dropped before the request's blocks are freed. Undo the
        admissions of one plan in reverse order (a later one may hit an earlier one's
        blocks)."""
        for block in self.req_to_blocks.get(request.request_id, ())[num_hit_blocks:]:
            if block.block_hash is not None:
                assert block.ref_cnt == 1, f"{block} is shared; undo later admissions first"
                self.pool.uncache(block)
        self.free(request)

    def free(self, request: Request) -> None:
        """Release all of a request's blocks (device and CPU); idempotent."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._changed.pop(request.request_id, None)
        self._headroom.pop(request.request_id, None)
        self.pool.free_blocks([b for b in reversed(blocks) if b is not NULL_BLOCK])
        self._block_hashes.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        self._num_released.pop(request.request_id, None)
        cpu_blocks = self.req_to_cpu_blocks.pop(request.request_id, [])
        if cpu_blocks and self.pending.swap_out:
            # a swap-out not yet performed must not land on CPU blocks handed out again
            dropped = set(cpu_blocks)
            self.pending.swap_out = [(g, c) for g, c in self.pending.swap_out if c not in dropped]
        self._free_cpu_blocks.extend(reversed(cpu_blocks))

    # ----------------------------------------------------------------- swapping
    def swap_out(self, request: Request) -> bool:
        """Move a request's blocks to the CPU pool (copies queued). False if the pool is full.
        Entries given back by the sliding window stay released (swap_in restores them as
        NULL_BLOCK)."""
        blocks = [b for b in self.req_to_blocks.get(request.request_id, [])
                  if b is not NULL_BLOCK]
        if len(blocks) > len(self._free_cpu_blocks):
            return False
        cpu_blocks = [self._free_cpu_blocks.pop() for _ in blocks]
        self.pending.swap_out.extend(zip((b.block_id for b in blocks), cpu_blocks))
        self.req_to_cpu_blocks[request.request_id] = cpu_blocks
        self._changed.pop(request.request_id, None)
        self._headroom.pop(request.request_id, None)
        del self.req_to_blocks[request.request_id]
        self.pool.free_blocks(list(reversed(blocks)))
        self._num_cached_blocks.pop(request.request_id, None)
        self.stats.num_swapped_out_blocks += len(cpu_blocks)
        return True

    def can_swap_in(self, request: Request, num_new_tokens: int) -> bool:
        num_cpu = len(self.req_to_cpu_blocks.get(request.request_id, ()))
        table_len = self._num_released.get(request.request_id, 0) + num_cpu
        extra = max(self.blocks_for(request.num_computed_tokens + num_new_tokens) - table_len, 0)
        return num_cpu + extra <= self.pool.num_free_blocks

    def swap_in(self, request: Request) -> None:
        """Bring a swapped request's blocks back (copies queued); call `can_swap_in` first."""
        cpu_blocks = self.req_to_cpu_blocks.pop(request.request_id)
        blocks = self.pool.get_new_blocks(len(cpu_blocks))
        assert blocks is not None, f"swap_in of {len(cpu_blocks)} blocks without room"
        self.pending.swap_in.extend(zip(cpu_blocks, (b.block_id for b in blocks)))
        self._free_cpu_blocks.extend(reversed(cpu_blocks))
        released = self._num_released.get(request.request_id, 0)
        self.req_to_blocks[request.request_id] = [NULL_BLOCK] * released + blocks
        self._note_change(request.request_id, 0)
        self._headroom.pop(request.request_id, None)
        self.stats.num_swapped_in_blocks += len(blocks)
        self._cache_full_blocks(request, request.num_computed_tokens)

    def take_pending_copies(self) -> PendingCopies:
        pending, self.pending = self.pending, PendingCopies()
        return pending

    # ----------------------------------------------------------------- metrics
    def usage(self, requests: list[Request] | None = None, detailed: bool = True) -> dict:
        """Block counts, prefix-cache counters, fragmentation and a ref-count histogram.

        detailed=False leaves out the fragmentation and the histogram, which walk every block
        (tens of ms for the ~600k blocks of a small model on the H200): the server's periodic
        snapshot asks for the counts only."""
        evictable = self.pool.num_evictable_blocks
        free = self.pool.num_free_blocks - evictable
        in_use = self.num_blocks - free - evictable
        if not detailed:
            s = self.stats
            return {"num_blocks": self.num_blocks, "block_size": self.block_size,
                    "num_free_blocks": free, "num_cached_blocks": evictable,
                    "num_used_blocks": in_use, "prefix_cache_queries": s.prefix_cache_queries,
                    "prefix_cache_hits": s.prefix_cache_hits,
                    "prefix_cache_hit_rate": s.prefix_cache_hits / s.prefix_cache_queries
                    if s.prefix_cache_queries else 0.0}
        filled: dict[int, int] = {}
        for req in requests or []:
            for i, block in enumerate(self.req_to_blocks.get(req.request_id, ())):
                if block is NULL_BLOCK:
                    continue
                n = min(max(req.num_computed_tokens - i * self.block_size, 0), self.block_size)
                filled[block.block_id] = max(filled.get(block.block_id, 0), n)
        allocated_slots = in_use * self.block_size
        used_slots = sum(filled.values())
        hist = Counter(b.ref_cnt for b in self.pool.blocks if b.ref_cnt > 0)
        s = self.stats
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "num_free_blocks": free,
            "num_cached_blocks": evictable,
            "num_used_blocks": in_use,
            "prefix_cache_queries": s.prefix_cache_queries,
            "prefix_cache_hits": s.prefix_cache_hits,
            "prefix_cache_hit_rate": s.prefix_cache_hits / s.prefix_cache_queries
            if s.prefix_cache_queries else 0.0,
            "num_evictions": self.pool.num_evictions,
            "num_cow_copies": s.num_cow_copies,
            "internal_fragmentation_slots": allocated_slots - used_slots if requests is not None
            else None,
            "internal_fragmentation_pct": 100.0 * (allocated_slots - used_slots) / allocated_slots
            if requests is not None and allocated_slots else 0.0,
            "ref_count_histogram": dict(sorted(hist.items())),
            "num_cpu_blocks": self.num_cpu_blocks,
            "num_free_cpu_blocks": self.num_free_cpu_blocks,
            "num_swapped_out_blocks": s.num_swapped_out_blocks,
            "num_swapped_in_blocks": s.num_swapped_in_blocks,
        }

    def check_integrity(self) -> None:
        """Assert the invariants of docs/design.md: states partition the pool, ref counts
        equal the number of block tables holding each block, CPU blocks are each owned once."""
        self.pool.check_integrity()
        holders = Counter(b.block_id for blocks in self.req_to_blocks.values() for b in blocks
                          if b is not NULL_BLOCK)
        for request_id, blocks in self.req_to_blocks.items():
            released = self._num_released.get(request_id, 0)
            assert all(b is NULL_BLOCK for b in blocks[:released]) and not any(
                b is NULL_BLOCK for b in blocks[released:]), (
                f"{request_id}: {released} released entries, table {blocks}")
        for block in self.pool.blocks:
            assert block.ref_cnt == holders.get(block.block_id, 0), (
                f"block {block.block_id}: ref_cnt {block.ref_cnt} but held by "
                f"{holders.get(block.block_id, 0)} block tables"
            )
        evictable = self.pool.num_evictable_blocks
        free = self.pool.num_free_blocks - evictable
        in_use = sum(1 for b in self.pool.blocks if b.ref_cnt > 0)
        assert free + evictable + in_use == self.num_blocks, (free, evictable, in_use)
        owned = [c for blocks in self.req_to_cpu_blocks.values() for c in blocks]
        assert len(owned) == len(set(owned)), "a CPU block is owned twice"
        assert len(owned) + len(self._free_cpu_blocks) == self.num_cpu_blocks, (
            f"{len(owned)} owned + {len(self._free_cpu_blocks)} free CPU blocks != "
            f"{self.num_cpu_blocks}"
        )


def request_extra_keys(request: Request) -> tuple:
    """Extra keys mixed into every block hash (a per-request cache salt, when set)."""
    salt = getattr(request, "cache_salt", None)
    return (salt,) if salt is not None else ()
