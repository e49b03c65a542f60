"""Tensor and data parallelism in the simulator: the figures in parallel.md.

    python results/sim_accuracy/parallel.py > results/sim_accuracy/parallel.md

Deterministic (the simulator), a few seconds on one core.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from cbbench.bench.runner import RunSpec, execute_run
from cbbench.engine.args import EngineArgs
from cbbench.engine.model_config import get_model_config
from cbbench.engine.sim.cost_model import BatchShape, CostModel
from cbbench.engine.sim.gpu_specs import get_gpu_spec
from cbbench.options import LoadOptions, OutputOptions

MS = 1e3


def tensor_parallel() -> None:
    model, h100 = get_model_config("llama-3.1-70b"), get_gpu_spec("h100")
    # DESIGN.md's floor: decode reads the weights less the input embedding (it reads only the
    # batch's rows of that table).
    db = 2  # bf16
    floor = (model.weight_bytes("bf16") - model.embedding_params * db) / h100.hbm_bandwidth
    print("Made by `python results/sim_accuracy/parallel.py > results/sim_accuracy/parallel.md`: "
          "the simulator, deterministic.\n")
    print("## Tensor parallelism: llama-3.1-70b, batch-1 decode (512 keys), simulated H100\n")
    print("| TP | step (ms) | weight-read floor (ms) | step / floor | all-reduces + gather (ms) |")
    print("|---|---|---|---|---|")
    steps = {}
    for tp in (2, 4, 8):
        cm = CostModel(model, "bf16", h100, tensor_parallel_size=tp)
        shape = BatchShape(1, 1, 512, 512, 1, 0, 512)
        t = cm.cost(shape).time_s
        steps[tp] = t
        print(f"| {tp} | {t * MS:.2f} | {floor / tp * MS:.2f} | {t / (floor / tp):.2f} | "
              f"{cm.communication_s(shape) * MS:.2f} |")
    print(f"\nTP 2 / TP 4 step time: {steps[2] / steps[4]:.2f}x (the collectives and the "
          "300 µs overhead do not shrink with the shard).\n")


def run(workload: str, **kw) -> dict:
    engine = {k: kw.pop(k) for k in list(kw)
              if k in EngineArgs.__dataclass_fields__ and k != "seed"}
    load = {k: kw.pop(k) for k in list(kw) if k in LoadOptions.__dataclass_fields__}
    if "request_rate" in load:
        load["request_rate"] = repr(float(load["request_rate"]))
    load.setdefault("num_requests", kw.pop("num_requests", None))
    spec = RunSpec(LoadOptions(workload=workload, **load),
                   EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", **engine),
                   OutputOptions())
    # notices go to the cbbench logger, unhandled here
    return execute_run(spec).summary.model_dump()


def data_parallel() -> None:
    print("## Data parallelism: llama-3-8b on simulated H200s, all requests at t = 0\n")
    print("| trace | DP 1 (tok/s) | DP 2 (tok/s) | DP 2 / DP 1 |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        uniform = Path(d) / "uniform.jsonl"
        uniform.write_text("".join(json.dumps({"prompt_len": 512, "output_len": 256}) + "\n"
                                   for _ in range(1000)))
        for name, wl, n in (("1,000 x (512 in, 256 out)", str(uniform), None),
                            ("ShareGPT, 1,000 requests", "sharegpt", 1000),
                            ("ShareGPT, 5,000 requests", "sharegpt", 5000)):
            one = run(wl, num_requests=n)["output_throughput"]
            two = run(wl, num_requests=n, data_parallel_size=2)["output_throughput"]
            print(f"| {name} | {one:,.0f} | {two:,.0f} | {two / one:.3f} |")
    print("\nShareGPT's long outputs leave a ramp-down (a few requests decoding alone) that "
          "two replicas do not shorten, so its ratio approaches 2 only as the run grows.\n")
    print("## Routers: ShareGPT, 600 requests, 2 replicas of 32 sequences, gamma shape 0.2\n")
    print("| req/s | seed | round-robin TTFT p50 / p90 / p99 (ms) | "
          "least-requests | least-kv |")
    print("|---|---|---|---|---|")
    for rate in (20.0, 50.0):
        for seed in (0, 1, 2):
            cells = []
            for router in ("round-robin", "least-requests", "least-kv"):
                t = run("sharegpt", num_requests=600, seed=seed, request_rate=rate,
                        request_rate_flag=True, burstiness=0.2, max_num_seqs=32,
                        data_parallel_size=2, router=router)["ttft_ms"]
                cells.append(f"{t['p50']:.0f} / {t['p90']:.0f} / {t['p99']:.0f}")
            print(f"| {rate:g} | {seed} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    tensor_parallel()
    data_parallel()
