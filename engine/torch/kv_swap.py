"""Swap preemption's data path: KV blocks copied between the device cache and a CPU pool."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .models.llama import KVCache


class KVSwapSpace:
    def __init__(
        self, kv_caches: list[KVCache], num_cpu_blocks: int, dtype: torch.dtype, device
    ) -> None:
        """The CPU block pool, laid out as the device cache ([blocks, block_size, kv_heads,
        head_dim] per layer, K and V); pinned on CUDA so copies run at full host bandwidth.
        ``empty``, not ``zeros``: a block is read only after a swap-out has written it."""
        self.kv_caches = kv_caches
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        shape = (num_cpu_blocks, *kv_caches[0][0].shape[1:])
        self.cpu_kv_caches = [
            tuple(
                torch.empty(shape, dtype=dtype, device="cpu", pin_memory=pin) for _ in range(2)
            )
            for _ in kv_caches
        ]

    @torch.inference_mode()
    def swap_blocks(
        self, swap_out: Sequence[tuple[int, int]], swap_in: Sequence[tuple[int, int]]
    ) -> float:
        """Copy (device block, CPU block) pairs out, then (CPU block, device block) pairs in:
        in that order, because a device block freed by a swap-out may receive a swap-in in the
        same step. Synchronous (the forward reads the swapped-in blocks, and the next step's
        swap-out may overwrite a CPU block read now). Returns the seconds spent."""
        t0 = time.perf_counter()
        dev = self.device
        if swap_out:
            src = torch.tensor([g for g, _ in swap_out], dtype=torch.int64, device=dev)
            dst = torch.tensor([c for _, c in swap_out], dtype=torch.int64)
            for gpu_kv, cpu_kv in zip(self.kv_caches, self.cpu_kv_caches, strict=True):
                for gpu_cache, cpu_cache in zip(gpu_kv, cpu_kv, strict=True):
                    cpu_cache[dst] = gpu_cache[src].to("cpu")
        if swap_in:
            src = torch.tensor([c for c, _ in swap_in], dtype=torch.int64)
            dst = torch.tensor([g for _, g in swap_in], dtype=torch.int64, device=dev)
            for gpu_kv, cpu_kv in zip(self.kv_caches, self.cpu_kv_caches, strict=True):
                for gpu_cache, cpu_cache in zip(gpu_kv, cpu_kv, strict=True):
                    gpu_cache[dst] = cpu_cache[src].to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0
