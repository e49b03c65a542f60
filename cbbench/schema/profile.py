"""`cbbench calibrate`'s device profile (analysis/calibration.py): the rates the simulator
reads (engine/sim/device_profile.py checks them) and the fit's story beside them. The fields
the calibrate table reads are typed; the rest pass through."""

from __future__ import annotations

from cbbench.schema.base import Number, Record


class Confounder(Record):
    """The parameter a rate is not told apart from, and how strongly."""

    param: str
    posterior_correlation: Number | None = None


class FitParam(Record):
    """One fitted rate: the value the simulator uses, its status and relative standard error,
    and its median share of an iteration's time."""

    status: str
    used: Number | None = None
    value: Number | None = None
    rse: Number | None = None
    median_share_of_time: Number
    confounded_with: Confounder | None = None
    note: str | None = None


class ResidualStats(Record):
    """The fit's relative errors of one iteration class (analysis/comparison/sim_error.py)."""

    n: int
    median: Number | None = None
    p90: Number | None = None
    bias: Number | None = None


class CalibrationProfile(Record):
    kind: str | None = None
    version: int | None = None
    device: str
    device_name: str | None = None
    dtype: str
    models: list[str]
    num_iterations: int
    params: dict[str, FitParam]
    residuals: dict[str, ResidualStats]
    determined: str | None = None  # which rates the data determined, in words
    warnings: list[str] | None = None
