"""The percentiles a summary holds: `--percentiles 50,90,99,99.9` on run, compare, gate and
report (AIPerf's and GuideLLM's option). One key per percentile, one spelling everywhere:
``p50``, ``p99``, ``p99.9`` (:func:`percentile_key`), so a reader that asks for p99.9 finds
what a run stored under p99.9. The default is the set cbbench always wrote (p50/p90/p95/p99).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING

from cbbench.errors import UsageError

if TYPE_CHECKING:
    # The result models, imported where a result is filled in: parse_percentiles runs when
    # an option group is checked (options/output.py), before any result is read or built.
    from cbbench.schema.run import Request, RunResult

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)  # ints: keyed p50 by any writer
MIN_PERCENTILE, MAX_PERCENTILE = 0.0, 100.0
MAX_PERCENTILES = 32  # more columns than any table can show
_KEY = re.compile(r"^p(\d+(\.\d+)?)$")


def percentile_key(p: float) -> str:
    """50 -> 'p50', 99.9 -> 'p99.9', 99.0 -> 'p99', 0.00001 -> 'p0.00001': the shortest
    decimal that reads back as the same float, never in exponent form. (%g kept 6 digits:
    99.99999999 became p100, beside 100's own key, and 0.00001 p1e-05, which no reader
    could ask for.)"""
    text = format(Decimal(repr(float(p))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"p{text}"


def is_percentile_key(text: str) -> bool:
    return _KEY.match(text) is not None


def parse_percentiles(text: str | None) -> tuple[float, ...]:
    """'50,90,99,99.9' -> (50.0, 90.0, 99.0, 99.9), ascending and without repeats; None or ''
    -> the default. A bad entry is one UsageError line naming it."""
    if text is None:
        return DEFAULT_PERCENTILES
    parts = [t.strip().removeprefix("p") for t in text.split(",")]
    if not text.strip() or any(not t for t in parts):
        raise UsageError(f"--percentiles {text!r}: give numbers in [0, 100] separated by commas, "
                         "e.g. 50,90,99,99.9")
    out: set[float] = set()
    for t in parts:
        try:
            p = float(t)
        except ValueError:
            raise UsageError(f"--percentiles: {t!r} is not a number (e.g. 50,90,99,99.9)") from None
        if not math.isfinite(p) or not MIN_PERCENTILE <= p <= MAX_PERCENTILE:
            raise UsageError(f"--percentiles: {t} is outside [0, 100]")
        out.add(int(p) if p.is_integer() else p)  # 50, not 50.0: every writer keys it p50
    if len(out) > MAX_PERCENTILES:
        raise UsageError(f"--percentiles: at most {MAX_PERCENTILES} percentiles, got {len(out)}")
    return tuple(sorted(out))


def keys(percentiles: Iterable[float]) -> tuple[str, ...]:
    return tuple(percentile_key(p) for p in percentiles)


def stats_shown(percentiles: Sequence[float] | None, default: Sequence[str]) -> tuple[str, ...]:
    """The statistic columns a table shows: 'mean' and the asked percentiles, or the table's
    own default when none were asked."""
    if percentiles is None:
        return tuple(default)
    return ("mean", *keys(percentiles))


def split_metric_path(path: str) -> list[str]:
    """A dotted summary path into its parts, a percentile's decimal point kept:
    'ttft_ms.p99.9' -> ['ttft_ms', 'p99.9']; 'slices.worst.ttft_ms.p99' unchanged otherwise."""
    parts: list[str] = []
    for part in path.split("."):
        if parts and part.isdigit() and is_percentile_key(parts[-1]) and "." not in parts[-1]:
            parts[-1] = f"{parts[-1]}.{part}"
        else:
            parts.append(part)
    return parts


# The distributions that can be recomputed from the result's request records, and each
# request's figure (ITL: the per-token list --save-detailed keeps).
REQUEST_VALUES: dict[str, Callable[[Request], Sequence[float]]] = {
    "ttft_ms": lambda r: _number(r.ttft_ms),
    "tpot_ms": lambda r: _number(r.tpot_ms),
    "e2el_ms": lambda r: _number(r.e2el_ms),
    "itl_ms": lambda r: r.itl_ms or [],
}


def percentile_of(metric: str) -> float | None:
    """The percentile a metric path reads from a distribution that can be recomputed from the
    requests ('ttft_ms.p99.9' -> 99.9, 'itl_ms.p50' -> 50), else None ('ttft_ms.mean',
    'slices.worst.ttft_ms.p99', 'send_lag_ms.p99')."""
    parts = split_metric_path(metric)
    if len(parts) != 2 or parts[0] not in REQUEST_VALUES or not is_percentile_key(parts[1]):
        return None
    p = float(parts[1][1:])
    return int(p) if p.is_integer() else p  # 99, not 99.0: keyed p99 as parse_percentiles has it


def _number(v: object) -> list[float]:
    return [v] if isinstance(v, (int, float)) else []


def with_percentiles_filled(result: RunResult, percentiles: Sequence[float],
                            where: object) -> RunResult:
    """``result`` with every asked percentile in its latency distributions: a key the run did
    not store (it ran with other --percentiles) is computed from its per-request figures
    (TTFT, TPOT, E2EL; ITL from the per-token lists --save-detailed keeps), with numpy's
    linear interpolation as the run would have. Left missing where the figures are not there
    (a --summary-only file). A new model (``where`` names it in an error), or ``result`` itself
    where there was nothing to fill; the input is not changed."""
    import numpy as np

    from cbbench.schema import parse_run, to_dict
    from cbbench.schema.run import Distribution

    summary = result.summary
    ok = [r for r in result.requests or [] if r.error is None and not r.cancelled]
    filled: dict[str, dict] = {}
    for name, figures in REQUEST_VALUES.items():
        dist = getattr(summary, name)
        if not isinstance(dist, Distribution):
            continue
        stored = dist.model_extra or {}  # the pNN keys: extra fields of a distribution
        missing = [p for p in percentiles if percentile_key(p) not in stored]
        if not missing:
            continue
        values = [v for r in ok for v in figures(r)]
        if not values:
            continue
        got = np.percentile(np.asarray(values, dtype=np.float64), missing)
        filled[name] = {**to_dict(dist), **{percentile_key(p): float(v)
                                            for p, v in zip(missing, got)}}
    if not filled:  # every key stored, or none computable: no copy of a large result
        return result
    return parse_run({**to_dict(result), "summary": {**to_dict(summary), **filled}}, where)
