"""Which of the roofline's parameters a calibration run determines, and from which iterations
(analysis/roofline_fit.py has the model and the robust fit itself).

The parameters overlap: the weights read once per iteration cost the same in every step, like
a fixed overhead; a decode row's GEMM FLOPs grow with the rows, like an overhead per row; a
decode row's keys cost memory bandwidth x an efficiency. A run of short prompts (ShareGPT)
cannot tell these apart, and fits that explain it equally well split the time differently,
which changes nothing in the calibration run and everything at the long contexts a simulator
is asked about: the same host gave decode attention 1.2x the weights' bandwidth in one run and
0.1x the FLOP rate (plus 0.5 ms per step instead of 50 µs per row) in the next, and the second
predicted long-context decode steps 60% too slow. Three rules keep the split the data's:

1. **Each parameter is fitted on the iterations that measure it.** All classes together
   (weighted equally: decode steps, a hundredfold more, would explain their per-row cost
   with FLOPs) give a start. Then the decode-side terms (memory bandwidth, decode attention
   efficiency, overheads per iteration and per row) are refitted on the decode steps alone,
   every step counting once, and the FLOP rate and prefill-only terms (prefill attention
   efficiency, overhead per prefill) on the prefill-carrying steps, everything else held;
   twice, so each side sees the other's latest values. A term a stage cannot identify keeps
   the value an earlier stage gave it. With equal class weights throughout, the fifteen
   prefill steps of a 15,000-step run weighed as much as all the decode steps, so the
   decode-side terms were fitted, and judged identified or not, on a few hundred steps'
   worth of information. A stage's relative errors are given the other stages' values:
   within a stage, collinear terms (bandwidth and fixed overhead, above) are split by which
   one an earlier stage settled, so their sum and product are what is determined.
2. **An attention efficiency is kept only where the data tell it from 1** (unidentified()).
3. **Of the unidentified parameters, the one the data need least goes first**
   (least_needed()), not the one whose error the noise made largest.

Within a stage: backward elimination, refitting until every free parameter is identified.
"""

from __future__ import annotations

import math

import numpy as np
from threadpoolctl import threadpool_limits

from .roofline_fit import (
    BISQUARE_C,
    ED,
    EP,
    FIRST_PASS_SCALE,
    FIT_MAX_ROWS,
    MAX_RSE,
    NUM_PARAMS,
    PARAMS,
    T0,
    TINY_S,
    TP,
    TR,
    A,
    B,
    Fit,
    FitData,
    class_scales,
    class_weights,
    fallbacks,
    finite,
    initial_guess,
    robust_fit,
    shares,
    subsample,
    times_and_grad,
)

# An attention efficiency stays free only this many standard errors away from 1 (its neutral
# value; see unidentified()): three, as an extrapolation multiplies what a fit misjudges.
NEUTRAL_Z = 3.0
# What decode steps measure: the bandwidth (weights, KV) and the terms they carry.
DECODE_SIDE = (A, ED, T0, TR)
# What only prefill-carrying steps measure: the FLOP rate (a decode step cannot tell its GEMMs'
# FLOPs from an overhead per row) and the terms only steps with prefill rows have.
PREFILL_SIDE = (B, EP, TP)
STAGE_PASSES = 2  # decode stage, prefill stage, twice: each sees the other's latest values
# A stage runs only with this many iterations of its kind (else the earlier values stand).
MIN_STAGE_ITERATIONS = {"decode": 50, "prefill": 10}
START_FRACTION = 1e-2  # a term restarted from 0 starts at this fraction of its natural scale
NEUTRAL_EFFICIENCY = 1.0  # an attention efficiency's neutral value: attention at the fitted rates
# The median start's floor for a scaled parameter: the bounded solver cannot start on its bound.
MIN_SCALED_START = 1e-6


def unidentified(fit: Fit, neutral: tuple[int, ...] = (ED, EP)) -> list[int]:
    """The free parameters the data do not determine: a relative standard error above
    MAX_RSE (or a value at 0), or an attention efficiency (of ``neutral``: those the stage
    measures) not told apart from 1.

    An efficiency is a correction to the rates the other operators set, and 1 (attention at
    those rates) is its neutral value. It matters where attention is a large share of the
    time, which is where a simulator extrapolates (long contexts), and a calibration run of
    short prompts measures it on a small share: fitted to noise, a factor of 0.7 or 1.2 on a
    term worth ~0% of the calibration's time becomes tens of percent of a long-context
    prediction. So it stays free only if it differs from 1 by more than NEUTRAL_Z standard
    errors (a test of the neutral value, like any significance test)."""
    out = [p for p in fit.free if fit.rse[p] > MAX_RSE]
    for p in neutral:
        if p in fit.free and p not in out:
            theta = fit.theta[p] / NEUTRAL_EFFICIENCY
            effect = abs(math.log(theta)) if theta > 0 else math.inf
            if effect <= NEUTRAL_Z * fit.rse[p]:
                out.append(p)
    return out


def robust_loss(fit: Fit, d: FitData, scales: dict[str, float]) -> float:
    """The bisquare objective of ``fit``'s residuals, classes weighted equally, at the given
    class scales (held fixed, so that fits of different parameter sets compare)."""
    labels = np.asarray(d.labels, dtype=object)
    sigma = np.array([scales[str(c)] for c in labels])
    u = np.minimum(np.abs(fit.residuals) / sigma, BISQUARE_C)
    rho = BISQUARE_C**2 / 6 * (1.0 - (1.0 - (u / BISQUARE_C) ** 2) ** 3)
    return float(np.sum(class_weights(d.labels) * rho))


def least_needed(d: FitData, fit: Fit, failing: list[int], fallback: np.ndarray,
                 scale: np.ndarray) -> int | None:
    """Of the unidentified parameters, the one the data need least: refit without each
    (fixed at its fallback) and take the one whose loss rises least. Two collinear terms are
    each unidentified while the other is free; dropping either costs the fit nothing, while
    dropping a term the data need (an overhead per row) costs it visibly. Worst relative
    error first, as before, let the noise pick."""
    if len(failing) <= 1:
        return failing[0] if failing else None
    best, best_loss = None, math.inf
    for p in failing:
        theta0, s = _fixed(fit.theta, scale, p, fallback)
        trial = robust_fit(d, theta0, [q for q in fit.free if q != p], s)
        loss = robust_loss(trial, d, fit.scale)
        if loss < best_loss:
            best, best_loss = p, loss
    return best


def _fixed(theta: np.ndarray, scale: np.ndarray, p: int,
           fallback: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    theta, scale = theta.copy(), scale.copy()
    theta[p] = fallback[p]
    if fallback[p] > 0:
        scale[p] = fallback[p]
    return theta, scale


def eliminate(d: FitData, theta0: np.ndarray, free: list[int], scale: np.ndarray,
              fallback: np.ndarray, stage: str,
              neutral: tuple[int, ...]) -> tuple[Fit, list[dict]]:
    """Backward elimination on ``d``: fit ``free``, fix the least needed unidentified one at
    its fallback, refit, until every free parameter is identified."""
    free, scale = list(free), scale.copy()
    rounds = []
    while True:
        fit = robust_fit(d, theta0, free, scale)
        rounds.append({
            "stage": stage,
            "free": [PARAMS[p] for p in free],
            "rse": {PARAMS[p]: finite(fit.rse[p]) for p in free},
            "residual_scale": fit.scale,
        })
        worst = least_needed(d, fit, unidentified(fit, neutral), fallback, scale)
        if worst is None:
            return fit, rounds
        free.remove(worst)
        theta0, scale = _fixed(fit.theta, scale, worst, fallback)


def _restart(theta: np.ndarray, params: tuple[int, ...], scale: np.ndarray) -> np.ndarray:
    """The latest values as a start, a term fixed at 0 restarted small (the bounded
    solver cannot move a parameter off its bound of 0 by a gradient that points below it)."""
    theta = theta.copy()
    for p in params:
        if theta[p] <= 0:
            theta[p] = NEUTRAL_EFFICIENCY if p in (ED, EP) else scale[p] * START_FRACTION
    return theta


def median_start(d: FitData, theta: np.ndarray, free: list[int],
                 scale: np.ndarray) -> np.ndarray:
    """A start for a stage's robust fit that sits on the typical iteration: soft-L1 (nearly
    least absolute) log residuals, which follow the median. The latest values alone may sit
    on the stretched steps of a busy host (its rates absorbed what it could not attribute),
    and the bisquare, started there, stays on them."""
    from scipy.optimize import least_squares

    log_m = np.log(d.measured)
    sw = np.sqrt(class_weights(d.labels))
    s = scale[free]

    def residuals(z):
        th = theta.copy()
        th[free] = z * s
        t, _ = times_and_grad(th, d)
        return sw * (np.log(np.maximum(t, TINY_S)) - log_m)

    res = least_squares(residuals, np.maximum(theta[free] / s, MIN_SCALED_START), loss="soft_l1",
                        f_scale=FIRST_PASS_SCALE, bounds=(0.0, np.inf), method="trf")
    out = theta.copy()
    out[free] = res.x * s
    return out


def fit_rates(d: FitData, device: str) -> tuple[Fit, list[dict]]:
    """The staged fit (see the module doc). Returns the final fit (its residuals and shares
    over every iteration, each parameter's error from the stage that fitted it) and every
    stage's rounds. The fit sees at most FIT_MAX_ROWS iterations (every prefill-carrying one,
    decodes at an even stride)."""
    # One BLAS thread: the fit's matrices are small (at most FIT_MAX_ROWS rows of 7; hundreds of
    # SVDs a fit), where a second thread saves nothing and, on a busy host, spin-waits for a
    # core: a calibration took 5x the CPU with OpenBLAS's default threads on 2 shared cores.
    # The results are the same to the last bit. threadpoolctl limits the libraries already
    # loaded, so scipy's own OpenBLAS is loaded first (robust_fit imports it lazily).
    import scipy.optimize  # noqa: F401

    with threadpool_limits(limits=1, user_api="blas"):
        return _fit_rates(d, device)


def _fit_rates(d: FitData, device: str) -> tuple[Fit, list[dict]]:
    d = subsample(d, FIT_MAX_ROWS)
    theta0, scale = initial_guess(d)
    fallback = fallbacks(device)
    # Stage 1 tests no efficiency against 1: the stages that measure them do.
    fit, rounds = eliminate(d, theta0, list(range(NUM_PARAMS)), scale, fallback, "all", ())
    theta, rse = fit.theta.copy(), dict(fit.rse)
    free = set(fit.free)
    labels = np.asarray(d.labels, dtype=object)
    stages = (("decode", labels == "decode", DECODE_SIDE),
              ("prefill", labels != "decode", PREFILL_SIDE)) * STAGE_PASSES
    for stage, mask, params in stages:
        part = d.subset(mask)
        if part.n < MIN_STAGE_ITERATIONS[stage]:
            continue
        # What an earlier stage identified and this one cannot keeps its value (a decode
        # step alone cannot tell the weights' bandwidth from a fixed overhead; the prefill
        # steps could): a stage refines, it does not forget.
        held = [p for p in params if p in free]
        stage_fallback = fallback.copy()
        stage_fallback[held] = theta[held]
        start = median_start(part, _restart(theta, params, scale), list(params), scale)
        sfit, srounds = eliminate(part, start, list(params), scale, stage_fallback, stage,
                                  tuple(p for p in params if p in (ED, EP)))
        rounds += srounds
        theta = sfit.theta.copy()
        for p in params:
            if p in sfit.free:
                free.add(p)
                rse[p] = sfit.rse[p]
            elif p not in held:
                free.discard(p)
                rse[p] = math.inf
    t, _ = times_and_grad(theta, d)
    residuals = np.log(np.maximum(t, TINY_S)) - np.log(d.measured)
    order = [p for p in range(NUM_PARAMS) if p in free]
    return Fit(theta, order, residuals, class_scales(residuals, labels), rse,
               shares(theta, d)), rounds

