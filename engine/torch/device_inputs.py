"""Persistent device buffers for a step's inputs, filled from persistent pinned host buffers.

Each step's packed inputs (ids, positions, slot mapping, sequence lengths, block tables, the
rows to sample) go host -> pinned staging -> a prefix of a device buffer that lives as long as
the runner, with one asynchronous copy per tensor: no allocation, no pageable copy, and the
CUDA graphs capture these very buffers, so a replay needs no device-to-device copy.

Reusing a pinned buffer is safe because every step ends with a host sync (the sampled tokens'
copy, or an explicit sync when nothing is sampled), so the previous step's copies have landed
before the next step writes the staging buffers again.

On the CPU without graphs the numpy arrays are the inputs (``torch.from_numpy``: no copy).
"""

from __future__ import annotations

import numpy as np
import torch

_INT32 = (np.int32, torch.int32)
_INT64 = (np.int64, torch.int64)


class DeviceInputs:
    def __init__(
        self,
        max_num_reqs: int,
        max_num_tokens: int,
        max_blocks_per_seq: int,
        device: torch.device,
        persistent: bool,
    ) -> None:
        self.device = device
        self.persistent = persistent
        if not persistent:
            return
        pin = device.type == "cuda"
        r, t = max_num_reqs, max(max_num_tokens, max_num_reqs)
        specs = {
            "input_ids": (t, _INT64),
            "positions": (t, _INT64),
            "slot_mapping": (t, _INT64),
            "seq_lens": (r, _INT32),
            "cu_seqlens_q": (r + 1, _INT32),
            "cu_seqlens_k": (r + 1, _INT32),
            "logits_indices": (t, _INT64),
            "sample_slots": (t, _INT64),
            "sample_num_tokens": (t, _INT64),
            "block_tables": (r * max_blocks_per_seq, _INT32),
        }
        self.host: dict[str, torch.Tensor] = {}
        self.host_np: dict[str, np.ndarray] = {}
        self.dev: dict[str, torch.Tensor] = {}
        for name, (size, (_, tdtype)) in specs.items():
            h = torch.zeros(size, dtype=tdtype, pin_memory=pin)
            self.host[name], self.host_np[name] = h, h.numpy()
            self.dev[name] = torch.zeros(size, dtype=tdtype, device=device)
        # Block tables are 2-D on the device so that a graph captured for batch size b reads
        # rows [:b] whatever width a step uploads; only columns a step covers are written.
        self.dev["block_tables"] = self.dev["block_tables"].view(max_num_reqs, max_blocks_per_seq)

    def upload(self, name: str, arr: np.ndarray, pad_to: int = 0, pad=None) -> torch.Tensor:
        """``arr`` on the device: a prefix view of the persistent buffer. ``pad_to``: also
        write rows ``len(arr):pad_to`` (``pad``: a value or an array of that many values) and
        return the prefix of ``pad_to`` rows (CUDA-graph replay)."""
        if not self.persistent:
            return torch.from_numpy(arr)
        n = arr.shape[0]
        total = max(n, pad_to)
        dev = self.dev[name]
        if total > dev.shape[0]:  # beyond the persistent buffers (an oversized step): one-off
            return torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)
        host = self.host_np[name]
        host[:n] = arr
        if total > n:
            host[n:total] = pad
        out = dev[:total]
        out.copy_(self.host[name][:total], non_blocking=True)
        return out

    def upload_block_tables(self, table: np.ndarray) -> torch.Tensor:
        """``[R, W]`` int32 -> the device view ``[R, W]`` of the persistent ``[R_max, W_max]``
        buffer (row stride W_max, unit column stride)."""
        if not self.persistent:
            return torch.from_numpy(table)
        r, w = table.shape
        dev = self.dev["block_tables"]
        if r > dev.shape[0] or w > dev.shape[1]:
            return torch.from_numpy(np.ascontiguousarray(table)).to(self.device)
        flat = self.host_np["block_tables"]
        flat[: r * w].reshape(r, w)[:] = table
        out = dev[:r, :w]
        out.copy_(self.host["block_tables"][: r * w].view(r, w), non_blocking=True)
        return out
