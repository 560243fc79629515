"""BlockPool: the KV blocks, their reference counts, the free queues and the prefix cache.

Every block is in exactly one state:

    free        ref_cnt == 0, block_hash is None      in the free queue
    evictable   ref_cnt == 0, block_hash is not None  in the evictable queue AND the hash map
    in use      ref_cnt >= 1                          in neither queue (maybe in the hash map)

`get_new_blocks` hands out free blocks first (oldest first) and only then evicts cached ones,
least recently used first; an evicted block is un-hashed there. Why two queues rather than
one LRU list of both kinds: with one list, a cached block near its head is evicted while
never-cached blocks wait behind it (the partial last block of a finished request, say), which
throws away reusable KV for nothing. A request's blocks are freed tail first, so a prefix's
deepest blocks are evicted before its shared roots. A cache hit on an evictable block takes it
out of its queue (`touch`).

Block hash: sha256 over (parent hash, the block's token ids as int64 bytes), where the first
block's parent is a root hash of the request's extra keys (a cache salt); so the hash of a block
identifies the whole prefix up to and including it. sha256 is collision-resistant, so a hit
never returns a block holding other tokens (the same choice as vLLM's `sha256` option).
Several blocks may hold the same hash (two requests computed the same prefix before either was
cached, or the recomputed last block of a full hit); each stays hashed, so evicting one copy
keeps the prefix cached in the other.
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


def root_hash(extra_keys: tuple = ()) -> bytes:
    """The parent hash of a request's first block: sha256 of its extra keys (pickled)."""
    return hashlib.sha256(pickle.dumps(tuple(extra_keys), protocol=5)).digest()


assert array("q").itemsize == 8, "array('q') must hold int64 for block hashes"


def hash_token_blocks(parent_hash: bytes, token_ids: np.ndarray | list[int],
                      block_size: int) -> list[bytes]:
    """Chained hashes of consecutive full blocks: block i hashes to
    sha256(hash of block i-1 + its block_size token ids as int64 bytes, native order), block
    0's parent being `parent_hash`. token_ids: [k * block_size] int64, or a list of ints
    (a decode step's block: no numpy round trip; the same bytes)."""
    if isinstance(token_ids, list):
        data = array("q", token_ids).tobytes()
    else:
        data = np.ascontiguousarray(token_ids, dtype=np.int64).tobytes()
    step = 8 * block_size
    if len(data) == step:  # one block (a decode step's): no loop
        return [hashlib.sha256(parent_hash + data).digest()]
    hashes = []
    for start in range(0, len(data) - step + 1, step):
        parent_hash = hashlib.sha256(parent_hash + data[start : start + step]).digest()
        hashes.append(parent_hash)
    return hashes


def hash_block_tokens(
    parent_hash: bytes | None, token_ids: tuple[int, ...] | list[int], extra_keys: tuple = ()
) -> bytes:
    """Chained hash of one full block (see `hash_token_blocks`); a None parent is the root of
    `extra_keys`, which are otherwise unused."""
    parent = root_hash(extra_keys) if parent_hash is None else parent_hash
    return hash_token_blocks(parent, np.asarray(token_ids, dtype=np.int64), len(token_ids))[0]


@dataclass(eq=False)
class KVBlock:
    """One block of `block_size` token slots (in every layer)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None

    def __repr__(self) -> str:
        cached = "h" if self.block_hash is not None else "-"
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, {cached})"


NULL_BLOCK = KVBlock(block_id=0)
"""Stands in a block table for an entry given back to the pool because it left the sliding
window (`KVCacheManager`, docs/design.md "Sliding window"). It is never in the pool's queues or
hash map and its ref count stays 0; its id is what the device side's table holds there (any
valid index would do: no kernel reads an entry before the window)."""


class BlockPool:
    """Owns all `num_blocks` blocks. Only the KV cache manager talks to it."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> None, oldest first: uncached free blocks, and cached ones (LRU at the head)
        self._free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._evictable_queue: OrderedDict[int, None] = OrderedDict()
        # hash -> the blocks holding it (block_id -> block), first cached first
        self.cached_blocks: dict[bytes, dict[int, KVBlock]] = {}
        self.num_evictions = 0

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free plus cached-evictable."""
        return len(self._free_queue) + len(self._evictable_queue)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._evictable_queue)

    def evictable_block_ids(self) -> list[int]:
        """Cached blocks with ref count 0, in eviction order (least recently used first)."""
        return list(self._evictable_queue)

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        holders = self.cached_blocks.get(block_hash)
        return next(iter(holders.values())) if holders else None

    # ----------------------------------------------------------------- changes
    def get_new_blocks(self, num_blocks: int) -> list[KVBlock] | None:
        """Take `num_blocks` blocks, free ones first, then evicting cached ones (LRU first);
        each gets ref_cnt 1. Returns None, changing nothing, when fewer are available."""
        if num_blocks > self.num_free_blocks:
            return None
        out = []
        for _ in range(num_blocks):
            queue = self._free_queue if self._free_queue else self._evictable_queue
            block_id, _ = queue.popitem(last=False)
            block = self.blocks[block_id]
            assert block.ref_cnt == 0, f"block {block_id} in a free queue has ref {block.ref_cnt}"
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cache-hit blocks (removing evictable ones from their queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._evictable_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the tail of the free
        queue (uncached) or of the evictable queue (cached).

        Pass a request's blocks in reverse order so that its tail blocks are evicted first.
        """
        for block in blocks:
            assert block.ref_cnt > 0, f"double free of block {block.block_id}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                queue = self._free_queue if block.block_hash is None else self._evictable_queue
                queue[block.block_id] = None

    def cache_blocks(self, blocks: list[KVBlock], block_hashes: list[bytes]) -> None:
        """Register full, in-use blocks under their hashes, pair by pair (no-op if caching is
        off; a block already hashed keeps its hash)."""
        if not self.enable_caching:
            return
        cached = self.cached_blocks
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            assert block.ref_cnt > 0, f"caching {block}, which is not in use"
            if block.block_hash is None:
                block.block_hash = block_hash
                holders = cached.get(block_hash)
                if holders is None:
                    holders = cached[block_hash] = {}
                holders[block.block_id] = block

    def uncache(self, block: KVBlock) -> None:
        """Drop an in-use block's hash (its KV was never computed: an admission undone)."""
        assert block.ref_cnt > 0 and block.block_hash is not None, block
        holders = self.cached_blocks[block.block_hash]
        del holders[block.block_id]
        if not holders:
            del self.cached_blocks[block.block_hash]
        block.block_hash = None

    def _evict(self, block: KVBlock) -> None:
        assert block.block_hash is not None
        holders = self.cached_blocks[block.block_hash]
        del holders[block.block_id]
        if not holders:
            del self.cached_blocks[block.block_hash]
        block.block_hash = None
        self.num_evictions += 1

    def check_integrity(self) -> None:
        """Assert the pool's own invariants (see the module docstring)."""
        free, evictable = set(self._free_queue), set(self._evictable_queue)
        assert not free & evictable, f"blocks {sorted(free & evictable)} are in both queues"
        for block in self.blocks:
            if block.ref_cnt == 0:
                queue = free if block.block_hash is None else evictable
                assert block.block_id in queue, f"{block} has ref 0 but is not in its queue"
            else:
                assert block.ref_cnt > 0, f"{block} has a negative ref count"
                assert block.block_id not in free | evictable, f"{block} is in use but queued"
            if block.block_hash is not None:
                holders = self.cached_blocks.get(block.block_hash, {})
                assert holders.get(block.block_id) is block, f"{block} is not in the hash map"
        for block_hash, holders in self.cached_blocks.items():
            assert holders, "an empty entry in the hash map"
            for block_id, block in holders.items():
                assert block.block_id == block_id and block.block_hash == block_hash, (
                    f"hash map points at {block} with another hash")
