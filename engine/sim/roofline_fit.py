"""The robust fit behind `cbbench calibrate`: the simulator's roofline, vectorized over many
iterations, fitted to measured times.

The model is the simulator's own (engine/sim/cost_model.py; a test checks they agree): per
iteration,

    t = sum over operators of max(FLOPs / flop_rate, bytes / memory_bandwidth)
        (attention's decode and prefill rows each at its efficiency of both rates)
        + iteration_overhead_s + row_overhead_s x requests + prefill_overhead_s x prefills

fitted on log(predicted / measured) (timing noise is multiplicative: a loaded host stretches
an iteration by a factor, and a relative error is bounded below by -1 but not above, which
drags a fit towards predicting nothing): an M-estimator by iteratively reweighted least
squares over scipy's bounded trust-region solver, every parameter >= 0 — Huber's weights
first, then Tukey's bisquare from there (each class's scale from its median absolute
deviation), the three iteration classes weighted equally (decode steps outnumber the rest a
hundredfold, and only the others show the FLOP rate).

Which parameters are free, and which iterations fit each, is analysis/roofline_select.py's
part: a parameter whose relative standard error (sandwich covariance) exceeds MAX_RSE, or
which sits at 0, is not identified and is fixed at its fallback (a GPU: the uncalibrated
simulator's value from its spec; the CPU: the term left out). Last, host_factor(): the
measured total time over the fitted (typical) total, which a shared host's lost time puts
above 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cost_model import (
    DEFAULT_ETA_COMPUTE,
    DEFAULT_ETA_MEMORY,
    DEFAULT_ITERATION_OVERHEAD_S,
)
from .device_profile import CPU_DEVICE
from .gpu_specs import get_gpu_spec

MIN_ITERATIONS = 50
# A parameter known to worse than +-25% (one standard error) is not identified by the data.
MAX_RSE = 0.25
HUBER_K = 1.345  # Huber's tuning constant (95% efficiency under normal noise)
BISQUARE_C = 4.685  # Tukey's bisquare constant (95% efficiency under normal noise)
MAD_TO_SIGMA = 1.4826
MIN_SCALE = 1e-3  # relative: below this the timer, not the model, is the limit
TINY_S = 1e-12  # a floor under predicted times, so their log stays finite
FIRST_PASS_SCALE = 0.1  # the start's soft-L1 scale, before the data give a better one
IRLS_ROUNDS = 12
IRLS_TOLERANCE = 1e-3  # largest relative parameter change that ends the reweighting
GRID_POINTS = 17  # per rate, log-spaced over 4 decades below the rate that explains all
GRID_MAX_ROWS = 2000  # iterations the grid search for a start looks at
FIT_MAX_ROWS = 5000  # iterations the fit looks at (the host factor and residuals: all)
HOST_WINSOR_PERCENTILE = 99.5
# A free parameter's (unit) Jacobian column left by the others' to less than this is not told
# apart from them; shapes equal to this many digits are one shape (_varies).
VARY_RTOL = 1e-6
DISTINCT_DIGITS = 9
PARAMS = ("memory_bandwidth", "flop_rate", "decode_attention_efficiency",
          "prefill_attention_efficiency", "iteration_overhead_s", "row_overhead_s",
          "prefill_overhead_s")
# Internal parameters: the time per unit (inverse rates), so the model is linear in most of
# them: a = s/byte, b = s/FLOP, ed and ep = 1/attention efficiency (decode, prefill rows),
# t0 = s/iteration, tr = s/row, tp = s/prefill request.
A, B, ED, EP, T0, TR, TP = range(7)
NUM_PARAMS = 7


@dataclass
class FitData:
    op_flops: np.ndarray  # [n, operators], the attention column 0 (it is split below)
    op_bytes: np.ndarray
    attn: np.ndarray  # [n, 4]: decode FLOPs, decode bytes, prefill FLOPs, prefill bytes
    num_reqs: np.ndarray
    num_prefill_reqs: np.ndarray
    measured: np.ndarray
    labels: list[str | None]
    # Each iteration's weight in a fit (None: 1 each): a microbenchmark row stands for the
    # timed steps of its median.
    weights: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.measured.size)

    def subset(self, keep: np.ndarray) -> FitData:
        """The iterations where ``keep`` (a boolean mask or indices) says so."""
        idx = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep)
        return FitData(self.op_flops[idx], self.op_bytes[idx], self.attn[idx],
                       self.num_reqs[idx], self.num_prefill_reqs[idx], self.measured[idx],
                       [self.labels[i] for i in idx],
                       None if self.weights is None else self.weights[idx])


def times_and_grad(theta: np.ndarray, d: FitData) -> tuple[np.ndarray, np.ndarray]:
    """Predicted times [n] and their gradient [n, NUM_PARAMS] in the internal parameters."""
    a, b, ed, ep = theta[A], theta[B], theta[ED], theta[EP]
    compute = d.op_flops * b
    memory = d.op_bytes * a
    mem_bound = memory > compute
    others = np.where(mem_bound, memory, compute).sum(axis=1)
    # Attention: one operator, each kind of row at its own efficiency (CostModel.cost).
    fd, bd, fp, bp = d.attn.T
    attn_f = fd * ed + fp * ep
    attn_b = bd * ed + bp * ep
    attn_mem = attn_b * a > attn_f * b
    attn = np.where(attn_mem, attn_b * a, attn_f * b)
    t = others + attn + theta[T0] + theta[TR] * d.num_reqs + theta[TP] * d.num_prefill_reqs
    grad = np.empty((d.n, NUM_PARAMS))
    grad[:, A] = (d.op_bytes * mem_bound).sum(axis=1) + np.where(attn_mem, attn_b, 0.0)
    grad[:, B] = (d.op_flops * ~mem_bound).sum(axis=1) + np.where(attn_mem, 0.0, attn_f)
    grad[:, ED] = np.where(attn_mem, bd * a, fd * b)
    grad[:, EP] = np.where(attn_mem, bp * a, fp * b)
    grad[:, T0] = 1.0
    grad[:, TR] = d.num_reqs
    grad[:, TP] = d.num_prefill_reqs
    return t, grad


@dataclass
class Fit:
    theta: np.ndarray
    free: list[int]
    residuals: np.ndarray  # log(predicted / measured)
    scale: dict[str, float]  # robust residual scale per class
    rse: dict[int, float]  # relative standard error of each free parameter
    share: dict[int, float]  # median fraction of an iteration's time the parameter explains


def class_weights(labels: Sequence[str | None]) -> np.ndarray:
    """Each iteration class (decode, mixed, prefill) weighs the same in total: a run is
    mostly decode steps, and an unweighted fit would let them set the FLOP rate that only
    the rarer prefill-carrying steps can show. Normalized to a mean weight of 1."""
    classes = np.asarray(labels, dtype=object)
    w = np.zeros(classes.size)
    present = [c for c in np.unique(classes)]
    for c in present:
        mask = classes == c
        w[mask] = classes.size / (len(present) * mask.sum())
    return w


def class_scales(r: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Each class's robust residual scale (1.4826 x MAD): each has its own noise, a long
    prefill being timed more steadily than a 1 ms decode."""
    scales = {}
    for c in np.unique(labels):
        rc = r[labels == c]
        scales[str(c)] = max(MAD_TO_SIGMA * float(np.median(np.abs(rc - np.median(rc)))),
                             MIN_SCALE)
    return scales


def _robust_weights(r: np.ndarray, labels: np.ndarray, scales: dict, kind: str) -> np.ndarray:
    """IRLS weights: Huber's min(1, k / |u|), or Tukey's bisquare (1 - (u / c)^2)^2 inside
    c and 0 beyond, with u = r / the class's scale."""
    sigma = np.array([scales[str(c)] for c in labels])
    u = np.abs(r) / sigma
    if kind == "huber":
        return np.minimum(1.0, HUBER_K / np.maximum(u, 1e-300))
    return np.where(u < BISQUARE_C, (1.0 - (u / BISQUARE_C) ** 2) ** 2, 0.0)


def robust_fit(d: FitData, theta0: np.ndarray, free: list[int], scale_hint: np.ndarray) -> Fit:
    """Huber M-estimate by iteratively reweighted least squares: each round solves the
    weighted (class x Huber) least-squares problem with scipy's bounded trust-region solver,
    then reweighs by the new residuals, until the parameters settle."""
    from scipy.optimize import least_squares

    fixed = theta0.copy()
    s = scale_hint[free]
    log_m = np.log(d.measured)
    labels = np.asarray(d.labels, dtype=object)
    cw = class_weights(d.labels)

    def unpack(z):
        th = fixed.copy()
        th[free] = z * s
        return th

    # scipy's solver asks for the Jacobian at the point whose residuals it has just
    # accepted: one model evaluation serves both (the calibration's main CPU cost).
    last: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def evaluate(z):
        key = z.tobytes()
        if key not in last:
            last.clear()
            last[key] = times_and_grad(unpack(z), d)
        return last[key]

    def residuals(z):
        t, _ = evaluate(z)
        return np.log(np.maximum(t, TINY_S)) - log_m

    def jac(z):
        t, g = evaluate(z)
        return g[:, free] * s / np.maximum(t, TINY_S)[:, None]

    z = np.maximum(theta0[free] / s, 1e-6)
    bounds = (np.zeros(len(free)), np.full(len(free), np.inf))
    r = residuals(z)

    def irls(z, r, kind, scales):
        if not free:  # everything fixed: nothing to fit, only residuals to report
            return z, r, class_scales(r, labels)
        for _ in range(IRLS_ROUNDS):
            if kind == "huber":  # the scale follows the fit; the bisquare keeps Huber's
                scales = class_scales(r, labels)
            sw = np.sqrt(cw * _robust_weights(r, labels, scales, kind))
            res = least_squares(lambda z, sw=sw: sw * residuals(z), z,
                                jac=lambda z, sw=sw: sw[:, None] * jac(z),
                                bounds=bounds, method="trf", x_scale="jac")
            moved = np.max(np.abs(res.x - z) / np.maximum(np.abs(z), 1e-12))
            z, r = res.x, residuals(res.x)
            if moved < IRLS_TOLERANCE:
                break
        return z, r, scales

    # Huber first (convex: a safe start), then Tukey's bisquare from there: a host that
    # stretches a third of the iterations (another process held the CPU) pulls a Huber fit
    # by a constant force per stretched step; the bisquare gives them no weight, so the fit
    # is the typical iteration and host_factor() accounts for the rest.
    z, r, scales = irls(z, r, "huber", {})
    z, r, scales = irls(z, r, "bisquare", scales)
    h = _robust_weights(r, labels, scales, "bisquare")
    theta = unpack(z)
    # Covariance of the weighted Huber estimate, the sandwich (HC0) form: the class weights
    # are not inverse variances, so the plain (J'WJ)^-1 s^2 would count a heavily weighted
    # prefill step as many observations. Log residuals make it relative.
    J = jac(z)
    w = cw * h
    bread = J.T @ (J * w[:, None])
    meat = J.T @ (J * (w * r)[:, None] ** 2)
    rse: dict[int, float] = {}
    try:
        inv = np.linalg.inv(bread)
        diag = np.diag(inv @ meat @ inv)
    except np.linalg.LinAlgError:
        diag = np.full(len(free), np.inf)
    varies = _varies(J, w)
    for j, p in enumerate(free):
        column = np.abs(J[:, j]).max() if J.size else 0.0
        if (z[j] <= 0 or column == 0 or not np.isfinite(diag[j]) or diag[j] < 0
                or not varies[j]):
            rse[p] = math.inf
        else:
            rse[p] = float(math.sqrt(diag[j]) / z[j])
    return Fit(theta, list(free), r, scales, rse, shares(theta, d))


def _varies(J: np.ndarray, w: np.ndarray) -> list[bool]:
    """Per free parameter: whether the data vary in what it multiplies, apart from what the
    other free parameters multiply. A standard error from residuals says nothing when they
    do not: 200 copies of one iteration fit four parameters exactly (zero residuals, zero
    error), though one point can show only one sum. So a parameter is identified only when
    the iterations (those the fit weighs) take more distinct shapes than there are free
    parameters, and its column is not, to VARY_RTOL, a combination of the others' columns."""
    used = J[w > 0] * np.sqrt(w[w > 0])[:, None]
    k = J.shape[1]
    if not k:
        return []
    if used.shape[0] == 0:
        return [False] * k
    norms = np.linalg.norm(used, axis=0)
    unit = used / np.where(norms > 0, norms, 1.0)
    distinct = np.unique(np.round(unit, DISTINCT_DIGITS), axis=0).shape[0]
    # One free parameter is one scale, which any shape it shows in determines (200 copies of
    # one iteration fit one time exactly): the fit keeps one, and the profile it writes
    # predicts that time instead of none (a profile of only fallbacks predicted 0 s).
    if distinct <= k and k > 1:
        return [False] * k
    out = []
    for j in range(k):
        if norms[j] == 0:
            out.append(False)
            continue
        others = np.delete(unit, j, axis=1)
        if others.shape[1]:
            coef, *_ = np.linalg.lstsq(others, unit[:, j], rcond=None)
            left = float(np.linalg.norm(unit[:, j] - others @ coef))
        else:
            left = 1.0
        out.append(left > VARY_RTOL)
    return out


def shares(theta: np.ndarray, d: FitData) -> dict[int, float]:
    """Each parameter's median fraction of an iteration's time."""
    t, g = times_and_grad(theta, d)
    return {p: float(np.median(theta[p] * g[:, p] / np.maximum(t, TINY_S)))
            for p in range(NUM_PARAMS)}


def initial_guess(d: FitData) -> tuple[np.ndarray, np.ndarray]:
    """A start for the local fit, and each parameter's natural scale.

    The roofline's max() makes the fit non-convex in the two rates (which operators are
    memory- or compute-bound depends on them), so the start comes from a grid over the two
    inverse rates (0, i.e. that limit left out, included); at each grid point the rest of the
    model is linear in (attention factor, overheads per iteration, row and prefill), solved by
    non-negative least squares on relative error. The grid point with the lowest robust
    (soft-L1, log) cost wins."""
    from scipy.optimize import nnls

    d = subsample(d, GRID_MAX_ROWS)
    m = d.measured
    med = float(np.median(m))
    # Each parameter alone explaining the median iteration: an upper end for its grid.
    all_bytes = d.op_bytes.sum(axis=1) + d.attn[:, 1] + d.attn[:, 3]
    all_flops = d.op_flops.sum(axis=1) + d.attn[:, 0] + d.attn[:, 2]
    scale = np.array([
        med / max(float(np.median(all_bytes)), 1e-300),
        med / max(float(np.median(all_flops)), 1e-300),
        1.0,
        1.0,
        med,
        med / max(float(np.median(d.num_reqs)), 1.0),
        med,
    ])
    grid = np.concatenate(([0.0], np.logspace(-4, 0, GRID_POINTS)))
    best: np.ndarray | None = None
    best_cost = math.inf
    ones = np.ones_like(m)
    cw = class_weights(d.labels)
    sw = np.sqrt(cw)
    for fa in grid:
        for fb in grid:
            if fa == 0 and fb == 0:
                continue
            theta = np.array([fa * scale[A], fb * scale[B], 1.0, 1.0, 0.0, 0.0, 0.0])
            others = np.maximum(d.op_flops * theta[B], d.op_bytes * theta[A]).sum(axis=1)
            # Each kind of attention row apart (a start needs no more): linear in ed, ep.
            fd, bd, fp, bp = d.attn.T
            dec = np.maximum(fd * theta[B], bd * theta[A])
            pre = np.maximum(fp * theta[B], bp * theta[A])
            # others + ed*dec + ep*pre + t0 + tr*R + tp*P = m, divided by m.
            cols = np.stack([dec, pre, ones, d.num_reqs, d.num_prefill_reqs], axis=1)
            cols = cols / m[:, None]
            col_scale = 1.0 / np.maximum(cols.max(axis=0), 1e-300)
            x, _ = nnls(cols * col_scale * sw[:, None], (1.0 - others / m) * sw, maxiter=200)
            theta[ED], theta[EP], theta[T0], theta[TR], theta[TP] = x * col_scale
            t, _ = times_and_grad(theta, d)
            r = np.log(np.maximum(t, TINY_S)) - np.log(m)
            cost = float(np.sum(cw * (np.sqrt(1.0 + (r / FIRST_PASS_SCALE) ** 2) - 1.0)))
            if cost < best_cost:
                best, best_cost = theta, cost
    assert best is not None, "no start point on the grid had a finite cost"
    theta0 = np.where(best > 0, best, scale * 1e-3)
    for e in (ED, EP):
        theta0[e] = min(max(theta0[e], 1e-2), 1e2) if best[e] > 0 else 1.0
    return theta0, scale


def subsample(d: FitData, limit: int) -> FitData:
    """At most ``limit`` iterations for the start's grid search: every prefill and mixed one
    (the rare, informative kinds), decodes at an even stride."""
    if d.n <= limit:
        return d
    labels = np.asarray(d.labels, dtype=object)
    rare = np.flatnonzero(labels != "decode")
    decode = np.flatnonzero(labels == "decode")
    room = max(limit - rare.size, 1)
    keep = np.sort(np.concatenate([rare, decode[:: max(1, -(-decode.size // room))]]))
    return d.subset(keep)


def fallbacks(device: str) -> np.ndarray:
    """Internal parameter values for terms the data cannot identify (see the module doc)."""
    if device == CPU_DEVICE:
        return np.array([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    gpu = get_gpu_spec(device)
    return np.array([
        1.0 / (gpu.hbm_bandwidth * DEFAULT_ETA_MEMORY),
        1.0 / (gpu.bf16_flops * DEFAULT_ETA_COMPUTE),
        1.0,
        1.0,
        DEFAULT_ITERATION_OVERHEAD_S,
        0.0,
        0.0,
    ])


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def host_factor(typical: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """(factor, its relative standard error): measured over the robust fit's time, summed.

    The robust fit predicts a typical iteration; a shared host also loses time to other
    processes (an iteration the OS preempts takes a slice longer), which a mean — what
    throughput, TPOT and queueing add up — includes. The ratio of sums, with each
    iteration's ratio winsorized at the HOST_WINSOR_PERCENTILE (so a one-off stall of
    seconds does not set it), puts the simulator's total time on the measured one."""
    ratio = measured / typical
    capped = np.minimum(ratio, np.percentile(ratio, HOST_WINSOR_PERCENTILE))
    total = float(typical.sum())
    factor = float((typical * capped).sum() / total)
    n = typical.size
    spread = typical * capped - factor * typical
    se = float(np.sqrt((spread**2).sum() / max(n - 1, 1)) * np.sqrt(n) / total)
    return factor, se / factor
