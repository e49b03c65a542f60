"""What every target's run hands the runner, whichever of the three kinds it is: an engine run
(targets/engine.py's EngineRun: request and iteration records), an endpoint run
(targets/http.py's HttpRun: request records only) or a column run of the array simulator
(analysis/compact/compact_run.py's CompactRun). The runner reads what they share through
``TargetRun`` and what only some have through the functions below, never by asking an object
for an attribute it may lack."""

from __future__ import annotations

from typing import Protocol

from cbbench.targets.engine import EngineRun


class TargetRun(Protocol):
    duration_s: float
    interrupted: bool
    not_sent: int  # requests the run never sent (their arrival came after a stop)


def iterations_of(run: TargetRun) -> list[dict]:
    """The run's per-iteration rows: an engine run's; none for an endpoint (the server's steps
    are not the client's to see). A column run keeps its steps as columns (its own rows)."""
    return run.iterations if isinstance(run, EngineRun) else []
