"""`run --server-log LOG`: the server's request log (`cbbench serve --request-log`) read at
the end of a run, for the TTFT breakdown (ttft_breakdown.py). The server writes a request's
line just after its last event went out, from a writer thread, so the last lines can land a
moment after the client read [DONE]: the log is read again, briefly, until every completed
request's id is in it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.audit import read_server_log
from cbbench.errors import UsageError

LOG_SETTLE_S = 2.0  # the longest wait for the server's last lines
LOG_POLL_S = 0.05


def read_log_for(path: str, records: Sequence[RequestRecord],
                 settle_s: float = LOG_SETTLE_S) -> dict[str, dict]:
    """The log's lines by id, once it holds every completed request's id (or ``settle_s``
    passed: the requests missing then are split from the response alone, or not at all).
    UsageError when it holds none of them: another run's log joined nothing, silently."""
    wanted = {r.server_request_id for r in records if r.ok and r.server_request_id}
    deadline = time.monotonic() + settle_s
    while True:
        log = read_server_log(Path(path))
        if wanted <= log.keys() or time.monotonic() >= deadline:
            break
        time.sleep(LOG_POLL_S)
    if wanted and not wanted & log.keys():
        raise UsageError(f"none of the run's {len(wanted)} completed requests is in {path} "
                         f"({len(log)} lines): is it this server's log of this run?")
    return log
