"""capacity.json: the answer of a capacity search and every probe it ran."""

from __future__ import annotations

from typing import Any, Literal

from cbbench.schema.base import Number, Record
from cbbench.schema.sweep import AttainmentSLO, Point, Sizing

CAPACITY_KIND = "cbbench-capacity"
CAPACITY_SCHEMA_VERSION = 1


class Probe(Point):
    index: int
    phase: str
    passed: bool
    meets_slo: bool
    attainment: Number | None = None
    interrupted: bool | None = None
    too_short: bool | None = None  # met the SLO; too short to show a steady state
    seed: int | None = None  # its run's --seed


class CapacityFile(Record):
    kind: Literal["cbbench-capacity"]
    schema_version: Literal[1]
    slo: AttainmentSLO
    precision: Number
    sizing: Sizing
    points_prep: dict[str, Any] | None = None
    status: str
    capacity: Number | None = None
    bracket: list[Number | None]
    margin: Number | None = None
    saturation_rate: Number | None = None
    saturation_probe: Point | None = None
    config: dict[str, Any] | None = None
    command: str | None = None
    probes: list[Probe]
    interrupted: bool | None = None
