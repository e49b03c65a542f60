"""The paged KV-cache allocator.

Fixed-size blocks, a free pool, per-request block tables. Blocks return to the pool only when a
request finishes, is aborted or is preempted. Two allocation modes:

- ``paged``: a request holds just the blocks its computed tokens need and grows one block at a
  time (vLLM's PagedAttention);
- ``reserved``: prompt + max output tokens are set aside at admission, as systems before paging
  did, so fragmentation's cost can be measured against ``paged``.
"""

from __future__ import annotations

from .request import Request

ALLOCATION_MODES = ("paged", "reserved")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, allocation: str = "paged") -> None:
        if allocation not in ALLOCATION_MODES:
            raise ValueError(f"unknown KV allocation {allocation!r}: use {', '.join(ALLOCATION_MODES)}")
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserved = allocation == "reserved"
        # A stack: the most recently freed block is reused first (warm in cache on a GPU).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

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

    def check_invariants(self, live: list[Request]) -> None:
        """For tests: every block is either free or held by exactly one live request."""
        held = [b for r in live for b in r.block_table]
        all_blocks = held + self._free
        if len(all_blocks) != self.num_blocks or set(all_blocks) != set(range(self.num_blocks)):
            raise AssertionError(
                f"block accounting broken: {len(held)} held + {len(self._free)} free "
                f"!= {self.num_blocks}, or duplicates"
            )
