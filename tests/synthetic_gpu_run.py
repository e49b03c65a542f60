"""A synthetic "real" GPU run: a simulated run's iteration shapes re-timed by known rates, as
the torch engine on that GPU would record them (the idea of a reviewer's synth.py: fit
what you made, and see whether calibrate finds it or says why it cannot).

The shapes come from a short simulated ShareGPT run (decode, mixed and prefill steps); each
step's duration_s is the roofline's time under ``rates``, with optional lognormal noise; the
config says engine torch on ``gpu``. Rates faster than the GPU's spec make a trace no such
GPU can have recorded, which calibrate must not turn into a profile faster than the part."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from helpers import run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.engine.model_config import get_model_config
from cbbench.engine.sim.cost_model import BatchShape, CostModel, DeviceRates
from cbbench.engine.sim.gpu_specs import get_gpu_spec
from cbbench.schema.base import to_dict


def sim_shapes(model: str = "llama-3-8b", num_requests: int = 40, max_num_seqs: int = 16,
               gpu: str = "h100") -> dict:
    """A short simulated run on ``gpu`` (its file dict): the iteration shapes to re-time."""
    spec = run_spec(workload="sharegpt", num_requests=num_requests, request_rate=float("inf"),
                    seed=0, engine=EngineArgs(engine="sim", model=model, dtype="bf16",
                                              gpu=gpu, max_num_seqs=max_num_seqs,
                                              max_num_batched_tokens=2048))
    return to_dict(execute_run(spec))


def shape_of(it: dict) -> BatchShape:
    return BatchShape(it["num_prefill_tokens"] + it["num_decode_tokens"], it["num_logits"],
                      it["attn_key_pairs"], it["attn_keys_read"],
                      it["num_prefill_reqs"] + it["num_decode_reqs"], it["num_prefill_reqs"],
                      it["attn_decode_keys"])


def retimed(run: dict, rates: DeviceRates, *, model: str = "llama-3-8b", gpu: str = "h100",
            noise: float = 0.0, keep: Callable[[dict], bool] | None = None,
            seed: int = 0) -> dict:
    """A copy of ``run`` whose steps took the roofline's time under ``rates`` (times a
    lognormal factor of sigma ``noise``), recorded as a torch run on ``gpu``. ``keep``, a
    predicate on an iteration record, drops the others (a decode-only trace: no prefill).
    ``gpu`` "cpu" records it as a CPU run."""
    cm = CostModel(get_model_config(model), "bf16", rates=rates)
    rng = np.random.default_rng(seed)
    its = []
    for it in run["iterations"]:
        if keep is not None and not keep(it):
            continue
        it = dict(it)
        t = cm.cost(shape_of(it)).time_s
        it["duration_s"] = t * (float(np.exp(rng.normal(0, noise))) if noise else 1.0)
        it["predicted_s"] = None
        its.append(it)
    if gpu == "cpu":  # the CPU has no spec: calibrate's unbounded, staged fit
        config = {**run["config"], "engine": "torch", "device": "cpu", "gpu": None,
                  "device_name": "cpu", "gpu_spec": None}
    else:
        spec = get_gpu_spec(gpu)
        config = {**run["config"], "engine": "torch", "device": "cuda", "gpu": gpu,
                  "device_name": spec.name, "gpu_spec": spec.to_dict()}
    return {**run, "config": config, "iterations": its}
