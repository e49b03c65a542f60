"""Sampling parameters live in persistent per-slot device tensors (issue 12 item 13): a steady
non-greedy batch copies none of them after its first step; a request joining copies its own
slot's row only; a request leaving copies nothing.

Counted two ways: the slots' own ``uploads`` (rows copied) and, independently, PyTorch's
in-place version counter of every device tensor (bumped by any write into it), with the tensor
objects themselves unchanged (never re-created). The runner is the real one (tiny model, CPU).
"""

from __future__ import annotations

import numpy as np
import torch
from runner_harness import Harness, make_request

from cbbench.engine.core.request import SamplingParams


def _sampling(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=seed)


def _versions(slots) -> dict[str, tuple[int, int]]:
    return {name: (id(t), t._version) for name, t in slots.dev.items()}


def _device_matches_host(slots, used: list[int]) -> None:
    for name, tensor in slots.dev.items():
        # Its own memory, as on a GPU: a tensor sharing the host array would match it always.
        assert tensor.data_ptr() != slots.host[name].ctypes.data, name
        assert np.array_equal(tensor.cpu().numpy()[used], slots.host[name][used]), name


def test_steady_batch_uploads_nothing_and_a_join_uploads_its_row_only():
    h = Harness()
    slots = h.runner.sampling_slots
    a, b, c = (make_request(i, 5 + i, _sampling(seed=i)) for i in range(3))
    h.step([(a, 5), (b, 6)])  # both prefill and sample: their slots are set and uploaded
    first = slots.uploads
    assert first >= 2 and slots.dev is not None
    before = _versions(slots)

    for _ in range(3):  # the same requests decoding: nothing to copy
        assert all(t is not None for t in h.step([(a, 1), (b, 1)]))
    assert slots.uploads == first
    assert _versions(slots) == before

    h.step([(a, 1), (b, 1), (c, 7)])  # c joins
    assert slots.uploads == first + 1
    after_join = _versions(slots)
    for name, (ident, version) in after_join.items():
        assert ident == before[name][0] and version == before[name][1] + 1, name
    used = sorted(h.runner.batch._slot_of[r] for r in (a, b, c))
    _device_matches_host(slots, used)

    h.step([(a, 1), (c, 1)])  # b leaves
    h.step([(a, 1), (c, 1)])
    assert slots.uploads == first + 1
    assert _versions(slots) == after_join


def test_greedy_batches_upload_nothing():
    h = Harness()
    slots = h.runner.sampling_slots
    a, b = make_request(0, 5), make_request(1, 6)
    h.step([(a, 5), (b, 6)])
    h.step([(a, 1), (b, 1)])
    assert slots.uploads == 0 and slots.dev is None


def test_a_joined_slot_samples_as_a_fresh_upload_would():
    """The partial upload is complete: tokens drawn with the persistent tensors equal those of
    parameters uploaded from scratch for the same rows (Sampler's one-shot path)."""
    from cbbench.engine.torch.sampler import Sampler

    h = Harness()
    reqs = [make_request(i, 4 + i, _sampling(seed=10 + i)) for i in range(3)]
    h.step([(reqs[0], 4), (reqs[1], 5)])
    h.step([(reqs[0], 1), (reqs[1], 1), (reqs[2], 6)])  # the third joins: a partial upload
    slots = h.runner.sampling_slots
    used = np.array([h.runner.batch._slot_of[r] for r in reqs])
    num_tokens = np.array([r.num_tokens for r in reqs], np.int64)
    rows = slots.rows(used, num_tokens, lambda _, arr: torch.from_numpy(arr))
    logits = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    sampler = Sampler()
    assert torch.equal(sampler.sample_rows(logits, rows), sampler(logits, reqs))
