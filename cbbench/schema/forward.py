"""`cbbench forward`'s file: the step time of the bundled engine at exact shapes, each row with
its roofline floor and per-operator table (cbbench/bench/forward.py)."""

from __future__ import annotations

from typing import Any, Literal

from cbbench.schema.base import Number, Record

FORWARD_KIND = "cbbench-forward"
FORWARD_SCHEMA_VERSION = 1


class StepStats(Record):
    mean: Number
    std: Number | None = None  # sample standard deviation; null for one step (absent: older)
    p50: Number
    min: Number
    max: Number


class OperatorRow(Record):
    """One operator of a step: its FLOPs and bytes, its floor, the roof that binds it."""

    name: str
    flops: Number
    bytes: int
    floor_ms: Number
    bound: Literal["memory", "compute"]


class ForwardRow(Record):
    phase: Literal["decode", "prefill"]
    batch_size: int
    tokens: int
    context: int
    graphs: bool
    graph_replayed: bool
    step_ms: StepStats
    tokens_per_s: Number
    bytes: int
    flops: Number
    floor_ms: Number
    floor_bytes_ms: Number
    floor_flops_ms: Number
    roofline_fraction: Number
    mbu: Number | None  # null on a CPU without given peaks: a CPU's time over a GPU's peak
    mfu: Number | None
    operators: list[OperatorRow]


class Device(Record):
    type: Literal["cpu", "cuda"]
    is_cpu: bool
    name: str


class Peaks(Record):
    hbm_bandwidth: Number
    flops: Number
    source: str
    utilization: bool


class ForwardError(Record):
    """A shape (or the runner) that failed: where, and the error as raised (the rest passes
    through: its graphs setting, its rows)."""

    stage: str | None = None
    error: str


class ForwardResult(Record):
    kind: Literal["cbbench-forward"]
    schema_version: Literal[1]
    started_at: str | None = None
    device: Device
    model: str
    dtype: str
    attention_backend: str
    spec: dict[str, Any]
    peaks: Peaks
    gpu_spec: dict[str, Any] | None = None
    rows: list[ForwardRow]
    errors: list[ForwardError]
    notes: list[str]
    interrupted: bool | None = None  # Ctrl-C: the rows measured before it (absent: older)
