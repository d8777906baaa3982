"""A fixed pool of KV blocks with per-request block tables and a prefix cache.

Token position p of a request lives in slot p % block_size of block table[p // block_size]:

    tokens  | 0 .. bs-1 | bs .. 2bs-1 | ... | (n-1)bs .. num_tokens-1 |
    table   |  table[0] |   table[1]  | ... |  table[n-1] (maybe partial)

Every block is in exactly one of two states: in use (ref_count > 0, in one or more tables)
or free (ref_count == 0, in the free queue). A free block may still be cached: it keeps its
hash and its KV until the free queue hands it out again, which evicts it. Block 0 is an
ordinary block; nothing here needs a reserved null block.

Eviction order, one queue, popped from the front:
- a freed block without a hash (a partial tail, or a duplicate of a cached block) goes to
  the FRONT: it holds nothing reusable, so it is reused first;
- a freed hashed block goes to the BACK (least recently freed is evicted first);
- a request frees its table tail first, so its tail blocks sit ahead of its head blocks
  and are evicted first: a head block is shared by more prefixes than a tail block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

from scheduler.prefix_hash import BlockHash, hash_block, media_extra_keys, salt_root
from scheduler.request import MediaSpan, Request, RequestId

BlockId = NewType("BlockId", int)


@dataclass(slots=True)
class _Block:
    block_id: BlockId
    ref_count: int = 0
    # Set exactly while the prefix cache maps this hash to this block.
    hash: BlockHash | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block(BlockId(i)) for i in range(num_blocks)]
        # An OrderedDict as a queue with O(1) removal from the middle (touching a cached block).
        self._free: OrderedDict[BlockId, None] = OrderedDict.fromkeys(
            b.block_id for b in self._blocks
        )
        self._cached: dict[BlockHash, BlockId] = {}
        self._tables: dict[RequestId, list[BlockId]] = {}
        # Hashes of the request's leading full blocks, in table order. Kept per request
        # rather than read off the blocks: a block whose hash was already cached elsewhere
        # stays unhashed, yet the next block's hash still chains from it.
        self._hashes: dict[RequestId, list[BlockHash]] = {}
        # Free blocks that still hold cached KV (hashed, reference count 0).
        self._num_free_cached = 0

    # -- queries -----------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return (self.num_blocks - len(self._free)) / self.num_blocks

    @property
    def occupancy(self) -> float:
        """Fraction of blocks holding KV worth keeping: in use, or free but cached."""
        return (self.num_blocks - len(self._free) + self._num_free_cached) / self.num_blocks

    def block_ids(self, request_id: RequestId) -> list[BlockId]:
        return list(self._tables.get(request_id, ()))

    def get_computed_blocks(self, request: Request) -> tuple[list[BlockId], int]:
        """Cached leading full blocks of the request, and how many tokens they hold.

        At most (num_tokens - 1) // block_size blocks: at least one token is left to
        compute, because the step that computes the last token is the one that samples.
        """
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks = self._longest_cached_run(
            request.all_token_ids, max_blocks, request.media, salt_root(request.cache_salt)
        )
        return blocks, len(blocks) * self.block_size

    def num_cached_prefix_blocks(
        self, token_ids: Sequence[int], media: Sequence[MediaSpan] = (), cache_salt: str | None = None
    ) -> int:
        if not self.enable_prefix_caching:
            return 0
        max_blocks = len(token_ids) // self.block_size
        return len(self._longest_cached_run(token_ids, max_blocks, media, salt_root(cache_salt)))

    def num_cached_leading_blocks(self, hashes: Sequence[BlockHash]) -> int:
        """How many of these chained block hashes, from the first, are cached right now."""
        if not self.enable_prefix_caching:
            return 0
        count = 0
        for block_hash in hashes:
            if block_hash not in self._cached:
                break
            count += 1
        return count

    def _longest_cached_run(
        self, token_ids: Sequence[int], max_blocks: int, media: Sequence[MediaSpan], root: BlockHash | None
    ) -> list[BlockId]:
        blocks: list[BlockId] = []
        parent = root
        bs = self.block_size
        for i in range(max_blocks):
            start, end = i * bs, (i + 1) * bs
            parent = hash_block(parent, token_ids[start:end], media_extra_keys(media, start, end))
            block_id = self._cached.get(parent)
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks

    # -- allocate / free ---------------------------------------------------------------

    def can_allocate(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[BlockId] = ()
    ) -> bool:
        num_new_blocks = self._num_new_blocks(request, num_new_tokens, computed_blocks)
        # A cached block that is free still counts in num_free_blocks; touching it takes
        # it out of the queue, so it costs free capacity like a fresh block does.
        num_touched_free = sum(1 for b in computed_blocks if self._blocks[b].ref_count == 0)
        return num_new_blocks + num_touched_free <= len(self._free)

    def allocate(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[BlockId] = ()
    ) -> list[BlockId]:
        """Grow the request's table to cover its computed tokens, computed_blocks and
        num_new_tokens more; return the block ids appended to the table.

        computed_blocks (from get_computed_blocks) only on a request's first allocation.
        """
        if not self.can_allocate(request, num_new_tokens, computed_blocks):
            raise RuntimeError(f"not enough free KV blocks for {request.request_id}")
        num_new_blocks = self._num_new_blocks(request, num_new_tokens, computed_blocks)
        table = self._tables.setdefault(request.request_id, [])
        hashes = self._hashes.setdefault(request.request_id, [])
        # Touch the computed blocks before popping fresh ones, so the pops cannot evict them.
        for block_id in computed_blocks:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
                self._num_free_cached -= 1
            block.ref_count += 1
            assert block.hash is not None
            hashes.append(block.hash)
        new = [*computed_blocks, *(self._pop_free() for _ in range(num_new_blocks))]
        table.extend(new)
        return new

    def free(self, request: Request, *, uncache: bool = False) -> None:
        """Release the request's blocks; a no-op for a request without a table.

        uncache: blocks that no other request holds lose their cache entry too (their KV may
        never have been written: the step that was to write it failed). Blocks still shared
        were written by an earlier step of their other holder, so they stay cached.
        """
        self._hashes.pop(request.request_id, None)
        table = self._tables.pop(request.request_id, None)
        if table is None:
            return
        for block_id in reversed(table):  # tail first: see the module docstring
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if uncache and block.hash is not None:
                    del self._cached[block.hash]
                    block.hash = None
                self._free[block_id] = None
                if block.hash is None:
                    self._free.move_to_end(block_id, last=False)
                else:
                    self._num_free_cached += 1

    def _num_new_blocks(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[BlockId]
    ) -> int:
        table = self._tables.get(request.request_id, ())
        if computed_blocks and (table or request.num_computed_tokens):
            raise ValueError("computed_blocks are only for a request's first allocation")
        num_tokens = request.num_computed_tokens + len(computed_blocks) * self.block_size
        num_tokens += num_new_tokens
        num_blocks = -(-num_tokens // self.block_size)
        return max(0, num_blocks - len(table) - len(computed_blocks))

    def _pop_free(self) -> BlockId:
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        if block.hash is not None:  # evict: its KV is about to be overwritten
            del self._cached[block.hash]
            self._num_free_cached -= 1
            block.hash = None
        block.ref_count = 1
        return block_id

    # -- prefix cache ------------------------------------------------------------------

    def cache_full_blocks(self, request: Request) -> None:
        """Register the hashes of the request's blocks that filled up.

        Call once request.num_computed_tokens counts the tokens just scheduled: blocks
        [0, num_computed_tokens // block_size) are full of known tokens whose KV exists
        (or will, once the step that was just scheduled runs, before any later step).
        """
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request.request_id)
        if table is None:
            return
        hashes = self._hashes[request.request_id]
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        if num_full <= len(hashes):
            return
        token_ids = request.all_token_ids
        bs = self.block_size
        for i in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else salt_root(request.cache_salt)
            start, end = i * bs, (i + 1) * bs
            block_hash = hash_block(
                parent, token_ids[start:end], media_extra_keys(request.media, start, end)
            )
            hashes.append(block_hash)
            block = self._blocks[table[i]]
            # An equal block already cached stays the canonical one; this one stays unhashed.
            if block_hash not in self._cached and block.hash is None:
                self._cached[block_hash] = block.block_id
                block.hash = block_hash

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (e.g. after the worker lost its KV). Tables stay."""
        for block_id in self._cached.values():
            self._blocks[block_id].hash = None
        self._cached.clear()
        self._num_free_cached = 0

    # -- invariants --------------------------------------------------------------------

    def check_invariants(self) -> None:
        refs = [0] * self.num_blocks
        for request_id, table in self._tables.items():
            assert len(set(table)) == len(table), f"{request_id}: a block twice in one table"
            for block_id in table:
                refs[block_id] += 1
            assert len(self._hashes[request_id]) <= len(table), f"{request_id}: extra hashes"
            for block_id, block_hash in zip(table, self._hashes[request_id], strict=False):
                own = self._blocks[block_id].hash
                assert own is None or own == block_hash, f"{request_id}: hash mismatch"
        assert self._hashes.keys() == self._tables.keys()
        num_in_use = 0
        for block in self._blocks:
            assert block.ref_count == refs[block.block_id], f"block {block.block_id}: refcount"
            in_free = block.block_id in self._free
            assert in_free == (block.ref_count == 0), f"block {block.block_id}: free queue"
            num_in_use += block.ref_count > 0
            if block.hash is not None:
                assert self._cached.get(block.hash) == block.block_id, "hash not in cache"
        assert len(self._free) + num_in_use == self.num_blocks
        free_cached = sum(1 for b in self._blocks if b.ref_count == 0 and b.hash is not None)
        assert free_cached == self._num_free_cached, "free cached block count"
        for block_hash, block_id in self._cached.items():
            assert self._blocks[block_id].hash == block_hash, f"cache -> block {block_id}"
        if not self.enable_prefix_caching:
            assert not self._cached
