"""A device profile's step error on a recorded real run, per iteration class.

`cbbench calibrate` reports its residuals on the data it fitted (in sample), and a real run
made with --gpu-profile reports summary.engine.sim_error as it runs. This is the same figure
for a run already recorded: the profile's roofline prices each iteration's batch shape (the
shape the record holds, calibrate's iteration_shape) and the error is taken against the
measured duration_s, per class (decode, mixed, prefill). Run-level metrics (TTFT, TPOT,
throughput) of a decode-heavy run are mostly decode steps and queueing: a profile that fits
decode and mispredicts prefill by +29% still predicts them within 1%, so a profile is judged
out of sample on each class of steps apart.
"""

from __future__ import annotations

import numpy as np

from cbbench.analysis.calibration import ResultLike, _exclusion, _model_of, _run_of, iteration_shape
from cbbench.analysis.comparison.sim_error import error_stats, iteration_class
from cbbench.engine.sim.cost_model import CostModel
from cbbench.engine.sim.device_profile import DeviceProfile


def step_errors(profile: DeviceProfile, result: ResultLike, where: str = "the run") -> dict:
    """{"decode" | "mixed" | "prefill": {"n", "median", "p90", "bias"}} of the relative errors
    (predicted - measured) / measured of ``profile`` on every usable iteration of ``result``
    (calibrate's own exclusions: no tokens, swap copies, no measured time); ``bias`` is the
    median signed error (> 0: predicted too slow)."""
    run = _run_of(result, where)
    model = _model_of((run.config.model_extra or {}).get("model_config"), where)
    cost = CostModel(model, profile.dtype, rates=profile.rates)
    predicted, measured, labels = [], [], []
    for it in run.iterations or []:
        if _exclusion(it) is not None:
            continue
        t = cost.cost(iteration_shape(it)).time_s
        assert t is not None  # a profile's rates price every step
        predicted.append(t)
        measured.append(it.duration_s)
        labels.append(iteration_class(it.num_prefill_tokens, it.num_decode_tokens))
    return error_stats(np.array(predicted, dtype=np.float64),
                       np.array(measured, dtype=np.float64), labels)
