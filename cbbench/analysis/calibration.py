"""Fit a device's roofline rates to the iteration records of real runs (`cbbench calibrate`).

The model is the simulator's own (engine/cost_model.py): per iteration,

    t = sum over operators of max(FLOPs / flop_rate, bytes / memory_bandwidth)
        (attention at attention_efficiency of both rates)
        + iteration_overhead_s + row_overhead_s * requests in the batch

Each record carries the batch shape the cost model read, so every operator's FLOPs and bytes
are recomputed here and the five parameters are fitted by robust least squares on the log
of predicted over measured time (timing noise is multiplicative: a loaded host stretches an
iteration by a factor, and a relative error is bounded below by -1 but not above, which
drags a fit towards predicting nothing): Huber's M-estimator with its scale from the median
absolute deviation (a first soft-L1 pass gives it), with scipy's trust-region solver under
the bound that every parameter is >= 0. The residuals the profile reports are the relative
errors summary.engine.sim_error reports.

Only what the data determine is kept: a parameter whose relative standard error exceeds
MAX_RSE (or which sits at 0, or whose term never matters in the data) is reported as not
identified, fixed at its fallback (a GPU: the uncalibrated simulator's value from its spec;
the CPU: the term left out) and the rest refitted, worst first, until every free parameter is
identified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cbbench.analysis.sim_error import error_stats, iteration_class
from cbbench.engine.cost_model import (
    ATTENTION_OP,
    DEFAULT_ETA_COMPUTE,
    DEFAULT_ETA_MEMORY,
    DEFAULT_ITERATION_OVERHEAD_S,
    BatchShape,
    CostModel,
    DeviceRates,
)
from cbbench.engine.device_profile import CPU_DEVICE, DeviceProfile, profile_to_dict
from cbbench.engine.gpu_specs import get_gpu_spec
from cbbench.engine.model_config import ModelConfig
from cbbench.errors import UsageError

# Five parameters need many more points than five; 50 also keeps one outlier from steering.
MIN_ITERATIONS = 50
# A parameter known to worse than +-25% (one standard error) is not identified by the data.
MAX_RSE = 0.25
HUBER_K = 1.345  # Huber's tuning constant (95% efficiency under normal noise)
MAD_TO_SIGMA = 1.4826
MIN_SCALE = 1e-3  # relative: below this the timer, not the model, is the limit
TINY_S = 1e-12  # a floor under predicted times, so their log stays finite
FIRST_PASS_SCALE = 0.1  # soft-L1's scale before the data give a better one
GRID_POINTS = 17  # per rate, log-spaced over 4 decades below the rate that explains all
GRID_MAX_ROWS = 2000  # iterations the grid search looks at (the local fit sees them all)
PARAMS = ("memory_bandwidth", "flop_rate", "attention_efficiency", "iteration_overhead_s",
          "row_overhead_s")
SHAPE_FIELDS = ("num_logits", "attn_key_pairs", "attn_keys_read")
# Internal parameters: the time per unit (inverse rates), so the model is linear in most of
# them: a = s/byte, b = s/FLOP, e = 1/attention_efficiency, t0 = s/iteration, tr = s/row.
A, B, E, T0, TR = range(5)


@dataclass
class FitData:
    op_flops: np.ndarray  # [n, operators]
    op_bytes: np.ndarray
    num_reqs: np.ndarray
    measured: np.ndarray
    labels: list[str | None]

    @property
    def n(self) -> int:
        return int(self.measured.size)


@dataclass
class Source:
    file: str
    workload: str | None
    model: str
    used: int
    excluded: dict[str, int] = field(default_factory=dict)


def _times_and_grad(theta: np.ndarray, d: FitData) -> tuple[np.ndarray, np.ndarray]:
    """Predicted times [n] and their gradient [n, 5] in the internal parameters."""
    a, b, e = theta[A], theta[B], theta[E]
    compute = d.op_flops * b
    memory = d.op_bytes * a
    mem_bound = memory > compute
    per_op = np.where(mem_bound, memory, compute)
    attn = per_op[:, ATTENTION_OP]
    others = per_op.sum(axis=1) - attn
    t = others + e * attn + theta[T0] + theta[TR] * d.num_reqs
    weight = np.ones(d.op_flops.shape[1])
    grad = np.empty((d.n, 5))
    w = np.broadcast_to(weight, d.op_flops.shape).copy()
    w[:, ATTENTION_OP] = e
    grad[:, A] = (d.op_bytes * mem_bound * w).sum(axis=1)
    grad[:, B] = (d.op_flops * ~mem_bound * w).sum(axis=1)
    grad[:, E] = attn
    grad[:, T0] = 1.0
    grad[:, TR] = d.num_reqs
    return t, grad


@dataclass
class Fit:
    theta: np.ndarray
    free: list[int]
    residuals: np.ndarray  # log(predicted / measured)
    scale: float
    rse: dict[int, float]  # relative standard error of each free parameter
    share: dict[int, float]  # median fraction of an iteration's time the parameter explains


def _fit(d: FitData, theta0: np.ndarray, free: list[int], scale_hint: np.ndarray) -> Fit:
    from scipy.optimize import least_squares

    fixed = theta0.copy()
    s = scale_hint[free]

    def unpack(z):
        th = fixed.copy()
        th[free] = z * s
        return th

    log_m = np.log(d.measured)

    def fun(z):
        t, _ = _times_and_grad(unpack(z), d)
        return np.log(np.maximum(t, TINY_S)) - log_m

    def jac(z):
        t, g = _times_and_grad(unpack(z), d)
        return g[:, free] * s / np.maximum(t, TINY_S)[:, None]

    z0 = np.maximum(theta0[free] / s, 1e-6)
    bounds = (np.zeros(len(free)), np.full(len(free), np.inf))
    first = least_squares(fun, z0, jac=jac, bounds=bounds, loss="soft_l1",
                          f_scale=FIRST_PASS_SCALE, method="trf")
    r = first.fun
    scale = max(MAD_TO_SIGMA * float(np.median(np.abs(r - np.median(r)))), MIN_SCALE)
    k = HUBER_K * scale
    res = least_squares(fun, first.x, jac=jac, bounds=bounds, loss="huber", f_scale=k,
                        method="trf")
    theta = unpack(res.x)
    r = res.fun
    # Covariance of the Huber estimate (inliers weigh 1, outliers k/|r|); log residuals make
    # it relative.
    J = jac(res.x)
    w = np.minimum(1.0, k / np.maximum(np.abs(r), 1e-300))
    info = J.T @ (J * w[:, None])
    rse: dict[int, float] = {}
    try:
        cov = scale**2 * np.linalg.inv(info)
        diag = np.diag(cov)
    except np.linalg.LinAlgError:
        diag = np.full(len(free), np.inf)
    for j, p in enumerate(free):
        zj = res.x[j]
        column = np.abs(J[:, j]).max() if J.size else 0.0
        if zj <= 0 or column == 0 or not np.isfinite(diag[j]) or diag[j] < 0:
            rse[p] = math.inf
        else:
            rse[p] = float(math.sqrt(diag[j]) / zj)
    t, g = _times_and_grad(theta, d)
    share = {p: float(np.median(theta[p] * g[:, p] / np.maximum(t, TINY_S))) for p in range(5)}
    return Fit(theta, list(free), r, scale, rse, share)


def _initial_guess(d: FitData) -> tuple[np.ndarray, np.ndarray]:
    """A start for the local fit, and each parameter's natural scale.

    The roofline's max() makes the fit non-convex in the two rates (which operators are
    memory- or compute-bound depends on them), so the start comes from a grid over the two
    inverse rates (0, i.e. that limit left out, included); at each grid point the rest of the
    model is linear in (attention factor, overhead per iteration, overhead per row), solved by
    non-negative least squares on relative error. The grid point with the lowest robust
    (soft-L1, log) cost wins."""
    from scipy.optimize import nnls

    d = _subsample(d, GRID_MAX_ROWS)
    m = d.measured
    med = float(np.median(m))
    # Each parameter alone explaining the median iteration: an upper end for its grid.
    scale = np.array([
        med / max(float(np.median(d.op_bytes.sum(axis=1))), 1e-300),
        med / max(float(np.median(d.op_flops.sum(axis=1))), 1e-300),
        1.0,
        med,
        med / max(float(np.median(d.num_reqs)), 1.0),
    ])
    grid = np.concatenate(([0.0], np.logspace(-4, 0, GRID_POINTS)))
    best, best_cost = None, math.inf
    ones = np.ones_like(m)
    for fa in grid:
        for fb in grid:
            if fa == 0 and fb == 0:
                continue
            theta = np.array([fa * scale[A], fb * scale[B], 1.0, 0.0, 0.0])
            compute = d.op_flops * theta[B]
            memory = d.op_bytes * theta[A]
            per_op = np.maximum(compute, memory)
            attn = per_op[:, ATTENTION_OP]
            others = per_op.sum(axis=1) - attn
            # others + e*attn + t0 + tr*R = m, divided by m; the others' share is fixed.
            cols = np.stack([attn, ones, d.num_reqs], axis=1) / m[:, None]
            col_scale = 1.0 / np.maximum(cols.max(axis=0), 1e-300)
            x, _ = nnls(cols * col_scale, 1.0 - others / m, maxiter=200)
            theta[E], theta[T0], theta[TR] = x * col_scale
            t, _ = _times_and_grad(theta, d)
            r = np.log(np.maximum(t, TINY_S)) - np.log(m)
            cost = float(np.sum(np.sqrt(1.0 + (r / FIRST_PASS_SCALE) ** 2) - 1.0))
            if cost < best_cost:
                best, best_cost = theta, cost
    theta0 = np.where(best > 0, best, scale * 1e-3)
    theta0[E] = min(max(theta0[E], 1e-2), 1e2) if best[E] > 0 else 1.0
    return theta0, scale


def _subsample(d: FitData, limit: int) -> FitData:
    """At most ``limit`` iterations for the start's grid search: every prefill and mixed one
    (the rare, informative kinds), decodes at an even stride."""
    if d.n <= limit:
        return d
    labels = np.asarray(d.labels, dtype=object)
    rare = np.flatnonzero(labels != "decode")
    decode = np.flatnonzero(labels == "decode")
    room = max(limit - rare.size, 1)
    keep = np.sort(np.concatenate([rare, decode[:: max(1, -(-decode.size // room))]]))
    return FitData(d.op_flops[keep], d.op_bytes[keep], d.num_reqs[keep], d.measured[keep],
                   [d.labels[i] for i in keep])


def _fallbacks(device: str) -> np.ndarray:
    """Internal parameter values for terms the data cannot identify (see the module doc)."""
    if device == CPU_DEVICE:
        return np.array([0.0, 0.0, 1.0, 0.0, 0.0])
    gpu = get_gpu_spec(device)
    return np.array([
        1.0 / (gpu.hbm_bandwidth * DEFAULT_ETA_MEMORY),
        1.0 / (gpu.bf16_flops * DEFAULT_ETA_COMPUTE),
        1.0,
        DEFAULT_ITERATION_OVERHEAD_S,
        0.0,
    ])


def fit_rates(d: FitData, device: str) -> tuple[Fit, list[dict]]:
    """Backward elimination: fit all, fix the worst unidentified parameter at its fallback,
    refit, until every free parameter is identified. Returns the final fit and the rounds."""
    theta0, scale = _initial_guess(d)
    fallback = _fallbacks(device)
    free = list(range(5))
    rounds = []
    while True:
        fit = _fit(d, theta0, free, scale)
        worst = max(free, key=lambda p: fit.rse[p]) if free else None
        rounds.append({
            "free": [PARAMS[p] for p in free],
            "rse": {PARAMS[p]: _finite(fit.rse[p]) for p in free},
            "scale": fit.scale,
        })
        if worst is None or fit.rse[worst] <= MAX_RSE:
            return fit, rounds
        free.remove(worst)
        theta0 = fit.theta.copy()
        theta0[worst] = fallback[worst]
        if fallback[worst] > 0:
            scale[worst] = fallback[worst]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


# ---- reading results ------------------------------------------------------------------------
def _device_of(config: dict, where: str) -> tuple[str, str]:
    """(profile device, the name the run reported) of a real engine run."""
    if config.get("target") != "engine":
        raise UsageError(f"{where}: an endpoint run has no engine iteration records to fit")
    if config.get("engine") != "torch":
        raise UsageError(
            f"{where}: a simulated run (engine {config.get('engine')!r}); calibrate from real "
            "runs (--engine torch)"
        )
    if config.get("device") == "cpu":
        return CPU_DEVICE, str(config.get("device_name") or "cpu")
    name = str(config.get("device_name") or "?")
    if not config.get("gpu"):
        raise UsageError(f"{where}: the GPU {name!r} has no spec in cbbench, so no profile")
    return str(config["gpu"]), name


def _records_of(result: dict, where: str) -> list[dict]:
    its = result.get("iterations")
    if not isinstance(its, list) or not its:
        raise UsageError(f"{where} has no iteration records (was it written with --summary-only?)")
    if any(k not in its[0] for k in SHAPE_FIELDS):
        raise UsageError(
            f"{where}: its iteration records lack the batch shape (num_logits, attn_key_pairs); "
            "rerun it with this cbbench"
        )
    return its


def fit_data(results: Sequence[tuple[str, dict]]) -> tuple[FitData, str, str, str, list[Source]]:
    """The usable iterations of every result, with their operators' FLOPs and bytes. Returns
    (data, device, device_name, dtype, sources)."""
    if not results:
        raise UsageError("give at least one result file")
    devices: dict[tuple[str, str], str] = {}
    dtypes: dict[str, str] = {}
    flops, nbytes, reqs, measured, labels = [], [], [], [], []
    sources: list[Source] = []
    for where, result in results:
        config = result["config"]
        device = _device_of(config, where)
        devices.setdefault(device, where)
        dtypes.setdefault(str(config.get("dtype")), where)
        its = _records_of(result, where)
        try:
            model = ModelConfig(**config["model_config"])
        except (KeyError, TypeError) as e:
            raise UsageError(f"{where}: no usable model_config in its config ({e})") from None
        cost = CostModel(model, str(config.get("dtype")))
        src = Source(Path(where).name, config.get("workload"), model.name, 0)
        for it in its:
            reason = _exclusion(it)
            if reason is not None:
                src.excluded[reason] = src.excluded.get(reason, 0) + 1
                continue
            shape = BatchShape(
                num_tokens=it["num_prefill_tokens"] + it["num_decode_tokens"],
                num_logits=it["num_logits"],
                attn_key_pairs=it["attn_key_pairs"],
                attn_keys_read=it["attn_keys_read"],
                num_reqs=it["num_prefill_reqs"] + it["num_decode_reqs"],
            )
            ops = cost.operators(shape)
            flops.append([f for f, _ in ops])
            nbytes.append([b for _, b in ops])
            reqs.append(shape.num_reqs)
            measured.append(it["duration_s"])
            labels.append(iteration_class(it["num_prefill_tokens"], it["num_decode_tokens"]))
            src.used += 1
        sources.append(src)
    if len(devices) > 1:
        (d1, w1), (d2, w2) = list(devices.items())[:2]
        raise UsageError(f"mixed devices: {w1} ran on {d1[1]}, {w2} on {d2[1]}; one device per profile")
    if len(dtypes) > 1:
        (t1, w1), (t2, w2) = list(dtypes.items())[:2]
        raise UsageError(f"mixed dtypes: {w1} ran in {t1}, {w2} in {t2}; one dtype per profile")
    n = len(measured)
    if n < MIN_ITERATIONS:
        raise UsageError(
            f"too few iterations to fit: {n} usable, at least {MIN_ITERATIONS} needed "
            "(run more requests)"
        )
    (device, device_name), = devices
    data = FitData(np.array(flops), np.array(nbytes), np.array(reqs, dtype=np.float64),
                   np.array(measured, dtype=np.float64), labels)
    return data, device, device_name, next(iter(dtypes)), sources


def _exclusion(it: dict) -> str | None:
    if iteration_class(it["num_prefill_tokens"], it["num_decode_tokens"]) is None:
        return "no tokens"
    if it.get("num_swapped_out_blocks") or it.get("num_swapped_in_blocks"):
        return "swap copies"  # their time is the host link's, not the roofline's
    if not it["duration_s"] > 0:
        return "no measured time"
    return None


# ---- the profile ----------------------------------------------------------------------------
def _rates(theta: np.ndarray) -> DeviceRates:
    return DeviceRates(
        memory_bandwidth=1.0 / theta[A] if theta[A] > 0 else None,
        flop_rate=1.0 / theta[B] if theta[B] > 0 else None,
        iteration_overhead_s=float(theta[T0]),
        row_overhead_s=float(theta[TR]),
        attention_efficiency=1.0 / theta[E] if theta[E] > 0 else 1.0,
    )


def calibrate(results: Sequence[tuple[str, dict]]) -> dict:
    """The profile (a JSON-ready dict) fitted to ``results`` [(path, result dict)]."""
    data, device, device_name, dtype, sources = fit_data(results)
    fit, rounds = fit_rates(data, device)
    rates = _rates(fit.theta)
    models = tuple(dict.fromkeys(s.model for s in sources))
    profile = DeviceProfile(device, device_name, dtype, models, rates)
    predicted, _ = _times_and_grad(fit.theta, data)
    out = profile_to_dict(profile)
    out["params"] = _param_report(fit, rates, device)
    out["residuals"] = error_stats(predicted, data.measured, data.labels)
    out["num_iterations"] = data.n
    out["sources"] = [
        {"file": s.file, "workload": s.workload, "model": s.model, "iterations_used": s.used,
         "excluded": s.excluded}
        for s in sources
    ]
    out["fit"] = {
        "method": "Huber M-estimator on relative error (scipy.optimize.least_squares, trf)",
        "residual_scale": fit.scale,
        "huber_k": HUBER_K,
        "max_rse": MAX_RSE,
        "rounds": rounds,
    }
    return out


def _param_report(fit: Fit, rates: DeviceRates, device: str) -> dict:
    values = {
        "memory_bandwidth": rates.memory_bandwidth,
        "flop_rate": rates.flop_rate,
        "attention_efficiency": rates.attention_efficiency,
        "iteration_overhead_s": rates.iteration_overhead_s,
        "row_overhead_s": rates.row_overhead_s,
    }
    fallback_text = (
        "left out (the CPU has no spec to fall back on)"
        if device == CPU_DEVICE
        else "the uncalibrated simulator's value for this GPU"
    )
    out = {}
    for p, name in enumerate(PARAMS):
        fitted = p in fit.free
        entry = {
            "value": values[name] if fitted else None,
            "status": "fitted" if fitted else "not identified",
            "rse": _finite(fit.rse[p]) if fitted else None,
            "median_share_of_time": fit.share[p],
            "used": values[name],
        }
        if not fitted:
            entry["note"] = f"the data cannot determine it; the simulator uses {fallback_text}"
        out[name] = entry
    if device != CPU_DEVICE:
        gpu = get_gpu_spec(device)
        if rates.memory_bandwidth:
            out["memory_bandwidth"]["fraction_of_peak"] = rates.memory_bandwidth / gpu.hbm_bandwidth
        if rates.flop_rate:
            out["flop_rate"]["fraction_of_peak"] = rates.flop_rate / gpu.bf16_flops
    return out
