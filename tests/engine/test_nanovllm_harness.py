"""The nano-vllm host-path harness (tests/nanovllm_host_harness.py) does the work a decode step
needs, the same work cbbench's model runner does: for the same requests and block tables, its
``prepare_decode`` gives the positions, context lengths and slot mappings cbbench's persistent
batch builds, its scheduler appends a block exactly when a sequence crosses a block boundary,
and its postprocess hashes each block once, when it fills. So the ratio in
results/host_overhead.json compares equal work."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/ is not collected
from nanovllm_host_harness import NanoDecodeHarness  # noqa: E402

from cbbench.engine.core.request import Request, RequestStatus  # noqa: E402
from cbbench.engine.torch.input_batch import PersistentBatch  # noqa: E402

BLOCK = 16


def _cbbench_view(seqs) -> list[Request]:
    reqs = []
    for s in seqs:
        prompt = s.token_ids[: s.num_prompt_tokens]
        req = Request(s.seq_id, len(prompt), s.max_tokens, prompt_token_ids=prompt)
        req.output_token_ids = s.token_ids[s.num_prompt_tokens :]
        req.num_output_tokens = len(req.output_token_ids)
        req.num_computed_tokens = s.num_tokens - 1
        req.block_table = list(s.block_table)
        req.status = RequestStatus.RUNNING
        reqs.append(req)
    return reqs


def test_prepare_decode_matches_cbbench_persistent_batch():
    h = NanoDecodeHarness(5, 30, 100, 512, BLOCK, seed=3)
    for _ in range(4):  # crosses a block boundary for some of them (30 + 1 + 4 tokens)
        h.step()
    seqs = h.schedule()  # step 5's schedule: blocks appended where needed
    input_ids, positions, slots, context_lens, tables = h.prepare_decode(seqs)
    batch = PersistentBatch(8, 4096, BLOCK, lambda slot, req: None)
    reqs = _cbbench_view(seqs)
    host = batch.build(reqs, [1] * len(reqs))
    assert input_ids.tolist() == host.input_ids.tolist()
    assert positions.tolist() == host.positions.tolist()
    assert context_lens.tolist() == host.seq_lens.tolist()
    assert slots.tolist() == host.slot_mapping.tolist()
    width = host.block_tables.shape[1]
    assert (tables[:, :width].numpy() == host.block_tables).all()
    assert (tables[:, width:].numpy() == -1).all()


def test_blocks_appended_at_boundaries_and_hashed_once_full():
    h = NanoDecodeHarness(2, 15, 100, 512, BLOCK, seed=1)  # 16 tokens after prefill: 1 block
    seq = h.running[0]
    assert len(seq) == 16 and len(seq.block_table) == 1
    h.step()  # feeds the 16th token: the first block is now full of computed tokens
    assert len(seq.block_table) == 1 and h.blocks.hashes[seq.block_table[0]] != -1
    hashed = len(h.blocks.hash_to_block)
    assert hashed == 2  # both sequences' first blocks
    h.step()  # 17 tokens at schedule time: a block is appended for the 17th
    assert len(seq.block_table) == 2 and h.blocks.hashes[seq.block_table[1]] == -1
    for _ in range(BLOCK - 2):
        h.step()
    assert len(h.blocks.hash_to_block) == hashed  # nothing new filled
    h.step()
    assert len(h.blocks.hash_to_block) == hashed + 2  # both sequences' second blocks
    assert all(s.num_cached_tokens == 2 * BLOCK for s in h.running)
