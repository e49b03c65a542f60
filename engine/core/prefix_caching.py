"""Automatic prefix caching: the paged allocator, with full blocks shared by content.

A full block (``block_size`` tokens whose KV is computed) is identified by a chained hash of its
tokens and its parent block's hash, so equal hashes mean equal whole prefixes. Blocks are hashed
and registered as they fill, prompt and output alike (outputs only where their ids are known:
the simulator samples lengths, not ids). A new request looks up its leading blocks' hashes and
takes the longest cached run: those blocks gain a reference and its ``num_computed_tokens``
starts after them.

Every block is in exactly one of three states:

- **free**: no references, no content worth keeping (``_free``, a stack as in the base class);
- **held**: referenced by one or more live requests' block tables (``ref_counts > 0``);
- **cached, unreferenced**: no references but a registered hash (``evictable``, oldest first):
  still found by lookups, and taken back, least recently released first, only when the free
  stack is empty.

A referenced block is never evicted, and a cached block's KV is never rewritten: a request only
writes past its last full block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .block_manager import BlockManager, cdiv
from .request import Request

# The parent hash of a request's first block.
ROOT_HASH = 0


def hash_block(parent: int, token_ids: Sequence[int]) -> int:
    """Chained content hash of one full block. Python's hash of a tuple of ints does not depend
    on PYTHONHASHSEED, so it is stable across runs; 64 bits make a collision negligible at
    benchmark scale."""
    return hash((parent, tuple(token_ids)))


class PrefixCachingBlockManager(BlockManager):
    enable_prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int, allocation: str = "paged") -> None:
        super().__init__(num_blocks, block_size, allocation)
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # content hash -> block id
        self.evictable: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first
        self.num_evictions = 0

    # ---- pool state -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        # Cached-but-unreferenced blocks can be taken back at any time: they count as free.
        return len(self._free) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's ``reset_prefix_cache``: only while no request
        holds a block (a held block's hash cannot be dropped under it); False otherwise, and
        nothing changes. The cached blocks go back to the free stack."""
        if any(self.ref_counts):
            return False
        self._free.extend(self.evictable)
        self.evictable.clear()
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        return True

    def _pop_block(self) -> int:
        if self._free:
            block = self._free.pop()
        else:  # evict the least recently released cached block
            block, _ = self.evictable.popitem(last=False)
            block_hash = self.block_hash[block]
            assert block_hash is not None, "an evictable block is a cached one"
            del self.cached[block_hash]
            self.block_hash[block] = None
            self.num_evictions += 1
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        rc = self.ref_counts[block] - 1
        self.ref_counts[block] = rc
        if rc == 0:
            if self.block_hash[block] is None:
                self._free.append(block)
            else:
                self.evictable[block] = None  # most recently released: evicted last

    # ---- per request ----------------------------------------------------------------------------
    def allocate(self, req: Request, num_tokens: int) -> bool:
        need = self.blocks_needed(req, num_tokens)
        if need <= 0:
            return True
        if need > self.num_free_blocks:
            return False
        table = req.block_table
        for _ in range(need):
            table.append(self._pop_block())
        return True

    def free(self, req: Request) -> None:
        # Register what the request computed since the last step first: its KV stays findable.
        self.register_full_blocks(req)
        self._free_table(req)

    def discard(self, req: Request) -> None:
        self._free_table(req)

    def _release_blocks(self, blocks: list[int]) -> None:
        # Trimmed blocks lie past the computed tokens: never registered, so they go back to
        # the free stack (tail first, as _free_table).
        for block in reversed(blocks):
            self._release(block)

    def _free_table(self, req: Request) -> None:
        # Reversed: the tail of a sequence is released first, so it is evicted first and the
        # shared head of a prefix lives longest.
        for block in reversed(req.block_table):
            self._release(block)
        req.block_table = []
        req.num_registered_blocks = 0

    # ---- hashing, lookup, registration ----------------------------------------------------------
    def _hashes(self, req: Request, num_blocks: int) -> list[int]:
        """``req.block_hashes`` extended to at least ``num_blocks`` leading full blocks."""
        hashes = req.block_hashes
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.append(hash_block(parent, req.token_ids_slice(i * bs, (i + 1) * bs)))
        return hashes

    def lookup_prefix(self, req: Request) -> list[int]:
        """The cached blocks holding ``req``'s longest cached prefix, without taking them. At
        most ``num_tokens - 1`` tokens: the last known token is always computed, so the request
        has at least one token to schedule (and a row to sample from)."""
        max_blocks = min(req.num_tokens - 1, req.num_known_token_ids) // self.block_size
        if max_blocks <= 0:
            return []
        cached = self.cached
        hit = []
        for h in self._hashes(req, max_blocks)[:max_blocks]:
            block = cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def admission_cost(self, req: Request, hit: list[int], num_tokens: int) -> int:
        # Hit blocks that sit unreferenced in the evictable pool leave it when taken.
        taken_from_pool = sum(1 for b in hit if self.ref_counts[b] == 0)
        tokens = max(num_tokens, req.max_total_tokens) if self.reserved else num_tokens
        return cdiv(tokens, self.block_size) - len(hit) + taken_from_pool

    def allocate_prefix(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        """Give ``req`` (empty block table) the ``hit`` blocks, then blocks up to
        ``num_tokens``. All or nothing."""
        assert not req.block_table
        if self.admission_cost(req, hit, num_tokens) > self.num_free_blocks:
            return False
        ref_counts = self.ref_counts
        for block in hit:
            if ref_counts[block] == 0:
                del self.evictable[block]
            ref_counts[block] += 1
        req.block_table = list(hit)
        req.num_registered_blocks = len(hit)
        ok = self.allocate(req, num_tokens)
        assert ok
        return True

    def register_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """Register the request's blocks that have filled since the last call: those of its
        computed tokens, or of its first ``num_tokens`` (the scheduler's, as a chunk is
        scheduled: vLLM V1 caches blocks in allocate_slots, before the forward, so a request
        admitted later in the same step finds them), token ids known. A block whose content
        another block already holds stays private and goes back to the free stack when
        released."""
        table = req.block_table
        # A SWAPPED request keeps num_computed_tokens but holds no GPU blocks.
        n = req.num_computed_tokens if num_tokens is None else num_tokens
        full = min(n, req.num_known_token_ids) // self.block_size
        full = min(full, len(table))
        first = req.num_registered_blocks
        if full <= first:
            return
        hashes = self._hashes(req, full)
        cached = self.cached
        block_hash = self.block_hash
        for i in range(first, full):
            h = hashes[i]
            block = table[i]
            if block_hash[block] is None and h not in cached:
                cached[h] = block
                block_hash[block] = h
        req.num_registered_blocks = full

    def _uncomputed_blocks(self, req: Request) -> list[int]:
        """The blocks past the request's computed full blocks (registered when the step was
        scheduled, their KV not yet written)."""
        keep = req.num_computed_tokens // self.block_size
        return req.block_table[keep : max(keep, req.num_registered_blocks)]

    def forget_uncomputed(self, req: Request) -> None:
        """Unregister the blocks the scheduler registered for tokens that will not be computed
        after all (a victim taken back in its step, a failed step): no later lookup may find
        KV that was never written."""
        blocks = self._uncomputed_blocks(req)
        for block in blocks:
            h = self.block_hash[block]
            if h is not None and self.cached.get(h) == block:
                del self.cached[h]
                self.block_hash[block] = None
        req.num_registered_blocks -= len(blocks)

    def shares_uncomputed(self, req: Request) -> bool:
        """Whether another request found one of those blocks in this step (it reads the KV
        this request writes in the step's forward)."""
        return any(self.ref_counts[b] > 1 for b in self._uncomputed_blocks(req))

    # ---- for tests ------------------------------------------------------------------------------
    def check_invariants(self, live: list[Request], cpu: bool = False) -> None:
        """Every block free, held (with a reference count equal to the live tables holding it)
        or cached-unreferenced; the hash index and the blocks agree."""
        counts = [0] * self.num_blocks
        for r in live:
            if len(set(r.block_table)) != len(r.block_table):
                raise AssertionError(f"{r!r} holds a block twice: {r.block_table}")
            for b in r.block_table:
                counts[b] += 1
        if counts != self.ref_counts:
            raise AssertionError("reference counts disagree with the live block tables")
        free = set(self._free)
        evictable = set(self.evictable)
        if len(free) != len(self._free) or free & evictable:
            raise AssertionError("a block is free twice, or both free and evictable")
        for b in range(self.num_blocks):
            states = (b in free) + (b in evictable) + (counts[b] > 0)
            if states != 1:
                raise AssertionError(f"block {b} is in {states} states (free/evictable/held)")
            if b in free and self.block_hash[b] is not None:
                raise AssertionError(f"free block {b} still carries a hash")
            if b in evictable and self.block_hash[b] is None:
                raise AssertionError(f"evictable block {b} has no hash")
        for h, b in self.cached.items():
            if self.block_hash[b] != h:
                raise AssertionError(f"hash index points at block {b}, which holds other content")
        if sum(h is not None for h in self.block_hash) != len(self.cached):
            raise AssertionError("a hashed block is missing from the hash index")
