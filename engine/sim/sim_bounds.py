"""Error bars for a simulated run on a calibrated device: the profile's residual spread,
turned into step-time factors, and an executor that applies them.

A calibrated profile records, per iteration class (decode rows only, prefill and decode rows,
prefill rows only), how far its predictions fell from the calibration run's measured steps:
``bias`` (the median signed error e = predicted / measured - 1) and ``p90`` (the 90th
percentile of |e|). Its ``spread`` is the band e in [bias - p90, bias + p90] per class, as
factors on the predicted step time (measured = predicted / (1 + e)): ``low`` the fast end,
``high`` the slow end. A run with the profile is simulated twice more, every step of a class
scaled by that class's low factor, then by its high factor; each headline figure's interval
is the range the three runs give (the simulator carries the factors through the queueing,
which a linear scaling of the figures would not).

This treats the per-step band as if a whole run could sit at either end of it: steps' random
noise averages out over a run, but a run-level shift (another process on the host, a
different calibration run, a workload the fit extrapolates to) does not, and on the recorded
CPU repeats that shift is of the same order as the per-step band (coverage reported in
results/sim_accuracy/intervals.md).
"""

from __future__ import annotations

from ..core.scheduler_output import ExecutorOutput, SchedulerOutput

SPREAD_LEVEL = 0.9  # the band's nominal coverage: p90 of |error| on either side of the bias
CLASSES = ("decode", "mixed", "prefill")
# A band reaching e <= -1 (a prediction of nothing) is clipped: at most 10x slower.
MIN_ONE_PLUS_ERROR = 0.1


def spread_from_residuals(residuals: dict) -> dict:
    """{class: {"low": factor, "high": factor}} from a profile's ``residuals`` section (a
    class without steps is left out)."""
    out = {}
    for cls in CLASSES:
        r = residuals.get(cls) or {}
        bias, p90 = r.get("bias"), r.get("p90")
        if bias is None or p90 is None:
            continue
        fast = 1.0 + bias + p90  # predicted too slow by this much: the real step is faster
        slow = max(1.0 + bias - p90, MIN_ONE_PLUS_ERROR)
        out[cls] = {"low": 1.0 / fast, "high": 1.0 / slow}
    return out


def step_class(sched: SchedulerOutput) -> str | None:
    prefill, decode = sched.num_prefill_tokens, sched.num_decode_reqs
    if prefill and decode:
        return "mixed"
    if decode:
        return "decode"
    if prefill:
        return "prefill"
    return None


class ScaledExecutor:
    """A simulated executor whose step times are scaled by a factor per iteration class."""

    def __init__(self, inner, factors: dict[str, float]) -> None:
        self.inner = inner
        self.factors = factors
        self.cost_model = inner.cost_model
        self.block_size = inner.block_size

    def execute(self, sched: SchedulerOutput) -> ExecutorOutput:
        out = self.inner.execute(sched)
        cls = step_class(sched)
        f = self.factors.get(cls, 1.0) if cls is not None else 1.0
        if out.duration_s is not None and f != 1.0:
            out.duration_s *= f
        return out
