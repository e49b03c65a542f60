"""summary.json and summary.md from what tests/gpu/gpu_check.sh left in its folder.

The headline fields (issue 12), each null where this run could not measure it (a CPU smoke
run, a step that failed, a field another part of the project does not write yet):

- ``decode_step_ms``: {"eager" | "graphs": {batch size: mean step ms}} for the default layer
  kernels (fused where they ran), ``decode_step_ms_unfused`` the same unfused, and
  ``decode_step_ms_torch_backend`` for the ``torch`` attention backend;
- ``decode_floor_ms``: {batch size: ms} the roofline floor of a decode step, the sum over its
  operators of max(bytes / peak bandwidth, FLOPs / peak FLOP/s); ``decode_floor_terms_ms``:
  {batch size: {"bytes": ms, "flops": ms}} both terms of it, whole-step;
- ``mbu``: {"eager" | "graphs": {batch size: roofline floor / step}};
- ``sim_error``: the simulator's error on the real runs (``summary.engine.sim_error``);
- ``kernel_compilations_during_run``: Triton compilations inside each timed ShareGPT run;
- ``fallbacks``: one line per fallback the check took (Triton could not launch, a graph
  capture failed);
- ``backends_agree``: {backend: max |logits - reference|}, with a ``triton+fused`` row (the
  Triton backend with the fused layer kernels); ``backends_agree_fused_vs_unfused``: that row's
  logits against the unfused Triton row's (the same fed tokens);
- ``sim_accuracy``: the simulator calibrated on the continuous run predicting the static run
  (tests/gpu/gpu_check_sim.py), or null with ``sim_accuracy_why_not``;
- ``anchor``: Hugging Face generate on the same device (tests/gpu/gpu_check_anchor.py);
  ``ratio_to_anchor``: cbbench / HF, ``decode_step_ms`` {1, 16} (< 1: cbbench faster) and
  ``output_throughput`` {continuous, static} (> 1: cbbench faster), null with ``why_not``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from gpu_check_anchor import anchor_ratios
from gpu_check_sim import markdown_line, sim_accuracy

RUNS = {"continuous": "sharegpt_h200.json", "static": "sharegpt_h200_static.json"}
FALLBACKS_FILE = "fallbacks.txt"  # written by gpu_check.sh, one reason per line


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except Exception:  # noqa: BLE001 - a missing or broken file is "no data"
        return None


def _steps(folder: Path) -> list[dict]:
    rows = []
    f = folder / "steps.tsv"
    if f.is_file():
        for line in f.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0] != "step":
                rows.append(
                    {
                        "step": parts[0],
                        "rc": parts[1],
                        "seconds": parts[2],
                        "limit_s": parts[3],
                        "note": parts[4] if len(parts) > 4 else "",
                    }
                )
    return rows


def _pytest_line(folder: Path) -> str | None:
    f = folder / "pytest_cuda.log"
    if not f.is_file():
        return None
    lines = [ln.strip() for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if any(w in ln for w in (" passed", " failed", " skipped", " error", "no tests ran")):
            return ln.strip("= ")
    return lines[-1] if lines else None


def _run_summary(path: Path) -> dict | None:
    d = _load(path)
    if not isinstance(d, dict) or "summary" not in d:
        return None
    s = d["summary"]
    eng = s.get("engine", {}) or {}

    def dist(key):
        v = s.get(key) or {}
        return {k: v.get(k) for k in ("mean", "p50", "p99")} if isinstance(v, dict) else None

    cfg = d.get("config", {})
    return {
        "file": path.name,
        "device": cfg.get("device"),
        "scheduler": cfg.get("scheduler"),
        "attention_backend": cfg.get("attention_backend"),
        "fused_kernels": cfg.get("fused_kernels"),
        "cuda_graphs": cfg.get("cuda_graphs"),
        "cuda_graphs_effective": cfg.get("cuda_graphs_effective"),
        "cuda_graphs_reason": cfg.get("cuda_graphs_reason"),
        "cuda_graphs_mixed_effective": cfg.get("cuda_graphs_mixed_effective"),
        "cuda_graphs_mixed_reason": cfg.get("cuda_graphs_mixed_reason"),
        "interrupted": d.get("interrupted"),
        "completed": s.get("completed"),
        "failed": s.get("failed"),
        "duration_s": s.get("duration_s"),
        "request_throughput": s.get("request_throughput"),
        "output_throughput": s.get("output_throughput"),
        "total_token_throughput": s.get("total_token_throughput"),
        "ttft_ms": dist("ttft_ms"),
        "tpot_ms": dist("tpot_ms"),
        "itl_ms": dist("itl_ms"),
        "e2el_ms": dist("e2el_ms"),
        "num_iterations": eng.get("num_iterations"),
        "mean_iteration_ms": eng.get("mean_iteration_ms"),
        "mbu": eng.get("mbu"),
        "decode_mbu": eng.get("decode_mbu"),
        "mfu": eng.get("mfu"),
        "kernel_compilations_during_run": eng.get("kernel_compilations_during_run"),
        "sim_error": eng.get("sim_error"),
        # The device profile sim_error was computed with (none: the detected GPU's spec).
        "gpu_profile": Path(cfg["gpu_profile"]).name if cfg.get("gpu_profile") else None,
        "telemetry": _telemetry_summary(d.get("telemetry") or {}),
    }


def _telemetry_summary(tel: dict) -> dict:
    """Did GPM work on this GPU (metric), and how does the measured DRAM bandwidth utilization
    compare with the analytic MBU over the steady state."""
    steady = ((tel.get("summary") or {}).get("steady") or {}).get("dram_bw_util_pct") or {}
    return {
        "available": tel.get("available"),
        "reason": tel.get("reason"),
        "error": tel.get("error"),
        "metric": tel.get("metric"),  # dram_bw_util_gpm means GPM works here
        "num_samples": len(tel.get("samples") or []),
        "steady_dram_bw_util_pct_mean": steady.get("mean"),
        "steady_dram_bw_util_pct_p90": steady.get("p90"),
    }


def decode_fields(dec: dict | None, batch_sizes: list[int]) -> dict:
    """The headline decode fields from decode.json; null unless measured on a GPU."""
    on_gpu = isinstance(dec, dict) and dec.get("device") == "cuda"
    rows = dec.get("rows", []) if on_gpu else []

    def table(pick, value) -> dict:
        out = {}
        for mode, graphs in (("eager", False), ("graphs", True)):
            out[mode] = {str(bs): None for bs in batch_sizes}
            for r in rows:
                if r.get("graphs") == graphs and pick(r) and str(r["batch_size"]) in out[mode]:
                    out[mode][str(r["batch_size"])] = value(r)
        return out

    main = [r for r in rows if r.get("role") == "main"]
    fused_ran = any(r.get("fused") for r in main)
    default = lambda r: r.get("role") == "main" and r.get("fused") == fused_ran  # noqa: E731
    unfused = lambda r: r.get("role") == "main" and not r.get("fused")  # noqa: E731
    torch_be = lambda r: r.get("role") == "torch_backend"  # noqa: E731
    step = lambda r: r["step_ms"]["mean"]  # noqa: E731
    floors = {str(bs): None for bs in batch_sizes}
    terms = {str(bs): None for bs in batch_sizes}
    for r in main:
        floors[str(r["batch_size"])] = r.get("floor_ms")
        terms[str(r["batch_size"])] = {"bytes": r.get("floor_bytes_ms"), "flops": r.get("floor_flops_ms")}
    agree = (dec or {}).get("backends_agree") or {}
    return {
        "decode_device": (dec or {}).get("device"),
        "decode_step_ms": table(default, step),
        "decode_step_ms_unfused": table(unfused, step),
        "decode_step_ms_torch_backend": table(torch_be, step)["eager"],
        "decode_fused_configuration": fused_ran if main else None,
        "decode_floor_ms": floors,
        "decode_floor_terms_ms": terms,
        "mbu": table(default, lambda r: r.get("mbu")),
        # Agreement is meaningful on any device (fp32 on a CPU); kept with its device.
        "backends_agree": agree.get("max_abs_diff"),
        "backends_agree_why_not": agree.get("why"),
        "backends_agree_fused_vs_unfused": agree.get("fused_vs_unfused"),
        # One layer's decode attention: the GQA-packed kernel beside the unified one (GPU only).
        "decode_attention_us": (dec or {}).get("decode_attention_us") if on_gpu else None,
        "kernel_table": (dec or {}).get("kernel_table"),
    }


def collect_fallbacks(folder: Path, dec: dict | None, runs: dict) -> list[str]:
    lines = []
    f = folder / FALLBACKS_FILE
    if f.is_file():
        lines += [ln.strip() for ln in f.read_text().splitlines() if ln.strip()]
    lines += list((dec or {}).get("graph_fallbacks") or [])
    for name, r in runs.items():
        if not (r and r.get("cuda_graphs") and r.get("device") == "cuda"):
            continue
        if not r.get("cuda_graphs_effective"):
            lines.append(f"sharegpt {name}: decode ran eagerly: {r.get('cuda_graphs_reason')}")
        if not r.get("cuda_graphs_mixed_effective"):
            lines.append(
                f"sharegpt {name}: mixed iterations ran eagerly: "
                f"{r.get('cuda_graphs_mixed_reason')}"
            )
    return lines


def build_summary(folder: Path) -> dict:
    dec = _load(folder / "decode.json")
    runs = {name: _run_summary(folder / file) for name, file in RUNS.items()}
    batch_sizes = sorted({r["batch_size"] for r in (dec or {}).get("rows", [])}) or [1, 16, 64, 256]
    accuracy, accuracy_why_not = sim_accuracy(folder)
    summary = {
        "folder": folder.name,
        **decode_fields(dec, batch_sizes),
        "sim_error": {n: (r or {}).get("sim_error") for n, r in runs.items()},
        "kernel_compilations_during_run": {
            n: (r or {}).get("kernel_compilations_during_run") for n, r in runs.items()
        },
        "sim_accuracy": accuracy,
        "sim_accuracy_why_not": accuracy_why_not,
        "fallbacks": collect_fallbacks(folder, dec, runs),
        "steps": _steps(folder),
        "env": _load(folder / "env.json"),
        "pytest_cuda": _pytest_line(folder),
        "decode": dec,
        "sharegpt_continuous": runs["continuous"],
        "sharegpt_static": runs["static"],
    }
    anchor = _load(folder / "anchor.json")
    summary["anchor"] = anchor
    summary["ratio_to_anchor"] = anchor_ratios(summary, anchor)
    c, s = runs["continuous"], runs["static"]
    if c and s and c.get("output_throughput") and s.get("output_throughput"):
        summary["continuous_over_static_output_throughput"] = (
            c["output_throughput"] / s["output_throughput"]
        )
    summary["poisson"] = poisson_point(folder)
    return summary


POISSON_RUNS = {"continuous": "poisson_continuous.json", "static": "poisson_static.json"}


def _ratio(a, b) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def poisson_point(folder: Path) -> dict | None:
    """The Poisson point (gpu_check.sh: a rate of POISSON_LOAD x the continuous run's request
    throughput, each scheduler): both runs' figures and continuous / static ratios of output
    throughput (> 1: continuous serves more) and of TTFT and end-to-end latency p50 (< 1:
    continuous answers sooner). None when the step did not run."""
    rate_file = folder / "poisson_rate.txt"
    if not rate_file.is_file():
        return None
    runs = {k: _run_summary(folder / f) for k, f in POISSON_RUNS.items()}
    c, s = runs["continuous"] or {}, runs["static"] or {}

    def p50(r, key):
        return (r.get(key) or {}).get("p50")

    return {
        "request_rate": float(rate_file.read_text().strip()),
        "continuous": runs["continuous"],
        "static": runs["static"],
        "continuous_over_static": {
            "output_throughput": _ratio(c.get("output_throughput"), s.get("output_throughput")),
            "ttft_p50_ms": _ratio(p50(c, "ttft_ms"), p50(s, "ttft_ms")),
            "e2el_p50_ms": _ratio(p50(c, "e2el_ms"), p50(s, "e2el_ms")),
        },
    }


def _f(x, fmt="{:.1f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return fmt.format(x) if isinstance(x, (int, float)) else str(x)


def decode_markdown(d: dict) -> str:
    env = d["env"]
    a = d["args"]
    lines = [
        f"Decode step, {a['model']} random weights, {a['dtype']}, context {a['context']} "
        f"tokens/request, {a['steps']} timed steps after {a['warmup']} warm-up; "
        f"{env.get('device_name', a['device'])}, torch {env['torch']}, triton {env.get('triton')}. "
        f"Floor = bytes a decode step reads (weights without the input embedding table "
        f"{d['decode_weight_bytes'] / 1e9:.2f} GB + the batch's embedding rows + KV read) / "
        f"{d['peak_bw'] / 1e12:.2f} TB/s (batch 1, weights only: "
        f"{d['min_step_ms_weights_only']:.2f} ms); floor = sum over operators of max(bytes / "
        f"bandwidth, FLOPs / {d.get('peak_flops', 0) / 1e12:.0f} TFLOP/s) (bytes and FLOPs terms "
        f"beside it); MBU = floor / time. KV cache: {d.get('kv_cache_fill', 'zeros')}.",
        "",
        "| backend | fused | batch | CUDA graphs | step ms (mean / p50 / min) | forward ms | "
        "floor ms (bytes / FLOPs term) | MBU (step) | MBU (forward) | tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        s = r["step_ms"]
        lines.append(
            f"| {r['attention_backend']} | {'yes' if r['fused'] else 'no'} | {r['batch_size']} | "
            f"{'yes' if r['graphs'] else 'no'} | {s['mean']:.3f} / {s['p50']:.3f} / "
            f"{s['min']:.3f} | {r['forward_ms']:.3f} | {r['floor_ms']:.3f} "
            f"({_f(r.get('floor_bytes_ms'), '{:.3f}')} / {_f(r.get('floor_flops_ms'), '{:.3f}')}) | "
            f"{r['mbu']:.1%} | "
            f"{r['mbu_forward']:.1%} | {r['tokens_per_s']:.0f} |"
        )
    for key in ("graphs_skipped", "fused_skipped"):
        if d.get(key):
            lines.append(f"\n{key.replace('_', ' ')}: {d[key]}.")
    for e in d.get("errors", []):
        lines.append(f"\nERROR {str(e)[:400]}")
    att = d.get("decode_attention_us")
    if att:
        lines += ["", f"Decode attention alone, one layer, context {att['context']} (µs, timed "
                  "inside a CUDA graph; split: the engine's choice, splits "
                  f"{json.dumps(att.get('splits'))}):", ""]  # fmt: skip
        for kernel, by_bs in att["us"].items():
            frac = att["bandwidth_fraction"][kernel]
            lines.append(f"- {kernel}: " + ", ".join(
                f"batch {bs} {us:.1f} µs ({frac[bs]:.0%} of bandwidth)" for bs, us in by_bs.items()))  # fmt: skip
    from gpu_check_profile import kernel_markdown

    table = kernel_markdown(d.get("kernel_table"))
    return "\n".join(lines) + "\n" + ("\n" + table if table else "")


def summary_markdown(summary: dict) -> str:
    md = ["# GPU check summary", ""]
    env = summary["env"] or {}
    if env:
        md.append(
            "Environment: "
            + ", ".join(
                f"{k} {v}"
                for k, v in env.items()
                if not isinstance(v, (dict, list)) and k != "executable"
            )
        )
        md.append(f"Missing modules: {', '.join(env.get('missing_modules') or []) or 'none'}; "
                  f"C compiler: {(env.get('c_compiler') or {}).get('version')}; Python.h found: "
                  f"{(env.get('python_h') or {}).get('found')}")  # fmt: skip
        md.append("")
    fallbacks = summary["fallbacks"]
    md.append("Fallbacks: " + ("; ".join(fallbacks) if fallbacks else "none"))
    md.append(
        "Triton compilations during the timed runs: "
        + ", ".join(f"{k} {_f(v, '{}')}" for k, v in summary["kernel_compilations_during_run"].items())
    )
    md.append(
        "Simulator error on the real runs: "
        + ", ".join(f"{k} {json.dumps(v)}" for k, v in summary["sim_error"].items())
    )
    md.append(markdown_line(summary["sim_accuracy"], summary["sim_accuracy_why_not"]))
    ratio = summary.get("ratio_to_anchor") or {}
    md.append("cbbench / HF generate on the same device: decode step time "
              f"{json.dumps(ratio.get('decode_step_ms'))}, output throughput "
              f"{json.dumps(ratio.get('output_throughput'))}"
              + (f" (missing: {json.dumps(ratio.get('why_not'))})" if ratio.get("why_not") else ""))  # fmt: skip
    md.append(f"Backends vs reference (max |logit diff|): {json.dumps(summary['backends_agree'])}")
    md.append("Fused vs unfused layer kernels (Triton attention, max |logit diff|): "
              f"{json.dumps(summary.get('backends_agree_fused_vs_unfused'))}")  # fmt: skip
    md += ["", "| step | rc | seconds | limit | note |", "|---|---|---|---|---|"]
    md += [
        f"| {r['step']} | {r['rc']} | {r['seconds']} | {r['limit_s']} | {r['note']} |"
        for r in summary["steps"]
    ]
    md += ["", f"pytest (CUDA test files): {summary['pytest_cuda'] or 'no log'}", ""]
    dec = summary["decode"]
    if isinstance(dec, dict) and dec.get("rows"):
        md += ["## Decode step", "", decode_markdown(dec)]
    elif isinstance(dec, dict):
        md += ["## Decode step", "", f"no rows: {dec.get('fatal') or dec.get('errors')}", ""]
    md += [
        "## ShareGPT runs (cbbench run --engine torch)",
        "",
        "| run | completed / failed | duration s | out tok/s | req/s | TTFT p50 / p99 ms | "
        "TPOT p50 / p99 ms | iterations | decode MBU | graphs | interrupted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = (("continuous", summary["sharegpt_continuous"]), ("static", summary["sharegpt_static"]))
    for name, r in runs:
        if not r:
            md.append(f"| {name} | no result | | | | | | | | | |")
            continue
        t, p = r["ttft_ms"] or {}, r["tpot_ms"] or {}
        md.append(
            f"| {name} | {r['completed']} / {r['failed']} | {_f(r['duration_s'])} | "
            f"{_f(r['output_throughput'], '{:.0f}')} | {_f(r['request_throughput'], '{:.2f}')} | "
            f"{_f(t.get('p50'))} / {_f(t.get('p99'))} | {_f(p.get('p50'), '{:.2f}')} / "
            f"{_f(p.get('p99'), '{:.2f}')} | {_f(r['num_iterations'], '{}')} | "
            f"{_f(r['decode_mbu'], '{:.1%}')} | {r['cuda_graphs_effective']} | "
            f"{r['interrupted']} |"
        )
    md += [
        "",
        "## GPU telemetry (NVML) vs analytic MBU",
        "",
        "| run | telemetry | metric | samples | measured DRAM BW util mean / p90 (steady) | "
        "analytic MBU / decode MBU |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in runs:
        tel = (r or {}).get("telemetry") or {}
        md.append(
            f"| {name} | {tel.get('available')} {tel.get('reason') or ''} | {tel.get('metric')} | "
            f"{tel.get('num_samples')} | {_f(tel.get('steady_dram_bw_util_pct_mean'))}% / "
            f"{_f(tel.get('steady_dram_bw_util_pct_p90'))}% | "
            f"{_f((r or {}).get('mbu'), '{:.1%}')} / {_f((r or {}).get('decode_mbu'), '{:.1%}')} |"
        )
    if "continuous_over_static_output_throughput" in summary:
        md += [
            "",
            "Continuous / static output throughput: "
            f"{summary['continuous_over_static_output_throughput']:.2f}x",
        ]
    md += poisson_markdown(summary.get("poisson"))
    return "\n".join(md) + "\n"


def poisson_markdown(point: dict | None) -> list[str]:
    if not point:
        return ["", "Poisson point: not run"]
    r = point["continuous_over_static"]
    md = ["", f"## Poisson arrivals at {point['request_rate']:g} req/s (continuous / static)", "",
          "| run | completed | out tok/s | TTFT p50 ms | E2E p50 ms |", "|---|---|---|---|---|"]  # fmt: skip
    for name in ("continuous", "static"):
        run = point[name] or {}
        md.append(f"| {name} | {_f(run.get('completed'), '{}')} | "
                  f"{_f(run.get('output_throughput'), '{:.0f}')} | "
                  f"{_f((run.get('ttft_ms') or {}).get('p50'))} | "
                  f"{_f((run.get('e2el_ms') or {}).get('p50'))} |")  # fmt: skip
    md.append(f"| continuous / static | | {_f(r['output_throughput'], '{:.2f}x')} | "
              f"{_f(r['ttft_p50_ms'], '{:.2f}x')} | {_f(r['e2el_p50_ms'], '{:.2f}x')} |")  # fmt: skip
    return md


def summarize_folder(folder: Path) -> dict:
    summary = build_summary(folder)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    text = summary_markdown(summary)
    (folder / "summary.md").write_text(text)
    print(text)
    return summary
