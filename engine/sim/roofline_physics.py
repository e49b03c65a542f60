"""The calibration fit on a GPU with a spec: every rate inside the device's physics, the spec's
priors where the data are silent, and each parameter reported as the data determine it.

The model is roofline_fit.py's (the simulator's own). What changes on a device with a spec:

- **Bounds from physics.** The memory bandwidth is at most the spec's peak HBM bandwidth, the
  FLOP rate at most its dense bf16 peak, attention at most those rates (efficiency <= 1), and
  every overhead is >= 0 and no longer than the shortest step it is part of.
- **Priors from the spec** (a maximum a posteriori fit). The uncalibrated simulator's values
  (cost_model.Efficiency: 80% of peak bandwidth, 60% of peak FLOP rate, 300 µs per step) are
  the prior means, with the widths below. A run at one batch size reads the weights once per
  step, so the weight read and a fixed overhead move together; least squares alone split
  that sum at random (a fit on an H100 run at batch 32 gave 264 TB/s and 6.3 ms per step,
  each with an error under 1%). With priors, the data decide what they measure and the spec
  the rest.
- **Each parameter's status from the information the data add** (a Laplace approximation:
  the posterior covariance in units of the prior's widths is (I + F)^-1, F the data's Fisher
  information). A parameter is ``fitted`` when the data shrink its prior variance by at least
  MIN_SHRINKAGE; else ``prior`` (the spec's value, nudged), named with its confounder: the
  parameter its posterior is most correlated with. The shrinkages sum to at most the rank of
  F, so N copies of one iteration (rank 1) fit at most one scale. A value on a physical bound
  is ``at bound`` when the data put it there: it left its prior mean for the bound, or the
  data determine it (shrinkage >= MIN_SHRINKAGE) and it stayed on a bound its prior sits on.
  A parameter no iteration shows (prefill attention in a decode-only trace: its prior 1 is
  the bound) keeps its prior and is ``prior``: a bound the data never touched says nothing
  about what they ask for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .cost_model import DEFAULT_ETA_COMPUTE, DEFAULT_ETA_MEMORY, DEFAULT_ITERATION_OVERHEAD_S
from .gpu_specs import GPUSpec
from .roofline_fit import (
    IRLS_ROUNDS,
    IRLS_TOLERANCE,
    NUM_PARAMS,
    PARAMS,
    TINY_S,
    FitData,
    _robust_weights,
    class_scales,
    shares,
    times_and_grad,
)

# Prior widths: one standard deviation, relative (log) for the rates, absolute for overheads.
# A tuned kernel streams at 60-95% of peak HBM bandwidth (0.3 in log spans that); GEMMs reach
# 30-80% of dense peak (0.5); attention kernels at most the GEMMs' rates, often far less.
BANDWIDTH_LOG_SD = 0.3
FLOP_RATE_LOG_SD = 0.5
ATTENTION_LOG_SD = 0.7
ITERATION_OVERHEAD_SD_S = 1e-3  # a CUDA-graph step: tens of µs to ~1 ms of host work
ROW_OVERHEAD_SD_S = 20e-6  # per request row: building the batch, sampling
PREFILL_OVERHEAD_SD_S = 1e-3  # per prefill request: its own attention launch and bookkeeping
# A parameter is fitted when the data cut its prior variance by this much (its posterior sd is
# at most half the prior's); below, the spec's prior carries it.
MIN_SHRINKAGE = 0.75
# A confounder is named when the posterior correlation is at least this strong.
MIN_CONFOUNDING = 0.3
# A value within this relative distance of a physical bound is at that bound.
AT_BOUND_RTOL = 1e-3
# The start's soft-L1 scale (log residual) before the data give their own.
START_SCALE = 0.1
START_MARGIN = 0.05  # prior sds inside a bound, where the solver starts


@dataclass(frozen=True)
class Prior:
    mean: float  # internal units (roofline_fit's: s/byte, s/FLOP, 1/efficiency, s)
    sd: float  # of log(value) when log, else of the value
    log: bool
    low: float  # physical bounds, internal units
    high: float
    basis: str  # where the prior and bounds come from, for the profile


@dataclass
class PhysicsFit:
    theta: np.ndarray
    residuals: np.ndarray  # log(predicted / measured)
    scale: dict[str, float]
    status: dict[int, str]  # fitted | prior | at bound
    shrinkage: dict[int, float]  # 1 - posterior variance / prior variance
    rse: dict[int, float]  # posterior sd, relative to the value
    confounder: dict[int, tuple[str, float]]  # parameter -> (confounder, posterior corr)
    # parameter -> the largest posterior variance (in prior units) left in any combination
    # of it and its confounder: near 1, the data leave that combination to the prior.
    left_with_confounder: dict[int, float]
    share: dict[int, float]
    priors: list[Prior]
    effective_params: float  # sum of shrinkages: how many parameters the data determine

    @property
    def free(self) -> list[int]:
        return [p for p in range(NUM_PARAMS) if self.status[p] == "fitted"]


def spec_priors(gpu: GPUSpec, d: FitData, dtype: str = "bf16") -> list[Prior]:
    """The priors and physical bounds on ``gpu`` for the iterations ``d`` of a ``dtype`` run
    (the FLOP peak is the dtype's: fp32 GEMMs run at the FP32 peak, gpu_specs.FP32_FLOPS)."""
    m = d.measured
    reqs = np.maximum(d.num_reqs, 1.0)
    pre = d.num_prefill_reqs > 0
    shortest = float(m.min())
    # An overhead is part of every step it applies to: no longer than the shortest of them.
    row_max = float((m / reqs).min())
    prefill_max = float((m[pre] / d.num_prefill_reqs[pre]).min()) if pre.any() else shortest
    peak_bw, peak_flops = gpu.hbm_bandwidth, gpu.peak_flops(dtype)
    if peak_flops is None:
        raise ValueError(f"{gpu.name} has no {dtype} FLOP peak listed")
    return [
        Prior(1.0 / (peak_bw * DEFAULT_ETA_MEMORY), BANDWIDTH_LOG_SD, True, 1.0 / peak_bw,
              math.inf, f"prior {DEFAULT_ETA_MEMORY:.0%} of peak {peak_bw / 1e12:g} TB/s "
              f"(log sd {BANDWIDTH_LOG_SD}); bound: <= peak"),
        Prior(1.0 / (peak_flops * DEFAULT_ETA_COMPUTE), FLOP_RATE_LOG_SD, True, 1.0 / peak_flops,
              math.inf, f"prior {DEFAULT_ETA_COMPUTE:.0%} of dense {dtype} peak "
              f"{peak_flops / 1e12:g} TFLOP/s (log sd {FLOP_RATE_LOG_SD}); bound: <= peak"),
        Prior(1.0, ATTENTION_LOG_SD, True, 1.0, math.inf,
              f"prior 1 (attention at the fitted rates; log sd {ATTENTION_LOG_SD}); bound: <= 1"),
        Prior(1.0, ATTENTION_LOG_SD, True, 1.0, math.inf,
              f"prior 1 (attention at the fitted rates; log sd {ATTENTION_LOG_SD}); bound: <= 1"),
        Prior(DEFAULT_ITERATION_OVERHEAD_S, ITERATION_OVERHEAD_SD_S, False, 0.0, shortest,
              f"prior {DEFAULT_ITERATION_OVERHEAD_S * 1e6:g} µs (sd "
              f"{ITERATION_OVERHEAD_SD_S * 1e6:g} µs); bound: 0 .. the shortest step"),
        Prior(0.0, ROW_OVERHEAD_SD_S, False, 0.0, row_max,
              f"prior 0 (sd {ROW_OVERHEAD_SD_S * 1e6:g} µs); bound: 0 .. the shortest step "
              "per request"),
        Prior(0.0, PREFILL_OVERHEAD_SD_S, False, 0.0, prefill_max,
              f"prior 0 (sd {PREFILL_OVERHEAD_SD_S * 1e6:g} µs); bound: 0 .. the shortest "
              "prefill step per prefill"),
    ]


def _from_u(u: np.ndarray, priors: list[Prior]) -> tuple[np.ndarray, np.ndarray]:
    """(internal parameters, d theta / d u) of prior units ``u``."""
    theta = np.empty(NUM_PARAMS)
    dtheta = np.empty(NUM_PARAMS)
    for i, p in enumerate(priors):
        if p.log:
            theta[i] = p.mean * math.exp(u[i] * p.sd)
            dtheta[i] = theta[i] * p.sd
        else:
            theta[i] = p.mean + u[i] * p.sd
            dtheta[i] = p.sd
    return theta, dtheta


def _u_bounds(priors: list[Prior]) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = [], []
    for p in priors:
        if p.log:
            lo.append((math.log(p.low) - math.log(p.mean)) / p.sd if p.low > 0 else -np.inf)
            hi.append((math.log(p.high) - math.log(p.mean)) / p.sd if math.isfinite(p.high)
                      else np.inf)
        else:
            lo.append((p.low - p.mean) / p.sd)
            hi.append((p.high - p.mean) / p.sd)
    lo_a, hi_a = np.array(lo), np.array(hi)
    return lo_a, np.maximum(hi_a, lo_a + 1e-9)


def fit_physics(d: FitData, gpu: GPUSpec, dtype: str = "bf16") -> PhysicsFit:
    """The bounded MAP fit of ``d`` (a ``dtype`` run) on ``gpu`` (see the module doc)."""
    from scipy.optimize import least_squares

    priors = spec_priors(gpu, d, dtype)
    lo, hi = _u_bounds(priors)
    log_m = np.log(d.measured)
    labels = np.asarray(d.labels, dtype=object)
    weights = d.weights if d.weights is not None else np.ones(d.n)

    def data_res(u):
        t, _ = times_and_grad(_from_u(u, priors)[0], d)
        return np.log(np.maximum(t, TINY_S)) - log_m

    def data_jac(u):
        theta, dtheta = _from_u(u, priors)
        t, g = times_and_grad(theta, d)
        return g * dtheta / np.maximum(t, TINY_S)[:, None]

    def solve(u, sw, loss="linear", f_scale=1.0):
        u = np.clip(u, lo + margin, hi - margin)  # off the bounds, where trf can move
        res = least_squares(lambda u: np.concatenate([sw * data_res(u), u]), u,
                            jac=lambda u: np.vstack([sw[:, None] * data_jac(u),
                                                     np.eye(NUM_PARAMS)]),
                            bounds=(lo, hi), method="trf", loss=loss, f_scale=f_scale)
        return res.x

    # The bounded solver cannot leave a bound it starts on: start just inside each.
    margin = np.minimum(START_MARGIN, (hi - lo) / 4)
    u = np.clip(np.zeros(NUM_PARAMS), lo + margin, hi - margin)
    # A start on the typical iteration: soft-L1 at a fixed scale (no class scale is known yet).
    u = solve(u, np.sqrt(weights) / START_SCALE, loss="soft_l1", f_scale=1.0)
    r = data_res(u)
    scales: dict[str, float] = {}
    # Huber, then Tukey's bisquare from there (roofline_fit.robust_fit's reasons): the data
    # residuals in units of their class's robust scale, so the prior weighs against the data's
    # real noise.
    for kind in ("huber", "bisquare"):
        if kind == "huber" or not scales:
            scales = class_scales(r, labels)
        for _ in range(IRLS_ROUNDS):
            if kind == "huber":
                scales = class_scales(r, labels)
            sigma = np.array([scales[str(c)] for c in labels])
            sw = np.sqrt(weights * _robust_weights(r, labels, scales, kind)) / sigma
            new = solve(u, sw)
            moved = float(np.max(np.abs(new - u)))
            u, r = new, data_res(new)
            if moved < IRLS_TOLERANCE:
                break
    theta, _ = _from_u(u, priors)
    sigma = np.array([scales[str(c)] for c in labels])
    w = weights * _robust_weights(r, labels, scales, "bisquare") / sigma**2
    J = data_jac(u)
    fisher = J.T @ (J * w[:, None])
    cov = np.linalg.inv(np.eye(NUM_PARAMS) + fisher)
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    shrink = {p: float(1.0 - cov[p, p]) for p in range(NUM_PARAMS)}
    corr = cov / np.outer(np.maximum(sd, 1e-300), np.maximum(sd, 1e-300))
    status: dict[int, str] = {}
    rse: dict[int, float] = {}
    confounder: dict[int, tuple[str, float]] = {}
    left: dict[int, float] = {}
    for p, prior in enumerate(priors):
        if _at_bound(theta[p], prior) and (shrink[p] >= MIN_SHRINKAGE
                                           or not _at_bound(prior.mean, prior)):
            status[p] = "at bound"
        elif shrink[p] >= MIN_SHRINKAGE:
            status[p] = "fitted"
        else:
            status[p] = "prior"
        # A relative error: a log prior's unit is relative already; a linear one's over the value.
        rse[p] = float(sd[p] * prior.sd if prior.log
                  else (sd[p] * prior.sd / theta[p] if theta[p] > 0 else math.inf))
        others = [q for q in range(NUM_PARAMS) if q != p]
        q = max(others, key=lambda q: abs(corr[p, q]))
        if abs(corr[p, q]) >= MIN_CONFOUNDING:
            confounder[p] = (PARAMS[q], float(corr[p, q]))
            left[p] = float(np.linalg.eigvalsh(cov[np.ix_([p, q], [p, q])]).max())
    return PhysicsFit(theta, r, scales, status, shrink, rse, confounder, left,
                      shares(theta, d), priors, float(sum(shrink.values())))


def _at_bound(value: float, prior: Prior) -> bool:
    """Whether ``value`` (internal units) lies on one of ``prior``'s physical bounds."""
    low = prior.low > 0 and value <= prior.low * (1 + AT_BOUND_RTOL)
    high = math.isfinite(prior.high) and prior.high > 0 and value >= prior.high * (1 - AT_BOUND_RTOL)
    return low or high

