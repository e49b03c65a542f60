"""The paged KV-cache allocator.

Fixed-size blocks, a free pool, per-request block tables. Blocks return to the pool only when a
request finishes, is aborted or is preempted. Two allocation modes:

- ``paged``: a request holds just the blocks its computed tokens need and grows one block at a
  time (vLLM's PagedAttention);
- ``reserved``: prompt + max output tokens are set aside at admission, as systems before paging
  did, so fragmentation's cost can be measured against ``paged``.

The same class serves as the CPU pool of swap preemption (``allocate_blocks`` / ``free_blocks``:
bare block ids, no request). Prefix caching lives in ``prefix_caching.py``, a subclass; the
hooks it overrides (``lookup_prefix``, ``allocate_prefix``, ``register_full_blocks``,
``discard``) are trivial here, so the scheduler calls them without asking which pool it has.
"""

from __future__ import annotations

from ..args import KV_ALLOCATIONS
from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    enable_prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int, allocation: str = "paged") -> None:
        if allocation not in KV_ALLOCATIONS:
            raise ValueError(f"unknown KV allocation {allocation!r}: use {', '.join(KV_ALLOCATIONS)}")
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserved = allocation == "reserved"
        # A stack: the most recently freed block is reused first (warm in cache on a GPU).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's reset_prefix_cache): without prefix caching
        nothing is cached, so it always succeeds."""
        return True

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        """Extra blocks ``req`` needs so that its first ``num_tokens`` tokens have KV slots."""
        if self.reserved:
            num_tokens = max(num_tokens, req.max_total_tokens)
        return cdiv(num_tokens, self.block_size) - len(req.block_table)

    def max_blocks(self, req: Request) -> int:
        """Blocks the request needs at its largest. Its last output token's KV is never written
        (nothing reads it), so paged allocation needs one token fewer than reserved."""
        if self.reserved:
            return cdiv(req.max_total_tokens, self.block_size)
        return cdiv(req.max_total_tokens - 1, self.block_size)

    def can_ever_fit(self, req: Request) -> bool:
        return self.max_blocks(req) <= self.num_blocks

    def allocate(self, req: Request, num_tokens: int) -> bool:
        """Grow ``req``'s block table to hold ``num_tokens`` tokens. False (and no change) when
        the pool is short."""
        need = self.blocks_needed(req, num_tokens)
        if need <= 0:
            return True
        free = self._free
        if need > len(free):
            return False
        if need == 1:  # the common decode case: one block crossed
            req.block_table.append(free.pop())
        else:
            req.block_table.extend(free[-need:][::-1])
            del free[-need:]
        return True

    def free(self, req: Request) -> None:
        # Reversed so that the request's first block is reused first.
        self._free.extend(reversed(req.block_table))
        req.block_table = []

    def discard(self, req: Request) -> None:
        """Free blocks whose KV was never written (a swap-in cancelled in its own step)."""
        self.free(req)

    def trim(self, req: Request, num_tokens: int) -> None:
        """Speculative decoding's rollback: free the blocks past the first ``num_tokens``
        tokens (they held only rejected drafts' KV). Reserved allocation keeps its
        reservation. The trimmed table is a new list: the model runner's persistent batch
        tells a regrown table from a grown one by its identity."""
        keep = cdiv(num_tokens, self.block_size)
        table = req.block_table
        if self.reserved or len(table) <= keep:
            return
        self._release_blocks(table[keep:])
        req.block_table = table[:keep]

    def _release_blocks(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))

    # ---- bare blocks: the CPU pool of swap preemption -----------------------------------------
    def allocate_blocks(self, n: int) -> list[int] | None:
        """``n`` blocks not tied to a request, or None (and no change) when the pool is short."""
        free = self._free
        if n > len(free):
            return None
        blocks = free[-n:][::-1]
        del free[-n:]
        return blocks

    def free_blocks(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))

    # ---- prefix caching hooks: nothing is ever cached here ------------------------------------
    def lookup_prefix(self, req: Request) -> list[int]:
        return []

    def admission_cost(self, req: Request, hit: list[int], num_tokens: int) -> int:
        """Free blocks that admitting ``req`` (empty block table) up to ``num_tokens`` takes."""
        return self.blocks_needed(req, num_tokens)

    def allocate_prefix(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        return self.allocate(req, num_tokens)

    def register_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        pass

    def forget_uncomputed(self, req: Request) -> None:
        pass

    def shares_uncomputed(self, req: Request) -> bool:
        return False

    def check_invariants(self, live: list[Request], cpu: bool = False) -> None:
        """For tests: every block is either free or held by exactly one live request (by its
        ``cpu_block_table`` when this is the CPU pool)."""
        held = [b for r in live for b in (r.cpu_block_table if cpu else r.block_table)]
        all_blocks = held + self._free
        if len(all_blocks) != self.num_blocks or set(all_blocks) != set(range(self.num_blocks)):
            raise AssertionError(
                f"block accounting broken: {len(held)} held + {len(self._free)} free "
                f"!= {self.num_blocks}, or duplicates"
            )
