"""Which window of a result `gate` and `compare` read: the whole run (``all``) or its steady
state (``steady``, summary.steady_state: ramp-up and drain left out).

``select_window`` returns the result as that window sees it: for ``steady``, a copy whose
summary holds the steady-state figures only (completed, failed, throughputs, latency
distributions). Run-wide facts with no windowed value (engine.*, goodput, send lag) are left
out rather than mixed in: a gate threshold on one of them is refused with ``--window steady``.
"""

from __future__ import annotations

from cbbench.errors import UsageError
from cbbench.schema import RunResult, as_run
from cbbench.schema.run import Summary

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
    is the steady-state figures (a dict is read as its model first)."""
    if window == "all":
        return result
    run = as_run(result, path)
    ss = run.summary.steady_state
    if ss is None:
        raise UsageError(
            f"{path} has no steady-state summary (made before cbbench reported one): "
            "use --window all"
        )
    if not ss.window_s:
        raise UsageError(f"{path} has no steady-state window ({ss.note or 'none found'})")
    chosen = ss.model_dump(mode="json", exclude_unset=True,
                           include={*WINDOWED_KEYS, *WINDOW_FACTS})
    return run.model_copy(update={"summary": Summary.model_validate(chosen)})
