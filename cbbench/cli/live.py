"""The live view of `cbbench run` (issue 27, Build 6): one compact rich panel, redrawn about
twice a second from the run's LiveBoard (cbbench/targets/live.py), on a terminal only.

rich's Live redraws on its own thread at REFRESH_PER_S and asks for the panel each time
(get_renderable), so the load generator never waits on the terminal: the counters are read
there, not pushed. The panel is transient (erased when the run ends; the summary table follows)
and replaces the progress bar `run` showed before. Off with --quiet, when stdout is not a
terminal (a pipe, a file, CI logs) and when the result JSON itself goes to stdout.
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, cast

from cbbench.targets.live import LiveBoard, LiveSnapshot

if TYPE_CHECKING:
    from rich.live import Live

REFRESH_PER_S = 2.0
LABEL_WIDTH = 10  # the row labels' column


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} ms"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def panel_lines(s: LiveSnapshot) -> list[tuple[str, str]]:
    """The panel's rows as (label, text): what the view shows, testable without a terminal."""
    planned = f" / {s.planned_s:,.1f} s planned" if s.planned_s is not None else ""
    target = f" (target {s.target_rate:g} req/s)" if s.target_rate is not None else ""
    achieved = "-" if s.achieved_rate is None else f"{s.achieved_rate:,.1f} req/s"
    tok = "-" if s.output_tok_s is None else f"{s.output_tok_s:,.0f} tok/s"
    rows = [
        ("elapsed", f"{s.elapsed_s:,.1f} s{planned}"),
        ("requests", f"sent {s.sent} of {s.total}   in flight {s.in_flight}   done {s.done}"
                     f"   failed {s.failed}"),
        ("rate", f"{achieved} achieved{target}   send lag p50 {_ms(s.send_lag_p50_ms)}, "
                 f"max {_ms(s.send_lag_max_ms)}"),
        ("latency", f"TTFT p50 {_ms(s.ttft_p50_ms)}   TPOT p50 {_ms(s.tpot_p50_ms)}   "
                    f"output {tok}"),
    ]
    if s.running is not None:
        rows.append(("engine", f"running {s.running}   token budget {_pct(s.token_budget_use)}"
                               f"   KV {_pct(s.kv_use)}"))
    return rows


class TerminalFile:
    """The terminal the panel draws on; once a write fails (the pty closed: EIO), the panel
    is gone and every later write is dropped, so a closed terminal costs the view, never the
    run (it ended in a rich I/O-error traceback with no result)."""

    def __init__(self, file) -> None:
        self._file = file
        self.closed_terminal = False

    def write(self, text: str) -> int:
        if not self.closed_terminal:
            try:
                return self._file.write(text)
            except (OSError, ValueError):
                self.closed_terminal = True
        return len(text)

    def flush(self) -> None:
        if not self.closed_terminal:
            try:
                self._file.flush()
            except (OSError, ValueError):
                self.closed_terminal = True

    def isatty(self) -> bool:
        return not self.closed_terminal and self._file.isatty()

    def fileno(self) -> int:
        return self._file.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._file, "encoding", "utf-8")


class LiveView:
    """``with LiveView(enabled) as board:`` -- hand ``board`` to execute_run; None when the
    view is off, so an undrawn run feeds no board at all (its hot path exactly as before)."""

    def __init__(self, enabled: bool, console=None):
        """``console``: draw there instead (a benchmark measuring the view's cost)."""
        self.board = LiveBoard()
        self.console = console
        self.enabled = console is not None or (enabled and sys.stdout.isatty())
        self._live: Live | None = None

    def _panel(self):
        # One Text, not a Table grid: a quarter of the CPU per redraw
        # (results/live_view_cost.md), and rich holds the GIL while it renders.
        from rich.panel import Panel
        from rich.text import Text

        text = Text()
        for i, (label, line) in enumerate(panel_lines(self.board.snapshot())):
            text.append(("\n" if i else "") + f"{label:<{LABEL_WIDTH}}", style="bold")
            text.append(line)
        return Panel(text, title="cbbench run", expand=False)

    def __enter__(self) -> LiveBoard | None:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            # rich asks IO[str] of its file but calls only what TerminalFile has (write,
            # flush, isatty, fileno, encoding).
            terminal = cast(IO[str], TerminalFile(sys.stdout))
            live = self._live = Live(
                get_renderable=self._panel, refresh_per_second=REFRESH_PER_S, transient=True,
                console=self.console or Console(file=terminal),
                redirect_stdout=False,
                redirect_stderr=False,
            )
            live.start()
            return self.board
        return None

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
