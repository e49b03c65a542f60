"""Which window of a result `gate` and `compare` read: the whole run (``all``) or its steady
state (``steady``, summary.steady_state: ramp-up and drain left out).

``select_window`` returns the result as that window sees it: for ``steady``, a copy whose
summary holds the steady-state figures only (completed, failed, throughputs, latency
distributions) and whose requests are the ones served in the window, the ones its latency
figures count (so a percentile ``--percentiles`` fills from them is the window's too). Run-wide facts with no windowed value (engine.*, goodput, send lag) are left
out rather than mixed in: a gate threshold on one of them is refused with ``--window steady``.
"""

from __future__ import annotations

from cbbench.errors import UsageError
from cbbench.schema import RunResult, as_run
from cbbench.schema.run import Request, Summary

WINDOWS = ("all", "steady")
WINDOWED_KEYS = (
    "completed", "failed", "cancelled", "duration_s", "request_throughput",
    "output_throughput", "total_token_throughput", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms",
)
WINDOW_FACTS = ("window_s", "method")


def check_window(window: str) -> str:
    if window not in WINDOWS:
        raise UsageError(f"invalid --window {window!r}: use {' or '.join(WINDOWS)}")
    return window


def check_metric(metric: str, window: str) -> None:
    """A gate metric must have a value in the window."""
    if window == "steady" and metric.split(".", 1)[0] not in WINDOWED_KEYS:
        raise UsageError(
            f"{metric} has no steady-state value (windowed: {', '.join(WINDOWED_KEYS)}); "
            "use --window all for it"
        )


def select_window(result: RunResult | dict, window: str, path: str) -> RunResult | dict:
    """``result`` as ``window`` sees it: itself for ``all``; for ``steady`` a copy whose summary
    is the steady-state figures and whose requests are those served in the window (a dict is
    read as its model first)."""
    if window == "all":
        return result
    run = as_run(result, path)
    ss = run.summary.steady_state
    if ss is None:
        raise UsageError(
            f"{path} has no steady-state summary (made before cbbench reported one): "
            "use --window all"
        )
    a, b = ss.window_s if ss.window_s and len(ss.window_s) == 2 else (None, None)
    if a is None or b is None:
        raise UsageError(f"{path} has no steady-state window ({ss.note or 'none found'})")
    chosen = ss.model_dump(mode="json", exclude_unset=True,
                           include={*WINDOWED_KEYS, *WINDOW_FACTS})
    requests = None if run.requests is None else [
        r for r in run.requests if (t := served_s(r)) is not None and a <= t <= b
    ]
    return run.model_copy(update={"summary": Summary.model_validate(chosen),
                                  "requests": requests})


def served_s(r: Request) -> float | None:
    """When a stored request was served, on the run clock, as the steady-state window reads
    it (analysis/summary/steady_state.py): its first token, else its intended start; None
    where the record holds neither (an importer's without a schedule)."""
    if r.token_times_s:
        return float(r.token_times_s[0])
    if r.intended_start_s is None:
        return None
    if r.ttft_ms is None:
        return float(r.intended_start_s)
    return float(r.intended_start_s) + float(r.ttft_ms) / 1000.0
