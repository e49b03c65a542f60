"""The paged KV allocator: conservation, exclusivity, all-or-nothing allocation, reserved mode.

A hypothesis state machine drives random allocate/free sequences over several requests in both
allocation modes against a simple model of what each block table should hold; hand-computed
cases pin ``blocks_needed``, ``max_blocks`` and ``can_ever_fit``.
"""

from __future__ import annotations

import pytest
from helpers import examples
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cbbench.engine.core.block_manager import BlockManager, cdiv
from cbbench.engine.core.request import Request

NUM_REQS = 5


def _req(i: int, prompt: int, max_tokens: int) -> Request:
    return Request(i, prompt, max_tokens)


class _AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/free over NUM_REQS requests; the model is each table's expected length."""

    allocation = "paged"

    @initialize(
        num_blocks=st.integers(1, 24),
        block_size=st.sampled_from([1, 2, 3, 4, 16]),
        lengths=st.lists(
            st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=NUM_REQS, max_size=NUM_REQS
        ),
    )
    def setup(self, num_blocks, block_size, lengths):
        self.bm = BlockManager(num_blocks, block_size, self.allocation)
        self.reqs = [_req(i, p, o) for i, (p, o) in enumerate(lengths)]
        self.expected_len = [0] * NUM_REQS
        self.ever_seen: set[int] = set()

    def _target_blocks(self, req: Request, num_tokens: int) -> int:
        tokens = num_tokens
        if self.allocation == "reserved":
            tokens = max(tokens, req.max_total_tokens)
        return cdiv(tokens, self.bm.block_size)

    @rule(i=st.integers(0, NUM_REQS - 1), frac=st.floats(0.0, 1.0))
    def allocate(self, i, frac):
        req = self.reqs[i]
        bm = self.bm
        # Tokens up to prompt + max_tokens (what a request can ever ask for).
        num_tokens = max(1, round(frac * req.max_total_tokens))
        before_table = list(req.block_table)
        before_free = bm.num_free_blocks
        target = self._target_blocks(req, num_tokens)
        need = target - len(before_table)
        assert bm.blocks_needed(req, num_tokens) == need
        ok = bm.allocate(req, num_tokens)
        if need <= 0:
            assert ok
            assert req.block_table == before_table
            assert bm.num_free_blocks == before_free
        elif need > before_free:
            # All or nothing: a short pool changes nothing.
            assert not ok
            assert req.block_table == before_table
            assert bm.num_free_blocks == before_free
        else:
            assert ok
            # Existing blocks keep their place; new ones are appended.
            assert req.block_table[: len(before_table)] == before_table
            assert len(req.block_table) == target
            assert bm.num_free_blocks == before_free - need
            self.expected_len[i] = target
            if self.allocation == "reserved" and not before_table:
                # Reserved: the first allocation sets aside prompt + max_tokens at once.
                assert len(req.block_table) == cdiv(req.max_total_tokens, bm.block_size)
        # Capacity covers the request's tokens whenever allocation succeeded.
        if ok:
            assert len(req.block_table) * bm.block_size >= num_tokens

    @rule(i=st.integers(0, NUM_REQS - 1))
    def free(self, i):
        req = self.reqs[i]
        before_free = self.bm.num_free_blocks
        held = len(req.block_table)
        self.bm.free(req)
        assert req.block_table == []
        assert self.bm.num_free_blocks == before_free + held
        self.expected_len[i] = 0

    @precondition(lambda self: hasattr(self, "bm"))
    @invariant()
    def conserved_and_exclusive(self):
        bm = self.bm
        bm.check_invariants(self.reqs)  # raises on a lost or duplicated block
        held = [b for r in self.reqs for b in r.block_table]
        assert len(held) == len(set(held)), "a block is held twice"
        assert all(0 <= b < bm.num_blocks for b in held)
        assert bm.num_used_blocks == len(held)
        assert bm.num_used_blocks + bm.num_free_blocks == bm.num_blocks
        assert [len(r.block_table) for r in self.reqs] == self.expected_len


class PagedAllocatorMachine(_AllocatorMachine):
    allocation = "paged"


class ReservedAllocatorMachine(_AllocatorMachine):
    allocation = "reserved"


_SETTINGS = settings(
    max_examples=examples(150), stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestPagedAllocator = PagedAllocatorMachine.TestCase
TestPagedAllocator.settings = _SETTINGS
TestReservedAllocator = ReservedAllocatorMachine.TestCase
TestReservedAllocator.settings = _SETTINGS


# ---- hand-computed cases --------------------------------------------------------------------
def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown KV allocation"):
        BlockManager(4, 4, "contiguous")
    with pytest.raises(ValueError):
        BlockManager(0, 4)
    with pytest.raises(ValueError):
        BlockManager(4, 0)


def test_paged_grows_one_block_at_a_time():
    bm = BlockManager(10, 4)
    r = _req(0, 5, 10)
    assert bm.blocks_needed(r, 5) == 2
    assert bm.allocate(r, 5)
    assert len(r.block_table) == 2 and bm.num_free_blocks == 8
    # Tokens 6..8 fit in the second block: nothing new.
    assert bm.blocks_needed(r, 8) == 0
    assert bm.allocate(r, 8)
    assert len(r.block_table) == 2
    # Token 9 crosses into a third block.
    assert bm.blocks_needed(r, 9) == 1
    assert bm.allocate(r, 9)
    assert len(r.block_table) == 3 and bm.num_free_blocks == 7
    bm.check_invariants([r])


def test_reserved_sets_aside_prompt_plus_max_tokens_at_first_allocation():
    bm = BlockManager(10, 4, "reserved")
    r = _req(0, 5, 10)  # 15 tokens at most -> 4 blocks
    assert bm.blocks_needed(r, 5) == 4
    assert bm.allocate(r, 5)
    assert len(r.block_table) == 4 and bm.num_free_blocks == 6
    # Growing within the reservation takes nothing more.
    for n in range(5, 16):
        assert bm.blocks_needed(r, n) == 0
        assert bm.allocate(r, n)
    assert len(r.block_table) == 4
    bm.check_invariants([r])


def test_allocate_is_all_or_nothing_when_short():
    bm = BlockManager(3, 4)
    a, b = _req(0, 8, 4), _req(1, 9, 4)
    assert bm.allocate(a, 8)  # 2 blocks
    assert bm.num_free_blocks == 1
    assert not bm.allocate(b, 9)  # needs 3, 1 free
    assert b.block_table == [] and bm.num_free_blocks == 1
    assert bm.allocate(b, 4)  # 1 block fits
    assert bm.num_free_blocks == 0
    assert not bm.allocate(b, 5)
    assert len(b.block_table) == 1
    bm.check_invariants([a, b])


def test_reserved_all_or_nothing_for_the_whole_reservation():
    bm = BlockManager(5, 4, "reserved")
    a = _req(0, 4, 8)  # 12 tokens -> 3 blocks
    b = _req(1, 2, 10)  # 12 tokens -> 3 blocks: only 2 left once a holds 3
    assert bm.allocate(a, 1)
    assert len(a.block_table) == 3
    assert not bm.allocate(b, 1)  # a single prompt token would fit paged, not reserved
    assert b.block_table == [] and bm.num_free_blocks == 2


def test_free_returns_blocks_and_reuses_most_recent_first():
    bm = BlockManager(6, 2)
    a, b = _req(0, 4, 2), _req(1, 4, 2)
    assert bm.allocate(a, 4) and bm.allocate(b, 4)
    a_blocks = list(a.block_table)
    bm.free(a)
    assert a.block_table == [] and bm.num_free_blocks == 4
    bm.check_invariants([a, b])
    # The freed request's first block comes back first.
    c = _req(2, 2, 2)
    assert bm.allocate(c, 2)
    assert c.block_table == [a_blocks[0]]
    # Freeing twice is harmless (the table is already empty).
    bm.free(a)
    bm.check_invariants([a, b, c])


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "block_size", "paged", "reserved"),
    [
        # paged needs prompt + max_tokens - 1 tokens (the last token's KV is never written)
        (4, 4, 4, 2, 2),  # 7 -> 2 ; 8 -> 2
        (4, 5, 4, 2, 3),  # 8 -> 2 ; 9 -> 3
        (1, 1, 16, 1, 1),  # 1 -> 1 ; 2 -> 1
        (16, 1, 16, 1, 2),  # 16 -> 1 ; 17 -> 2
        (100, 28, 16, 8, 8),  # 127 -> 8 ; 128 -> 8
        (100, 29, 16, 8, 9),  # 128 -> 8 ; 129 -> 9
        (10, 10, 1, 19, 20),
    ],
)
def test_max_blocks_hand_computed(prompt, max_tokens, block_size, paged, reserved):
    r = _req(0, prompt, max_tokens)
    assert BlockManager(100, block_size, "paged").max_blocks(r) == paged
    assert BlockManager(100, block_size, "reserved").max_blocks(r) == reserved


def test_can_ever_fit_hand_computed():
    r = _req(0, 10, 7)  # paged: 16 tokens -> 4 blocks of 4; reserved: 17 -> 5
    assert BlockManager(4, 4, "paged").can_ever_fit(r)
    assert not BlockManager(3, 4, "paged").can_ever_fit(r)
    assert not BlockManager(4, 4, "reserved").can_ever_fit(r)
    assert BlockManager(5, 4, "reserved").can_ever_fit(r)
