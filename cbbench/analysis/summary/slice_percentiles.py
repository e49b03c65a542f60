"""A percentile of ``summary.slices`` that a result did not store (its run had other
--percentiles), computed from its per-request figures, as ``with_percentiles_filled`` does for
the whole run's distributions: ``gate --max-regression slices.worst.ttft_ms.p99=10%`` on a run
made with ``--percentiles 50,99.9``.

A slice's latencies are those of the completed requests that ended in it (slices.py): a
request's last token, on the run clock, placed by the slices' own edges (a time on an edge is
the later slice's). Each stored request's end is its last token time (--save-detailed), else
its intended start plus its E2EL. The figures are computed only where that placement gives
every slice the completed count it stored: otherwise the requests are not the ones its slices
counted (a windowed or edited file), and nothing is filled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from cbbench.analysis.summary.percentiles import (
    REQUEST_VALUES,
    is_percentile_key,
    percentile_key,
    split_metric_path,
)

if TYPE_CHECKING:
    from cbbench.schema.run import Request, RunResult

MS = 1000.0
WORST_SLICE = "slices.worst."  # analysis/comparison/gate.py's prefix of a per-slice metric


def slice_percentile_of(metric: str) -> tuple[str, float] | None:
    """'slices.worst.ttft_ms.p99.9' -> ('ttft_ms', 99.9); None for any other metric."""
    if not metric.startswith(WORST_SLICE):
        return None
    parts = split_metric_path(metric[len(WORST_SLICE):])
    if len(parts) != 2 or parts[0] not in REQUEST_VALUES or not is_percentile_key(parts[1]):
        return None
    p = float(parts[1][1:])
    return parts[0], int(p) if p.is_integer() else p


def _end_s(r: Request) -> float | None:
    if r.token_times_s:
        return float(r.token_times_s[-1])
    if r.intended_start_s is None or r.e2el_ms is None:
        return None
    return float(r.intended_start_s) + float(r.e2el_ms) / MS


def slice_members(result: RunResult) -> list[list[Request]] | None:
    """The completed requests of each slice, in request order; None where the result keeps no
    requests or they do not place as its slices counted them."""
    slices = result.summary.slices or []
    ok = [r for r in result.requests or [] if r.error is None and not r.cancelled]
    if not slices or not ok:
        return None
    ends = [_end_s(r) for r in ok]
    if any(e is None for e in ends):
        return None
    bounds = np.array([s.start_s for s in slices[1:]], dtype=np.float64)
    which = np.searchsorted(bounds, np.array(ends, dtype=np.float64), side="right")
    members: list[list[Request]] = [[] for _ in slices]
    for r, k in zip(ok, which.tolist()):
        members[k].append(r)
    if any(len(m) != s.completed for m, s in zip(members, slices)):
        return None
    return members


def missing_in_slices(result: RunResult, name: str, p: float) -> bool:
    """Whether a slice with values for ``name`` lacks its pNN key."""
    key = percentile_key(p)
    for s in result.summary.slices or []:
        dist = getattr(s, name, None)
        if dist is not None and dist.count and key not in (dist.model_extra or {}):
            return True
    return False


def with_slice_percentiles_filled(result: RunResult, wanted: Sequence[tuple[str, float]],
                                  where: object) -> RunResult:
    """``result`` with each (distribution, percentile) of ``wanted`` in every slice that has
    values for it, computed from the slice's requests (numpy's linear interpolation, as the
    run would have) where it did not store it; ``result`` itself where nothing was missing or
    nothing can be computed (see the module doc)."""
    from cbbench.schema import parse_run, to_dict

    missing = [(n, p) for n, p in wanted if missing_in_slices(result, n, p)]
    members = slice_members(result) if missing else None
    if members is None:
        return result
    slices = []
    for s, reqs in zip(result.summary.slices or [], members):
        row = to_dict(s)
        for name, p in missing:
            dist = row.get(name)
            values = [v for r in reqs for v in REQUEST_VALUES[name](r)]
            # The same values the run took, or none: a count that differs is not its slice.
            if isinstance(dist, dict) and dist.get("count") and len(values) == dist["count"]:
                dist[percentile_key(p)] = float(np.percentile(np.asarray(values, np.float64), p))
        slices.append(row)
    return parse_run({**to_dict(result), "summary": {**to_dict(result.summary),
                                                     "slices": slices}}, where)
