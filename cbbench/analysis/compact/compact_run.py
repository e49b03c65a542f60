"""A simulated run held as columns: what a million-request run keeps in memory.

An in-process simulated run gives each request one token per step of its replica, from the
step that completes its prompt to the step of its last token, with no gap (no preemption, no
skipped decode: the array simulator, engine/sim/array_sim.py, runs only where that holds). So
a request's token times are a slice of its replica's step end times, and the whole run is:

- ``CompactRequests``: one row per request that reached the engine (numpy columns), in the
  order ``targets/engine.run_engine`` lists its records (arrival order);
- ``replica_end_s``: per replica, the end time of each of its steps, in step order;
- ``StepTable``: the iteration records as columns, in the order the engine lists them.

Request ``i``'s k-th token came at ``replica_end_s[replica[i]][first_step[i] + k]`` for
``k < output_tokens[i]``. About 60 bytes per request and 100 per iteration, against ~2 KB per
request for token-time lists and iteration dicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cbbench.engine.core.iteration import FIELD_NAMES

if TYPE_CHECKING:
    from cbbench.analysis.summary.columns import RequestColumns
    from cbbench.engine.build_common import EngineInfo


@dataclass
class CompactRequests:
    id: np.ndarray  # int64
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64: tokens produced
    max_tokens: np.ndarray  # int64: the output length asked for
    arrival_s: np.ndarray  # float64: the intended start (= the send: in-process)
    first_scheduled_s: np.ndarray  # float64: admission; NaN: never scheduled
    replica: np.ndarray  # int64: the replica that served it (0 without data parallelism)
    first_step: np.ndarray  # int64: its first token's step in replica_end_s[replica]; -1: none
    priority: np.ndarray  # int64
    # Rows that did not complete: row -> (error, error_type), as _outcome() names them.
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.id)

    def token_times(self, i: int, replica_end_s: list[np.ndarray]) -> np.ndarray:
        """Request ``i``'s token times (a view, no copy)."""
        s = int(self.first_step[i])
        if s < 0:
            return np.zeros(0)
        return replica_end_s[int(self.replica[i])][s : s + int(self.output_tokens[i])]


@dataclass
class StepTable:
    """Iteration records as columns keyed by IterationRecord's field names (``replica``
    absent without data parallelism, ``pool`` always absent). A column that holds one value
    throughout may be a zero-stride view (np.broadcast_to): it costs nothing."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["index"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def dicts(self) -> Iterator[dict]:
        """Each record as IterationRecord.to_dict() gives it (Python ints and floats)."""
        names = [n for n in FIELD_NAMES if n in self.columns]
        lists = [self.columns[n].tolist() for n in names]
        dur, nbytes = self.columns["duration_s"].tolist(), self.columns["bytes_moved"].tolist()
        for k, row in enumerate(zip(*lists)):
            d = dict(zip(names, row))
            d["achieved_bw_gbps"] = (nbytes[k] / dur[k] if dur[k] > 0 else 0.0) / 1e9
            yield d


@dataclass
class CompactRun:
    requests: CompactRequests
    replica_end_s: list[np.ndarray]
    steps: StepTable
    duration_s: float
    interrupted: bool
    resolved: EngineInfo
    not_sent: int = 0
    kv_blocks_in_use_at_end: int = 0
    # compact_summary.compact_columns: per-request values, made once for the summary and rows.
    view: RequestColumns | None = None
