"""``bench_gpu.py decode``'s per-kernel table: where each microsecond of a decode step goes.

``torch.profiler`` over a few steps at the smallest and the largest batch size (1 and 256 on
the GPU check): on CUDA the steps are CUDA-graph replays (the engine's decode path; CUPTI
records the kernels inside a graph), on a CPU eager steps and the table holds operators. For
each of the top kernels by time: calls per step, µs per step, its share of the step's kernel
time and, where its bytes are known, the bandwidth it achieved:

- attention kernels (Triton, by name): the batch's KV read per layer call;
- GEMMs: attributed from an eager profile of the same step with the operators' input shapes
  (``aten::mm`` / ``aten::addmm`` / ``aten::linear``: bytes = both operands + the output), as
  a second table, since a graph replay has no operators to attribute kernels to.

UNTESTED on a GPU so far; the CPU smoke test runs it end to end (operators, no bandwidth).
"""

from __future__ import annotations

from collections import defaultdict

TOP_KERNELS = 12
PROFILE_STEPS = 5
PROFILE_WARMUP = 2
ATTENTION_KERNELS = ("_split_decode_kernel", "_split_merge_kernel", "_packed_decode_kernel",
                     "_paged_attention_kernel")  # fmt: skip
# The innermost GEMM operators (aten::linear and aten::matmul wrap them: counting those too
# would count each GEMM three times). The engine's own Triton split-K GEMMs are kernels with no
# operator: they appear in the replay table, without bandwidth.
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm")
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _device_time_us(evt) -> float:
    """Self device time of a profiler event (the attribute's name changed across versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(evt, name, None)
        if v:
            return float(v)
    return 0.0


def _is_kernel(evt) -> bool:
    from torch.autograd import DeviceType

    return getattr(evt, "device_type", None) == DeviceType.CUDA


def _profile(fn, steps: int, cuda: bool, shapes: bool):
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=shapes) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    return prof


def kernel_rows(prof, steps: int, cuda: bool, kv_bytes_per_call: float, peak_bw: float) -> dict:
    """Top kernels (CUDA) or operators (CPU) by self time, per step."""
    per_name: dict[str, dict] = defaultdict(lambda: {"us": 0.0, "calls": 0})
    for evt in prof.key_averages():
        if cuda:
            if not _is_kernel(evt):
                continue
            us = _device_time_us(evt)
        else:
            if evt.key.startswith("ProfilerStep"):
                continue
            us = float(evt.self_cpu_time_total)
        row = per_name[evt.key]
        row["us"] += us
        row["calls"] += evt.count
    total = sum(r["us"] for r in per_name.values()) or 1.0
    rows = []
    for name, r in sorted(per_name.items(), key=lambda kv: -kv[1]["us"])[:TOP_KERNELS]:
        us_step = r["us"] / steps
        row = {"name": name[:120], "calls_per_step": r["calls"] / steps, "us_per_step": us_step,
               "share": r["us"] / total, "gb_per_s": None, "of_peak": None}  # fmt: skip
        if cuda and any(k in name for k in ATTENTION_KERNELS[:1] + ATTENTION_KERNELS[2:]):
            # The kernel that reads the KV (the merge reads the partials only).
            bytes_step = kv_bytes_per_call * r["calls"] / steps
            if us_step > 0:
                row["gb_per_s"] = bytes_step / (us_step * 1e-6) / 1e9
                row["of_peak"] = row["gb_per_s"] * 1e9 / peak_bw
        rows.append(row)
    return {"kind": "kernels" if cuda else "operators (CPU self time)", "total_us_per_step": total / steps,
            "rows": rows}  # fmt: skip


def _shape_bytes(shapes, element_bytes: int) -> int | None:
    """Bytes of a GEMM's tensor operands (every operand in the model's dtype)."""
    total = 0
    for shape in shapes or []:
        if not shape:
            continue
        n = 1
        for d in shape:
            n *= d
        total += n * element_bytes
    return total or None


def gemm_rows(prof, steps: int, cuda: bool, peak_bw: float, element_bytes: int) -> list[dict]:
    """The eager step's GEMM operators grouped by input shapes: time per step (device time on
    CUDA), bytes per call (operands; the output is small at decode) and achieved bandwidth."""
    rows = []
    for evt in prof.key_averages(group_by_input_shape=True):
        if evt.key not in GEMM_OPS:
            continue
        us = float(getattr(evt, "device_time_total", 0.0) or 0.0) if cuda else float(evt.cpu_time_total)
        nbytes = _shape_bytes(evt.input_shapes, element_bytes)
        us_step = us / steps
        bw = nbytes * evt.count / steps / (us_step * 1e-6) if nbytes and us_step > 0 else None
        rows.append({"op": evt.key, "shapes": str(evt.input_shapes)[:120],
                     "calls_per_step": evt.count / steps, "us_per_step": us_step,
                     "bytes_per_call": nbytes, "gb_per_s": bw / 1e9 if bw else None,
                     "of_peak": bw / peak_bw if bw else None})  # fmt: skip
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:TOP_KERNELS]


def kernel_profile(args, setup, device, batch_sizes: list[int], make_runner, make_sched) -> dict:
    """{batch size: {"replay": kernel table, "gemms": eager GEMM table}}; ``make_runner(graphs)``
    builds a warmed-up runner, ``make_sched(bs)`` a decode batch and its cleanup."""
    cuda = device.type == "cuda"
    out: dict = {"steps": PROFILE_STEPS, "graphs": cuda, "by_batch": {}}
    cfg = setup.config
    runners = {"replay": make_runner(cuda), "eager": make_runner(False) if cuda else None}
    try:
        for bs in batch_sizes:
            sched, release = make_sched(bs)
            try:
                kv_call = bs * (args.context + 1) * cfg.kv_bytes_per_token(setup.dtype_name) / cfg.num_layers
                runner = runners["replay"]
                for _ in range(PROFILE_WARMUP):
                    runner.execute(sched)
                prof = _profile(lambda r=runner, s=sched: r.execute(s), PROFILE_STEPS, cuda, shapes=not cuda)
                entry = {"replay": kernel_rows(prof, PROFILE_STEPS, cuda, kv_call, setup.peak_bw)}
                eager = runners["eager"] or runner
                if eager is not runner:
                    for _ in range(PROFILE_WARMUP):
                        eager.execute(sched)
                    prof = _profile(lambda r=eager, s=sched: r.execute(s), PROFILE_STEPS, cuda, shapes=True)
                entry["gemms"] = gemm_rows(prof, PROFILE_STEPS, cuda, setup.peak_bw,
                                           ELEMENT_BYTES[setup.dtype_name])
                out["by_batch"][str(bs)] = entry
            finally:
                release()
    finally:
        runners.clear()
    return out


def kernel_markdown(table: dict | None) -> str:
    """decode.md's per-kernel section."""
    if not table:
        return ""
    lines = [f"## Where the step's time goes (torch.profiler, {table['steps']} "
             f"{'graph replays' if table['graphs'] else 'eager steps'} per batch size)", ""]  # fmt: skip
    for bs, entry in table["by_batch"].items():
        rep = entry["replay"]
        lines += [f"Batch {bs}: {rep['kind']}, {rep['total_us_per_step']:.1f} µs per step in all.", "",
                  "| kernel | calls/step | µs/step | share | GB/s | of peak |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for r in rep["rows"]:
            lines.append(f"| `{r['name']}` | {r['calls_per_step']:g} | {r['us_per_step']:.1f} | "
                         f"{r['share']:.1%} | {_f(r['gb_per_s'], '{:.0f}')} | "
                         f"{_f(r['of_peak'], '{:.1%}')} |")  # fmt: skip
        if entry.get("gemms"):
            lines += ["", f"Batch {bs}: GEMMs of an eager step, by input shapes.", "",
                      "| op | shapes | calls/step | µs/step | MB/call | GB/s | of peak |",
                      "|---|---|---|---|---|---|---|"]  # fmt: skip
            for r in entry["gemms"]:
                mb = r["bytes_per_call"] / 1e6 if r["bytes_per_call"] else None
                lines.append(f"| {r['op']} | {r['shapes']} | {r['calls_per_step']:g} | "
                             f"{r['us_per_step']:.1f} | {_f(mb, '{:.2f}')} | "
                             f"{_f(r['gb_per_s'], '{:.0f}')} | {_f(r['of_peak'], '{:.1%}')} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines) + "\n"


def _f(x, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)
