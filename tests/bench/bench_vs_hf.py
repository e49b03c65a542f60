"""cbbench's continuous batching (torch engine, CPU, fp32) against Hugging Face ``generate`` with
static batches, on the same random-weight model and the same requests, in one process.

Not collected by pytest (the file name does not start with ``test_``). Run from the repo root:

    python tests/bench/bench_vs_hf.py                 # writes results/cpu_vs_hf_generate.{json,md}
    python tests/bench/bench_vs_hf.py --profile       # also cProfile one cbbench run (top functions)

Model: a LlamaConfig (hidden 256, 4 layers, 4 heads / 2 KV heads, intermediate 688, vocab 4096)
with random weights, saved with ``save_pretrained`` to a temporary folder; cbbench loads it from
that folder (``--model FOLDER``) and HF uses the very same in-memory weights.

Requests: ``--num-requests`` drawn with ``--seed`` from cbbench's built-in ``sharegpt`` lengths,
prompt and output lengths divided by ``--scale`` (min 4), random prompt token ids, all arriving at
t = 0.

- cbbench: ``cbbench run --workload <jsonl> --engine torch --device cpu --dtype fp32 --model
  FOLDER`` through the real CLI (typer's CliRunner, in-process); throughput is the result's own
  ``output_throughput`` (output tokens / run duration, model loading and warm-up excluded), and
  the wall time around the whole invocation is reported beside it.
- HF: the requests in the same order cut into static batches of ``--hf-batch-size``, left-padded,
  greedy, ``min_new_tokens == max_new_tokens`` = the batch's longest output (a static batch runs
  until its longest member is done: that is static batching's cost). Only the *useful* tokens are
  counted -- each request's own output length -- not the padding steps of shorter members.

Rounds alternate (cbbench, HF, cbbench, HF, ...) after one untimed warm-up of each; the ratio is
taken per round and the median is reported.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
MODEL_SIZES = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=688,
    vocab_size=4096,
    max_position_embeddings=1024,
)


def make_requests(n: int, seed: int, scale: int, vocab: int) -> list[dict]:
    from cbbench.load.workload import load_workload, sample_requests

    wreqs, _ = sample_requests(load_workload("sharegpt"), n, seed)
    rng = np.random.default_rng(seed)
    reqs = []
    for w in wreqs:
        p = max(4, w.prompt_len // scale)
        o = max(4, w.output_len // scale)
        reqs.append({"prompt_token_ids": rng.integers(0, vocab, p).tolist(), "output_len": o})
    return reqs


def build_model(folder: Path):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**MODEL_SIZES)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


# ---- cbbench ----------------------------------------------------------------------------------
def cbbench_args(
    workload: Path, folder: Path, num_requests: int, out: Path, extra: list[str]
) -> list[str]:
    # --num-requests: without it (and without arrival_s) `cbbench run` draws its default 1000
    # requests from the file WITH replacement. With it, the file's requests are drawn without
    # replacement: the same set as HF's, in a seeded order.
    return [
        "run", "--workload", str(workload), "--engine", "torch", "--device", "cpu",
        "--dtype", "fp32", "--model", str(folder), "--num-requests", str(num_requests),
        "--output", str(out), *extra,
    ]  # fmt: skip


def run_cbbench(args: list[str], profile: cProfile.Profile | None = None) -> dict:
    from typer.testing import CliRunner

    from cbbench.cli.app import app

    out = Path(args[args.index("--output") + 1])
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    res = CliRunner().invoke(app, args)
    if profile is not None:
        profile.disable()
    wall = time.perf_counter() - t0
    if res.exit_code != 0:
        raise RuntimeError(f"cbbench failed ({res.exit_code}):\n{res.output}\n{res.exception!r}")
    data = json.loads(out.read_text())
    s = data["summary"]
    its = data["iterations"]
    return {
        "output_tokens": int(sum(r["output_tokens"] for r in data["requests"])),
        "completed": s["completed"],
        "duration_s": s["duration_s"],
        "output_tok_s": s["output_throughput"],
        "wall_s_incl_model_load": wall,
        "iterations": len(its),
        "mean_iteration_ms": 1000 * float(np.mean([it["duration_s"] for it in its])),
        "max_running": max(it["num_running"] for it in its),
        "preemptions": int(sum(it["num_preempted"] for it in its)),
    }


# ---- Hugging Face static batches ----------------------------------------------------------------
def run_hf(model, reqs: list[dict], batch_size: int) -> dict:
    useful = 0
    generated_slots = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in range(0, len(reqs), batch_size):
            batch = reqs[b : b + batch_size]
            width = max(len(r["prompt_token_ids"]) for r in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for i, r in enumerate(batch):  # left padding
                p = r["prompt_token_ids"]
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            n = max(r["output_len"] for r in batch)
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
            assert out.shape[1] == width + n
            useful += sum(r["output_len"] for r in batch)
            generated_slots += len(batch) * n
    dt = time.perf_counter() - t0
    return {
        "useful_output_tokens": useful,
        "generated_token_slots": generated_slots,
        "useful_fraction": useful / generated_slots,
        "duration_s": dt,
        "output_tok_s": useful / dt,
        "num_batches": -(-len(reqs) // batch_size),
    }


# ---- profile ----------------------------------------------------------------------------------
def profile_summary(prof: cProfile.Profile, top: int) -> dict:
    stats = pstats.Stats(prof)
    total = stats.total_tt
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append((ct, tt, nc, f"{_short(file)}:{line}({func})"))
    by_cum = sorted(rows, reverse=True)[:top]
    by_self = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)

    def fmt(r):
        return {"cum_s": round(r[0], 4), "self_s": round(r[1], 4), "calls": r[2], "where": r[3]}

    phases = {}
    for label, (module, qualname) in PROFILE_PHASES.items():
        key = _code_key(module, qualname)
        if key in stats.stats:
            _cc, nc, _tt, ct, _callers = stats.stats[key]
            phases[label] = {"cum_s": round(ct, 4), "calls": nc}
    return {
        "total_s": total,
        "phases": phases,
        "top_cumulative": [fmt(r) for r in by_cum],
        "top_self": [fmt(r) for r in by_self],
        "pstats_text": _portable(text.getvalue(), None),
    }


# Where a cbbench run's time goes: label -> (module, qualified name) of the function whose
# cumulative time is reported (resolved to file and first line, which is how cProfile keys them).
PROFILE_PHASES = {
    "build engine (model load, KV alloc, warm-up)": ("cbbench.engine.build_torch", "build_torch_engine"),
    "  of which KV cache allocation": ("cbbench.engine.torch.models.llama", "allocate_kv_cache"),
    "  of which runner warm-up": ("cbbench.engine.torch.model_runner", "ModelRunner.warmup"),
    "engine loop (run_until_done)": ("cbbench.engine.core.engine", "run_until_done"),
    "  scheduler (Scheduler.schedule)": ("cbbench.engine.core.scheduler", "Scheduler.schedule"),
    "  executor (ModelRunner.execute)": ("cbbench.engine.torch.model_runner", "ModelRunner.execute"),
    "    batch packing (prepare)": ("cbbench.engine.torch.model_runner", "ModelRunner.prepare"),
    "    model forward": ("cbbench.engine.torch.model_runner", "ModelRunner._forward"),
    "      attention (TorchBackend.forward)": ("cbbench.kernels.torch_native", "TorchBackend.forward"),
    "      attention (ReferenceBackend.forward)": ("cbbench.kernels.reference", "ReferenceBackend.forward"),
    "      KV write (write_kv_torch)": ("cbbench.kernels.backend", "write_kv_torch"),
    "      qkv projection + rotary + KV store (LlamaAttention.project_qkv)": (
        "cbbench.engine.torch.models.llama", "LlamaAttention.project_qkv"),
    "      o_proj (LlamaAttention.project_out)": (
        "cbbench.engine.torch.models.llama", "LlamaAttention.project_out"),
    "      MLP (LlamaMLP.forward)": ("cbbench.engine.torch.models.llama", "LlamaMLP.forward"),
    "      RMSNorm": ("cbbench.engine.torch.models.llama", "RMSNorm.forward"),
    "      rotary (rope_torch)": ("cbbench.kernels.layer_ops", "rope_torch"),
    "    lm_head (LlamaForCausalLM.compute_logits)": ("cbbench.engine.torch.models.llama", "LlamaForCausalLM.compute_logits"),
    "    sampling (Sampler.sample_rows)": ("cbbench.engine.torch.sampler", "Sampler.sample_rows"),
    "  postprocess (Engine._postprocess)": ("cbbench.engine.core.engine", "Engine._postprocess"),
    "metrics (summarize)": ("cbbench.analysis.summary.metrics", "summarize"),
    "result write (write_result)": ("cbbench.analysis.result", "write_result"),
}  # fmt: skip


def _code_key(module: str, qualname: str) -> tuple[str, int, str] | None:
    import importlib
    import inspect

    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        code = inspect.unwrap(obj).__code__
    except Exception:  # noqa: BLE001  (renamed or moved: leave the phase out)
        return None
    return code.co_filename, code.co_firstlineno, code.co_name


def _short(file: str) -> str:
    for marker in ("/site-packages/", str(REPO) + "/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


# ---- main -------------------------------------------------------------------------------------
def _portable(text: str, tmp: Path | None) -> str:
    """Replace machine paths with placeholders: <tmp>, <repo>, <site-packages>."""
    import site

    if tmp is not None:
        text = text.replace(str(tmp), "<tmp>")
    for sp in site.getsitepackages():
        text = text.replace(sp + "/", "<site-packages>/")
    return text.replace(str(Path(__file__).resolve().parents[2]) + "/", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=int, default=8, help="divide ShareGPT lengths by this")
    ap.add_argument("--hf-batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (after one warm-up)")
    ap.add_argument(
        "--threads", type=int, default=1,
        help="torch.set_num_threads for both (1 by default: on a shared, oversubscribed CPU "
        "OpenMP's spinning threads slow small GEMMs down several-fold; 0 = torch's default)",
    )  # fmt: skip
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--cbbench-args", default="", help="extra flags for cbbench run")
    ap.add_argument(
        "--also-static",
        action="store_true",
        help="also time cbbench's own --scheduler static (max-num-seqs = HF batch)",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile one extra cbbench run")
    ap.add_argument("--profile-top", type=int, default=30)
    ap.add_argument("--out-dir", type=Path, default=REPO / "results")
    ap.add_argument("--name", default="cpu_vs_hf_generate")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    args.out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="cbbench-vs-hf-"))
    folder = tmp / "model"
    model = build_model(folder)
    reqs = make_requests(args.num_requests, args.seed, args.scale, MODEL_SIZES["vocab_size"])
    workload = tmp / "workload.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    extra = ["--attention-backend", args.attention_backend, *args.cbbench_args.split()]
    cb_args = cbbench_args(workload, folder, len(reqs), tmp / "cbbench.json", extra)
    static_args = cbbench_args(
        workload, folder, len(reqs), tmp / "cbbench-static.json",
        [*extra, "--scheduler", "static", "--max-num-seqs", str(args.hf_batch_size)],
    )  # fmt: skip

    p = np.array([len(r["prompt_token_ids"]) for r in reqs])
    o = np.array([r["output_len"] for r in reqs])
    print(
        f"{len(reqs)} requests: prompt mean {p.mean():.1f} max {p.max()}, "
        f"output mean {o.mean():.1f} max {o.max()}, {o.sum()} output tokens; "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )

    load_start = os.getloadavg()[0]
    print("warm-up ...", flush=True)
    run_cbbench(cb_args)
    run_hf(model, reqs[: args.hf_batch_size], args.hf_batch_size)

    rounds = []
    for i in range(args.rounds):
        cb = run_cbbench(cb_args)
        hf = run_hf(model, reqs, args.hf_batch_size)
        if cb["output_tokens"] != hf["useful_output_tokens"] or cb["completed"] != len(reqs):
            raise RuntimeError(f"cbbench and HF ran different work: {cb} vs {hf}")
        rnd = {"cbbench": cb, "hf": hf, "ratio": cb["output_tok_s"] / hf["output_tok_s"]}
        if args.also_static:
            st = run_cbbench(static_args)
            rnd["cbbench_static"] = st
            rnd["static_ratio"] = st["output_tok_s"] / hf["output_tok_s"]
        rounds.append(rnd)
        print(
            f"round {i}: cbbench {cb['output_tok_s']:.0f} tok/s ({cb['duration_s']:.2f} s, "
            f"{cb['iterations']} iterations), HF {hf['output_tok_s']:.0f} useful tok/s "
            f"({hf['duration_s']:.2f} s) -> ratio {rnd['ratio']:.2f}x"
            + (
                f"; cbbench static {rnd['cbbench_static']['output_tok_s']:.0f} tok/s"
                if args.also_static
                else ""
            ),
            flush=True,
        )

    ratio = statistics.median(r["ratio"] for r in rounds)
    command = "python tests/bench/bench_vs_hf.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {
        "what": "cbbench continuous batching (torch engine) vs HF generate static batches, CPU fp32",
        "command": command.strip(),
        # Machine paths (the temp folder, this checkout) stay out of committed figures.
        "cbbench_command": _portable("cbbench " + " ".join(cb_args), tmp),
        "platform": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "loadavg_1m_at_start": load_start,
            "loadavg_1m_at_end": os.getloadavg()[0],
        },
        "model": {"kind": "LlamaConfig, random weights", **MODEL_SIZES},
        "workload": {
            "source": "cbbench built-in sharegpt lengths",
            "num_requests": len(reqs),
            "seed": args.seed,
            "length_divisor": args.scale,
            "prompt_len_mean": float(p.mean()),
            "prompt_len_max": int(p.max()),
            "output_len_mean": float(o.mean()),
            "output_len_max": int(o.max()),
            "total_output_tokens": int(o.sum()),
            "arrivals": "all at t=0",
        },
        "hf_batch_size": args.hf_batch_size,
        "hf_counting": "useful tokens only: each request's own output length; the padding steps "
        "a static batch runs for shorter members are not counted",
        "rounds": rounds,
        "ratio_median": ratio,
        "ratio_min": min(r["ratio"] for r in rounds),
        "ratio_max": max(r["ratio"] for r in rounds),
        "goal_ratio": 2.0,
        "meets_goal": ratio >= 2.0,
    }

    if args.profile:
        prof = cProfile.Profile()
        run_cbbench(cb_args, profile=prof)
        result["profile"] = profile_summary(prof, args.profile_top)
        print(result["profile"]["pstats_text"])

    json_path = args.out_dir / f"{args.name}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    (args.out_dir / f"{args.name}.md").write_text(render_md(result))
    print(f"median ratio {ratio:.2f}x -> {json_path}")
    return 0


def render_md(r: dict) -> str:
    w, pl = r["workload"], r["platform"]
    lines = [
        "# cbbench continuous batching vs Hugging Face `generate` (CPU, fp32)",
        "",
        f"Command (repo root): `{r['command']}`",
        "",
        f"- Model: random-weight Llama (hidden {r['model']['hidden_size']}, "
        f"{r['model']['num_hidden_layers']} layers, {r['model']['num_attention_heads']} heads / "
        f"{r['model']['num_key_value_heads']} KV heads, vocab {r['model']['vocab_size']}), saved "
        "with `save_pretrained`; cbbench loads it from the folder, HF uses the same weights.",
        f"- Requests: {w['num_requests']} drawn (seed {w['seed']}) from the built-in ShareGPT "
        f"lengths divided by {w['length_divisor']} (min 4): prompt mean {w['prompt_len_mean']:.1f} "
        f"(max {w['prompt_len_max']}), output mean {w['output_len_mean']:.1f} "
        f"(max {w['output_len_max']}), {w['total_output_tokens']} output tokens, all at t=0.",
        f"- cbbench: `{r['cbbench_command']}` (in-process CLI); throughput = the result's "
        "output_throughput (model load and warm-up excluded).",
        f"- HF: `generate` on static batches of {r['hf_batch_size']} in request order, "
        "left-padded, greedy, min_new_tokens = max_new_tokens = the batch's longest output. "
        "**Only useful tokens are counted** (each request's own output length), not the padding "
        "steps shorter members sit through -- that idle work is static batching's cost.",
        f"- torch {pl['torch']}, transformers {pl['transformers']}, {pl['torch_threads']} threads, "
        f"{pl['machine']}, {pl['cpu_count']} CPUs (1-min load average {pl['loadavg_1m_at_start']:.1f} "
        f"at start, {pl['loadavg_1m_at_end']:.1f} at end: the machine is shared, so absolute "
        "figures are noisy; the ratio is what matters). One process; rounds alternate after an "
        "untimed warm-up of each.",
        "",
        "| round | cbbench tok/s | cbbench s | iterations | HF useful tok/s | HF s | HF useful "
        "fraction | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, rnd in enumerate(r["rounds"]):
        cb, hf = rnd["cbbench"], rnd["hf"]
        lines.append(
            f"| {i} | {cb['output_tok_s']:.0f} | {cb['duration_s']:.2f} | {cb['iterations']} | "
            f"{hf['output_tok_s']:.0f} | {hf['duration_s']:.2f} | {hf['useful_fraction']:.2f} | "
            f"{rnd['ratio']:.2f}x |"
        )
    if r["rounds"] and "cbbench_static" in r["rounds"][0]:
        lines += [
            "",
            "cbbench's own `--scheduler static` (same batch size) for reference: "
            + ", ".join(
                f"{x['cbbench_static']['output_tok_s']:.0f} tok/s ({x['static_ratio']:.2f}x HF)"
                for x in r["rounds"]
            ),
        ]
    verdict = "meets" if r["meets_goal"] else "is BELOW"
    lines += [
        "",
        f"**Median ratio: {r['ratio_median']:.2f}x** (range {r['ratio_min']:.2f}x-"
        f"{r['ratio_max']:.2f}x over {len(r['rounds'])} rounds; {verdict} the 2x goal).",
    ]
    if "profile" in r:
        lines += ["", "## cProfile of one cbbench run (top by cumulative time)", "", "```"]
        lines += [
            f"{x['cum_s']:8.3f} cum {x['self_s']:8.3f} self {x['calls']:>8} {x['where']}"
            for x in r["profile"]["top_cumulative"]
        ]
        lines += ["```"]
        if r["profile"].get("phases"):
            lines += ["", "| phase | cumulative s | calls |", "|---|---|---|"]
            lines += [
                f"| {k.replace('  ', '&nbsp;&nbsp;')} | {v['cum_s']:.3f} | {v['calls']} |"
                for k, v in r["profile"]["phases"].items()
            ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
