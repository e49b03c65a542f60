"""Attainment SLOs (DistServe's goodput rule), as `sweep` and `capacity` take them.

A request *meets* the SLO when every limit holds for it: its own TTFT <= the ttft limit, its
own TPOT <= the tpot limit, its own E2EL <= the e2el limit (a request with one output token
has no TPOT and passes that limit). TTFT and E2EL count from the intended start, except for a
request that waited for a --max-concurrency slot: from its send (summary.slo_basis "send"),
as vLLM's --goodput, AIPerf and GuideLLM time a closed loop. A failed request never meets it. A run's *attainment* is
the fraction of its requests that meet it, over the requests that were not cancelled
(``attainment``: completed and failed; a --cancel-rate cancel is the client's doing, counted
apart as everywhere else, as AIPerf's good_request_fraction leaves cancels out); the run
*meets* the SLO when its attainment is >= the attainment target.

Syntax: ``KEY[_pNN]=MS`` joined by commas, KEY in ttft, tpot, e2el. The ``_pNN`` suffix names
the attainment: ``ttft_p99=1000,tpot_p99=50`` means ">= 99% of requests meet both limits".
The rule for the attainment target, in order:
  1. ``--attainment F`` when given (the suffixes are then only labels);
  2. else the percentile the suffixes name; they must all name the same one (ttft_p99 with
     tpot_p90 is ambiguous and rejected); keys without a suffix follow it;
  3. else (no suffix anywhere) 0.90, DistServe's usual target.
With one key, ">= 99% of requests have TTFT <= L" is the same as "TTFT p99 <= L"; with several
keys the joint rule is stricter than each percentile alone, since one request must meet all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cbbench.analysis.summary import from_send
from cbbench.errors import UsageError
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Request, RunResult

SLO_KEYS = ("ttft", "tpot", "e2el")
# summary.slo_basis under a client concurrency cap: TTFT and E2EL were judged from the send.
SLO_BASIS_SEND = "send"
DEFAULT_ATTAINMENT = 0.90
# KEY, then an optional _pNN (or _pNN.N) suffix.
_KEY_RE = re.compile(r"^(ttft|tpot|e2el)(?:_p(\d+(?:\.\d+)?))?$")
_EXAMPLE = "e.g. --slo ttft_p99=1000,tpot_p99=50"
# Each limit's figure of a request (ms).
REQUEST_MS: dict[str, Callable[[Request], float | None]] = {
    "ttft": lambda r: r.ttft_ms, "tpot": lambda r: r.tpot_ms, "e2el": lambda r: r.e2el_ms}
# A request that waited for a --max-concurrency slot (it has slot_wait_ms) is judged from its
# send, as the run's own summary.goodput (metrics.py meets_slo): the slot wait is the closed
# loop's, not the server's latency.
FROM_SEND_MS: dict[str, Callable[[Request], float | None]] = {
    "ttft": from_send.ttft_from_send_ms, "tpot": lambda r: r.tpot_ms,
    "e2el": from_send.e2el_from_send_ms}


@dataclass(frozen=True)
class AttainmentSLO:
    limits_ms: dict[str, float] = field(default_factory=dict)  # {"ttft": 1000.0, ...}
    attainment: float = DEFAULT_ATTAINMENT  # fraction of requests that must meet every limit
    source: str = "default"  # where the attainment came from: --attainment | suffix | default

    def describe(self) -> str:
        limits = " and ".join(f"{k} <= {v:g} ms" for k, v in self.limits_ms.items())
        return f"{limits} for >= {self.attainment:.4g} of requests"

    def to_dict(self) -> dict:
        return {"limits_ms": dict(self.limits_ms), "attainment": self.attainment,
                "attainment_source": self.source}


def _percentile(text: str, part: str) -> float:
    p = float(text)
    if not 0 < p <= 100:
        raise UsageError(f"invalid SLO {part!r}: the percentile must be in (0, 100]")
    return p


def parse_attainment_slo(text: str | None, attainment: float | None = None) -> AttainmentSLO | None:
    """'ttft_p99=1000,tpot_p99=50' -> AttainmentSLO({'ttft': 1000, 'tpot': 50}, 0.99)."""
    if attainment is not None and not (0 < attainment <= 1 and math.isfinite(attainment)):
        raise UsageError(f"--attainment must be in (0, 1], got {attainment}")
    if not text or not text.strip():
        if attainment is not None:
            raise UsageError("--attainment needs --slo")
        return None
    limits: dict[str, float] = {}
    percentiles: dict[str, float] = {}
    for part in text.split(","):
        key_text, sep, value = part.partition("=")
        m = _KEY_RE.match(key_text.strip())
        if not sep or m is None:
            raise UsageError(
                f"invalid SLO {part.strip()!r}: use KEY=MS or KEY_pNN=MS with KEY in "
                f"{', '.join(SLO_KEYS)}, {_EXAMPLE}"
            )
        key, pct = m.group(1), m.group(2)
        if key in limits:
            raise UsageError(f"invalid SLO: {key} is given twice")
        try:
            ms = float(value)
        except ValueError:
            raise UsageError(f"invalid SLO value in {part.strip()!r}: milliseconds expected") from None
        if not (ms > 0 and math.isfinite(ms)):
            raise UsageError(f"invalid SLO value in {part.strip()!r}: must be > 0 (finite ms)")
        limits[key] = ms
        if pct is not None:
            percentiles[key] = _percentile(pct, part.strip())
    if attainment is not None:
        return AttainmentSLO(limits, attainment, "--attainment")
    named = set(percentiles.values())
    if len(named) > 1:
        listed = ", ".join(f"{k}_p{v:g}" for k, v in percentiles.items())
        raise UsageError(
            f"the SLO names different percentiles ({listed}); a request must meet every limit, "
            "so one attainment applies to all: use one suffix, or give --attainment"
        )
    if named:
        return AttainmentSLO(limits, named.pop() / 100.0, "suffix")
    return AttainmentSLO(limits, DEFAULT_ATTAINMENT, "default")


def attainment(meets: Sequence[bool] | np.ndarray, cancelled: Sequence[bool] | np.ndarray
               ) -> float:
    """The SLO attainment of a run: its requests that met every limit (``meets``, per request)
    over its requests that were not cancelled (completed and failed: a failed request is a
    miss; a cancelled one is neither); 0.0 with none. The one rule: the summary's
    slo_attainment (which gate reads) and run_attainment (sweep's and capacity's) both call it."""
    judged = int(np.count_nonzero(~np.asarray(cancelled, dtype=bool)))
    return int(np.count_nonzero(meets)) / judged if judged else 0.0


def request_meets(req: Request | Mapping[str, Any], limits_ms: dict[str, float]) -> bool:
    """One request of a result file (its `requests` entry: the model, or a hand-made dict read
    through the model's names) against every limit. A failed or cancelled request never
    meets it."""
    r = req if isinstance(req, Request) else Request.model_construct(**req)
    if r.error is not None or r.cancelled or r.ttft_ms is None:
        return False
    figures = FROM_SEND_MS if (r.model_extra or {}).get("slot_wait_ms") is not None else REQUEST_MS
    for key, limit in limits_ms.items():
        v = figures[key](r)
        if v is not None and v > limit:
            return False
    return True


def run_attainment(result: RunResult | Mapping[str, Any], limits_ms: dict[str, float]) -> float:
    """A result file's attainment of ``limits_ms`` from its requests (``attainment``: over
    those not cancelled, as the run's own summary.slo_attainment)."""
    reqs = as_run(result).requests or []
    return attainment([request_meets(r, limits_ms) for r in reqs],
                      [bool(r.cancelled) for r in reqs])
