"""sweep.json: the rates, each point's figures, the shared config."""

from __future__ import annotations

from typing import Any, Literal

from cbbench.schema.base import Number, Record

SWEEP_KIND = "cbbench-sweep"
SWEEP_SCHEMA_VERSION = 1


class Sizing(Record):
    num_requests: int
    min_duration_s: Number
    max_requests: int


class AttainmentSLO(Record):
    limits_ms: dict[str, Number]
    attainment: Number
    attainment_source: str | None = None


class Point(Record):
    """One probe's figures (bench/probe.py's ProbePoint); rate inf is the text "inf"."""

    rate: Number | Literal["inf"]
    num_requests: int
    completed: int
    failed: int
    achieved_request_rate: Number | None = None
    output_throughput: Number | None = None
    ttft_p50_ms: Number | None = None
    ttft_p99_ms: Number | None = None
    tpot_p50_ms: Number | None = None
    tpot_p99_ms: Number | None = None
    e2el_p50_ms: Number | None = None
    e2el_p99_ms: Number | None = None
    itl_p99_ms: Number | None = None
    goodput: Number | None = None
    slo_attainment: Number | None = None
    steady: bool | None = None
    steady_reason: str | None = None
    steady_short: str | None = None
    steady_detail: dict[str, Any] | None = None
    file: str | None = None


class SweepPoint(Point):
    """A point of sweep.json: the probe's figures and what the sweep adds."""

    seed: int | None = None
    prefix_cache_reset: list[dict[str, Any]] | None = None
    warmup_requests: dict[str, Any] | None = None
    telemetry: dict[str, Any] | None = None  # the point's GPU telemetry, steady-state means
    interrupted: bool | None = None


class SweepFile(Record):
    kind: Literal["cbbench-sweep"]
    schema_version: Literal[1]
    started_at: str | None = None
    rates: list[str] | Literal["auto"] | None = None
    sizing: Sizing | None = None
    points_prep: dict[str, Any] | None = None
    slo: AttainmentSLO | None = None
    saturation_rate: Number | None = None
    config: dict[str, Any] | None = None
    command: str | None = None
    points: list[SweepPoint]
    interrupted: bool | None = None
