"""A sweep's or capacity search's point as code reads it: the figures one probe is summarized
by (a row of sweep.json's points and capacity.json's probes), and how a rate is written."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from cbbench.schema.base import to_dict
from cbbench.schema.sweep import SweepFile

MAX_POSITIONAL_LABEL = 16


def rate_label(rate: float) -> str:
    """'inf', '2', '2.5': for file names and tables."""
    if math.isinf(rate):
        return "inf"
    label = np.format_float_positional(rate, precision=6, unique=True, trim="-")
    # 1e308 written out is 309 digits: a file name too long to write once the point had run;
    # 1e-300 at six decimals is '0'.
    if len(label) > MAX_POSITIONAL_LABEL or float(label) == 0:
        return f"{rate:.6g}"
    return label



@dataclass
class ProbePoint:
    """The numbers one probe is summarized by, in sweep.json and capacity.json."""

    rate: float
    num_requests: int
    completed: int
    failed: int
    achieved_request_rate: float
    output_throughput: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2el_p50_ms: float | None
    e2el_p99_ms: float | None
    itl_p99_ms: float | None  # the stall a streaming user sees; TPOT averages it away
    goodput: float | None
    slo_attainment: float | None
    steady: bool | None
    steady_reason: str
    steady_short: str
    steady_detail: dict = field(default_factory=dict)
    file: str | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["rate"] = rate_label(self.rate) if math.isinf(self.rate) else self.rate
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ProbePoint:
        known = {f.name for f in fields(cls)}
        # A figure an older file lacks reads as missing, not as an error.
        kw: dict[str, Any] = {f.name: None for f in fields(cls) if f.name.endswith("_ms")}
        kw.update({k: v for k, v in d.items() if k in known})
        kw["rate"] = math.inf if d["rate"] == "inf" else float(d["rate"])
        return cls(**kw)


def points_of(sweep: SweepFile | dict) -> list[ProbePoint]:
    """sweep.json's points as ProbePoints (a dict: a reader not yet on the model)."""
    if isinstance(sweep, SweepFile):
        return [ProbePoint.from_dict(to_dict(p)) for p in sweep.points]
    return [ProbePoint.from_dict(d) for d in sweep.get("points", [])]
