"""BlockPool: the KV blocks, their reference counts, the free queue and the prefix cache.

Every block is in exactly one state:

    free        ref_cnt == 0, block_hash is None      in the free queue
    evictable   ref_cnt == 0, block_hash is not None  in the free queue AND in the hash map
    in use      ref_cnt >= 1                          in neither queue (maybe in the hash map)

The free queue is one LRU list for both free and evictable blocks: `get_new_blocks` pops from
its head, and a popped evictable block is un-hashed there (that is the eviction). Blocks freed
by a request are appended at the tail, so the least recently used cached block is evicted first.
A cache hit on an evictable block takes it out of the queue (`touch`).

Block hash: sha256 over (parent hash, the block's token ids, extra keys), so the hash of a
block identifies the whole prefix up to and including it. sha256 is collision-resistant, so a
hit never returns a block holding other tokens (the same choice as vLLM's `sha256` option).
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from dataclasses import dataclass


def hash_block_tokens(
    parent_hash: bytes | None, token_ids: tuple[int, ...], extra_keys: tuple = ()
) -> bytes:
    """Chained hash of one full block: sha256(pickle((parent_hash, token_ids, extra_keys)))."""
    payload = pickle.dumps((parent_hash, tuple(token_ids), tuple(extra_keys)), protocol=5)
    return hashlib.sha256(payload).digest()


@dataclass(eq=False)
class KVBlock:
    """One block of `block_size` token slots (in every layer)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None

    def __repr__(self) -> str:
        cached = "h" if self.block_hash is not None else "-"
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, {cached})"


class BlockPool:
    """Owns all `num_blocks` blocks. Only the KV cache manager talks to it."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> None, ordered from least to most recently freed (LRU at the head)
        self._free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached_blocks: dict[bytes, KVBlock] = {}
        self.num_evictions = 0

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free plus cached-evictable."""
        return len(self._free_queue)

    @property
    def num_evictable_blocks(self) -> int:
        return sum(1 for i in self._free_queue if self.blocks[i].block_hash is not None)

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self.cached_blocks.get(block_hash)

    # ----------------------------------------------------------------- changes
    def get_new_blocks(self, num_blocks: int) -> list[KVBlock] | None:
        """Take `num_blocks` blocks off the free queue (evicting cached ones), ref_cnt 1 each.

        Returns None, changing nothing, when fewer than `num_blocks` are available.
        """
        if num_blocks > len(self._free_queue):
            return None
        out = []
        for _ in range(num_blocks):
            block_id, _ = self._free_queue.popitem(last=False)
            block = self.blocks[block_id]
            assert block.ref_cnt == 0, f"block {block_id} in the free queue has ref {block.ref_cnt}"
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cache-hit blocks (removing evictable ones from the free queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the free queue's tail.

        Pass a request's blocks in reverse order so that its tail blocks are evicted first.
        """
        for block in blocks:
            assert block.ref_cnt > 0, f"double free of block {block.block_id}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free_queue[block.block_id] = None

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Register a full, in-use block under `block_hash` (no-op if caching is off or the
        hash is already held by another block: the first copy stays canonical)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached_blocks:
            return
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block

    def _evict(self, block: KVBlock) -> None:
        assert block.block_hash is not None
        if self.cached_blocks.get(block.block_hash) is block:
            del self.cached_blocks[block.block_hash]
        block.block_hash = None
        self.num_evictions += 1

    def reset_prefix_cache(self) -> bool:
        """Un-hash every evictable block. Returns False (changing nothing) if any block is in use."""
        if any(b.ref_cnt for b in self.blocks):
            return False
        for block in self.blocks:
            if block.block_hash is not None:
                self._evict(block)
        return True

    def check_integrity(self) -> None:
        """Assert the pool's own invariants (see the module docstring)."""
        queued = set(self._free_queue)
        assert len(queued) == len(self._free_queue)
        for block in self.blocks:
            if block.ref_cnt == 0:
                assert block.block_id in queued, f"{block} has ref 0 but is not in the free queue"
            else:
                assert block.ref_cnt > 0 and block.block_id not in queued, f"{block} is queued"
            if block.block_hash is not None:
                assert self.cached_blocks.get(block.block_hash) is block, f"{block} not mapped"
        for block_hash, block in self.cached_blocks.items():
            assert block.block_hash == block_hash, f"hash map points at {block} with another hash"
