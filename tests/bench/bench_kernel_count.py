"""Device kernels one decode step launches, per layer and per step, counted on the CPU.

The default CUDA configuration (Llama-3-8B, bf16, triton attention, block size 16, CUDA graphs:
decode metadata as the captured graph sees it, ``max_seqlen_k = max_model_len``, 132 SMs as on
an H100/H200) runs its real Python: the model, the attention backend, the layer ops, the logits
and greedy sampling. Tensors live on the ``meta`` device (shapes, no data: Llama-3-8B costs no
memory) and every Triton launch is intercepted through ``kernels.triton_common.launch``, counted
and not run. Two counters:

- aten ops, with a ``TorchDispatchMode`` (it sees each op as the dispatcher receives it). An op
  counts as one kernel unless it cannot launch one: allocation/metadata ops (empty*, detach,
  alias), and ops whose schema may return an alias of an input when their output really
  shares an input's storage (views: view, split, chunk, t, unsqueeze, ...; ``to``, ``reshape``
  and ``contiguous`` count only when they copied). ``linear`` is one cuBLAS GEMM. Host syncs
  (``_local_scalar_dense``, nonzero) are listed apart.
- Triton launches, one each.

What is not counted: cuBLAS may launch a second (split-K reduction) kernel for some GEMM
shapes, unknowable without the GPU; the model runner's host-to-device copies of the step's
inputs before a graph replay are outside the model and left out. ``tests/kernels/test_fused_kernel_count.py``
checks that this counting matches a real CPU run (Triton interpreted, real tensors).

    python tests/bench/bench_kernel_count.py --json results/kernel_count.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

COMMAND = "python tests/bench/bench_kernel_count.py --json results/kernel_count.json"
BATCH_SIZES = (1, 64, 256)
NO_KERNEL_OPS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
    "lift_fresh", "lift_fresh_copy_",
}  # fmt: skip
SYNC_OPS = {"_local_scalar_dense", "nonzero", "item", "masked_select", "is_nonzero"}


def _storages(tree) -> list:
    return [t.untyped_storage()._cdata for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def launches_kernel(func, args, kwargs, out) -> bool:
    """False for allocations, and for ops that returned views of their inputs."""
    if func.overloadpacket.__name__ in NO_KERNEL_OPS:
        return False
    may_alias = any(
        r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns
    )
    if not may_alias:
        return True
    inputs = set(_storages((args, kwargs)))
    return any(s not in inputs for s in _storages(out))  # it had to copy


class LaunchCounter(TorchDispatchMode):
    """Records ``(scope, op)`` for every kernel launch; ``scope`` is set by module hooks."""

    def __init__(self, execute_triton: bool) -> None:
        super().__init__()
        self.scope = "other"
        self.launches: list[tuple[str, str]] = []
        self.syncs: list[str] = []
        self.execute_triton = execute_triton

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.syncs.append(name)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if launches_kernel(func, args, kwargs, out):
            self.launches.append((self.scope, name))
        return out

    def on_triton_launch(self, kernel, grid, args, kwargs) -> None:
        from cbbench.kernels.triton_common import kernel_name

        self.launches.append((self.scope, "triton:" + kernel_name(kernel)))
        if (
            self.execute_triton
        ):  # run it, unseen: the interpreter's own torch calls are not launches
            with torch.utils._python_dispatch._disable_current_modes():
                kernel[grid](*args, **kwargs)


@dataclass
class Count:
    launches_per_layer: int
    launches_per_step: int
    layer_ops: list[str]  # one layer's launches in order (a middle layer; all after 0 agree)
    other_ops: list[str]  # outside the layers: embedding, final norm, logits, sampling
    host_syncs: list[str] = field(default_factory=list)
    first_layer: int = 0  # launches of layer 0 (no residual add before its first norm)


def count_decode_step(config, dtype, device, batch_size: int, fused: bool, block_size: int,
                      execute_triton: bool = False, seq_len: int | None = None) -> Count:  # fmt: skip
    """Count one pure-decode step of ``batch_size`` requests as the decode graph runs it."""
    from cbbench.engine.torch.models.llama import (
        LlamaDecoderLayer,
        LlamaForCausalLM,
        allocate_kv_cache,
    )
    from cbbench.engine.torch.sampler import Sampler, SamplingBatch
    from cbbench.kernels import AttentionMetadata
    from cbbench.kernels.triton_attention import TritonBackend
    from cbbench.kernels.triton_common import intercept_launches

    torch.manual_seed(0)
    model = LlamaForCausalLM(config, TritonBackend(), dtype=dtype, device=device, fused=fused)
    blocks_per_seq = -(-config.max_model_len // block_size)
    num_blocks = blocks_per_seq if device == "meta" else batch_size * blocks_per_seq
    kv = allocate_kv_cache(config, num_blocks, block_size, dtype, device)
    seq = seq_len or config.max_model_len

    def i32(values):
        return torch.tensor(values, dtype=torch.int32).to(device)

    tables = [[(r * blocks_per_seq + b) % num_blocks for b in range(blocks_per_seq)]
              for r in range(batch_size)]  # fmt: skip
    metadata = AttentionMetadata(  # as ModelRunner._graph_metadata builds it
        cu_seqlens_q=i32(list(range(batch_size + 1))),
        seq_lens=i32([seq] * batch_size),
        max_seqlen_q=1,
        max_seqlen_k=config.max_model_len,
        block_tables=i32(tables),
        slot_mapping=torch.tensor(
            [t[(seq - 1) // block_size] * block_size + (seq - 1) % block_size for t in tables]
        ).to(device),  # fmt: skip
        block_size=block_size,
        cu_seqlens_k=i32([seq * i for i in range(batch_size + 1)]),
    )
    input_ids = torch.zeros(batch_size, dtype=torch.int64).to(device)
    positions = torch.full((batch_size,), seq - 1, dtype=torch.int64).to(device)
    logits_indices = torch.arange(batch_size).to(device)
    greedy = SamplingBatch([0.0] * batch_size, [0] * batch_size, [1.0] * batch_size,
                           [0] * batch_size)  # fmt: skip

    counter = LaunchCounter(execute_triton)
    layers = [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: setattr(counter, "scope", f"layer{i}"))
        layer.register_forward_hook(lambda m, a, o: setattr(counter, "scope", "other"))
    with torch.inference_mode(), intercept_launches(counter.on_triton_launch), counter:
        hidden = model(input_ids, positions, kv, metadata)  # what the decode graph replays
        logits = model.compute_logits(hidden[logits_indices])  # ModelRunner.compute_logits
        Sampler().sample(logits, greedy)  # greedy rows: one argmax

    per_layer = collections.defaultdict(list)
    other = []
    for scope, op in counter.launches:
        (per_layer[scope] if scope != "other" else other).append(op)
    if len(per_layer) != config.num_layers:
        raise RuntimeError(f"{len(per_layer)} of {config.num_layers} layers launched anything")
    # Layer 0 has no residual to add before its first norm; every later layer is the same.
    later = {len(per_layer[f"layer{i}"]) for i in range(1, config.num_layers)}
    if len(later) > 1:
        raise RuntimeError(f"layers after the first launch different counts: {sorted(later)}")
    middle = per_layer[f"layer{config.num_layers // 2}"]
    return Count(
        len(middle), len(counter.launches), middle, other, counter.syncs,
        first_layer=len(per_layer["layer0"]),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="output file")
    parser.add_argument("--model", default="llama-3-8b", help="a model preset")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # nothing runs: launches are only counted

    from cbbench.engine.model_config import MODEL_PRESETS
    from cbbench.kernels.triton_decode_split import DEFAULT_NUM_SMS, num_kv_splits

    config = MODEL_PRESETS[args.model]
    dtype = torch.bfloat16
    by_batch = {}
    for bs in BATCH_SIZES:
        row = {}
        for label, fused in (("fused", True), ("unfused", False)):
            c = count_decode_step(config, dtype, "meta", bs, fused, args.block_size)
            row[label] = asdict(c)
        row["decode_splits"] = num_kv_splits(
            bs, config.num_kv_heads, config.max_model_len, DEFAULT_NUM_SMS
        )
        by_batch[str(bs)] = row
    head = by_batch[str(BATCH_SIZES[0])]
    base_config = {
        "model": config.name, "num_layers": config.num_layers, "dtype": "bf16",
        "attention_backend": "triton", "block_size": args.block_size, "cuda_graphs": True,
        "max_seqlen_k": config.max_model_len, "num_sms": DEFAULT_NUM_SMS,
        "batch_size": BATCH_SIZES[0], "sampling": "greedy",
    }  # fmt: skip
    out = {
        "launches_per_layer": head["fused"]["launches_per_layer"],
        "launches_per_step": head["fused"]["launches_per_step"],
        "config": {**base_config, "fused": True},
        "before": {
            "launches_per_layer": head["unfused"]["launches_per_layer"],
            "launches_per_step": head["unfused"]["launches_per_step"],
            "config": {**base_config, "fused": False},
            "note": "the PyTorch layer ops (LayerOps, the pre-fusion model code) with the same "
            "triton attention; at batch 1 attention is 2 launches (split-K) in both",
        },
        "by_batch_size": by_batch,
        "per_step_includes": "every layer; embedding, final norm, logits-row gather, lm_head, "
        "float cast, greedy argmax. Excluded: the runner's input copies before a graph replay, "
        "cuBLAS split-K reduction kernels",
        "counting": __doc__.split("\n\n")[1].replace("\n", " "),
        "command": COMMAND,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.json).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(args.json)
    for bs, row in by_batch.items():
        print(
            f"batch {bs:>3}: per layer {row['unfused']['launches_per_layer']:>3} unfused -> "
            f"{row['fused']['launches_per_layer']:>2} fused; per step "
            f"{row['unfused']['launches_per_step']:>5} -> {row['fused']['launches_per_step']:>4}"
            f" (split-K splits {row['decode_splits']})"
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main())
