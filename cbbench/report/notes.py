"""What a report's plot could not show, said on the page beside it: one set of notes for the
static page (cli/report.py) and report.html (report/interactive.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cbbench.report import plots
from cbbench.schema.coerce import as_run


def section_notes(key: str, results: Sequence,
                  itl_drawn: Callable[[Any], bool] | None = None) -> list[str]:
    """What a plot could not show, said on the page rather than left for the reader to guess.
    ``itl_drawn``: whether a result's ITL line is drawn (default: from per-token times, as the
    static page draws it; report.html also draws it from the summary's ITL histogram)."""
    notes = []
    if key == "latency_cdfs":
        drawn = itl_drawn or (lambda result: plots.itl_values(result) is not None)
        # A --summary-only result keeps no requests at all: --save-detailed is not what it lacks.
        no_requests = [x for x in results if not as_run(x.result).requests]
        no_times = [x.label for x in results
                    if as_run(x.result).requests and not drawn(x.result)]
        if no_times:
            notes.append(
                f"No ITL line for {', '.join(no_times)}: the result has no per-token times "
                "(run with --save-detailed); its summary's ITL figures are in the table above."
            )
        if no_requests:
            lines = ("TTFT, TPOT or E2EL lines" if any(drawn(x.result) for x in no_requests)
                     else "latency lines")
            notes.append(
                f"No {lines} for {', '.join(x.label for x in no_requests)}: the result keeps no "
                "per-request records (a --summary-only run); its summary's figures are in the "
                "table above."
            )
    if key == "bandwidth":
        none = [x for x in results if plots.telemetry_bandwidth(x.result) is None]
        # The analytic line reads the engine's iterations: an endpoint or --summary-only result
        # has none, so "only the analytic line is drawn" would promise a line that is not there.
        analytic = [x.label for x in none if as_run(x.result).iterations]
        neither = [x.label for x in none if not as_run(x.result).iterations]
        if analytic:
            notes.append(
                f"No measured bandwidth for {', '.join(analytic)} (no GPU telemetry in the "
                "result; a simulated GPU has none): only the analytic line is drawn."
            )
        if neither:
            notes.append(
                f"No bandwidth line for {', '.join(neither)}: the result has neither GPU "
                "telemetry nor per-iteration records (an endpoint run without telemetry, or a "
                "--summary-only run)."
            )
    if key == "request_timeline":
        no_queue = [
            x.label for x in results
            if any("queue_ms" not in r.model_fields_set for r in as_run(x.result).requests or [])
        ]
        if no_queue:
            notes.append(
                f"{', '.join(no_queue)}: admission times are not known for every request, so "
                "their orange span covers queueing too."
            )
    return notes
