"""summary.intervals: each headline figure of a simulated run on a calibrated device, with the
range the profile's residual spread gives it (engine/sim_bounds.py: the run simulated again
at the fast and the slow end of the band).

{"ttft_ms": {"p50": {"low", "high", "level"}, "p99": ...}, "tpot_ms": {...},
 "output_throughput": {"low", "high", "level"}}; ``level`` is the band's nominal coverage
(0.9), not a measured one: results/sim_accuracy/intervals.md reports what it covered.
"""

from __future__ import annotations

from collections.abc import Sequence

HEADLINE = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"), ("tpot_ms", "p99"),
            ("output_throughput", None))


def _get(summary: dict, key: str, stat: str | None) -> float | None:
    v = summary.get(key)
    return v.get(stat) if stat is not None and isinstance(v, dict) else v


def intervals(point: dict, bounds: Sequence[dict], level: float) -> dict:
    """Each headline figure's [low, high]: the range over the point run and the bound runs."""
    out: dict = {}
    for key, stat in HEADLINE:
        got = [_get(s, key, stat) for s in (point, *bounds)]
        values = [v for v in got if v is not None]
        if len(values) < len(got):
            continue
        band = {"low": float(min(values)), "high": float(max(values)), "level": level}
        if stat is None:
            out[key] = band
        else:
            out.setdefault(key, {})[stat] = band
    return out
