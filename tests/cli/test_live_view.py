"""The live view (issue 27, Build 6): a panel on a terminal, nothing in a pipe or with --quiet,
and figures in it that are the run's own."""

from __future__ import annotations

import json
import os
import pty
import subprocess

import pytest
from helpers import CBBENCH

from cbbench.analysis.records import RequestRecord
from cbbench.cli.live import panel_lines
from cbbench.targets.live import LIVE_RELATIVE_ERROR, LiveBoard

RUN = [*CBBENCH, "run", "--engine", "sim", "--model",
       "llama-3.2-1b", "--gpu", "h200", "--workload", "sharegpt", "--num-requests", "60",
       "--request-rate", "20"]
PANEL_WORDS = ("in flight", "token budget", "TTFT p50", "KV")
ONLY_IN_PANEL = ("in flight", "achieved (target")  # the summary table has neither


def _under_pty(args: list[str]) -> tuple[int, str]:
    """Run with stdout on a pseudo-terminal (as a user's shell gives it); all it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    out = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=120), out.decode(errors="replace")


def test_panel_shows_under_a_terminal_and_not_in_a_pipe(tmp_path):
    rc, text = _under_pty([*RUN, "--output", str(tmp_path / "tty.json")])
    assert rc == 0, text
    assert "cbbench run" in text and all(w in text for w in PANEL_WORDS), text[-2000:]
    piped = subprocess.run([*RUN, "--output", str(tmp_path / "pipe.json")],
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "token budget" in piped.stdout  # the table is there ...
    assert not any(w in piped.stdout + piped.stderr for w in ONLY_IN_PANEL), piped.stdout
    rc, quiet = _under_pty([*RUN, "--quiet", "--output", str(tmp_path / "q.json")])
    assert rc == 0 and "TTFT" in quiet  # the table ...
    assert not any(w in quiet for w in ONLY_IN_PANEL)  # ... and no panel
    # The live view changed nothing the run measured (same seed, same simulated run).
    a, b = (json.loads((tmp_path / f).read_text())["summary"] for f in ("tty.json", "pipe.json"))
    assert a["ttft_ms"] == b["ttft_ms"] and a["completed"] == b["completed"]


def _record(i: int, start: float, send: float, times: list[float], ok: bool = True):
    rec = RequestRecord(id=i, prompt_tokens=10, output_tokens=len(times), intended_start_s=start,
                        send_s=send, token_times_s=list(times))
    if not ok:
        rec.error, rec.error_type = "HTTP 500", "http_status"
    return rec


class _Runner:  # what the board reads of the HTTP runner
    def __init__(self):
        import time

        self.t0 = time.perf_counter() - 2.0  # a run two seconds old
        self.in_flight = 3


def test_board_figures_are_the_ended_requests():
    board = LiveBoard()
    board.plan(10, 5.0, 4.0)
    board.attach_http(_Runner())
    # TTFTs 100, 300 and 200 ms; TPOTs (2 tokens) 50, 100 and 150 ms; lags 1, 3, 2 ms.
    board.on_record(0, _record(0, 0.0, 0.001, [0.1, 0.15]), "usage")
    board.on_record(1, _record(1, 0.5, 0.503, [0.8, 0.9]), "usage")
    s = board.snapshot()
    board.on_record(2, _record(2, 1.0, 1.002, [1.2, 1.35]), "usage")
    board.on_record(3, _record(3, 1.0, 1.004, [], ok=False), "events")
    s = board.snapshot()  # incremental: only the two new records are read
    assert (s.done, s.failed, s.in_flight, s.sent, s.total) == (3, 1, 3, 7, 10)
    # p50s from the board's bounded-error histograms: within LIVE_RELATIVE_ERROR.
    close = dict(rel=LIVE_RELATIVE_ERROR)
    assert s.ttft_p50_ms == pytest.approx(200.0, **close)
    assert s.tpot_p50_ms == pytest.approx(100.0, **close)
    assert s.send_lag_p50_ms == pytest.approx(2.5, **close)
    assert s.send_lag_max_ms == pytest.approx(4.0)  # exact
    assert s.output_tok_s == pytest.approx(6 / s.elapsed_s)
    assert s.achieved_rate == pytest.approx(7 / s.elapsed_s) and s.target_rate == 4.0
    rows = dict(panel_lines(s))
    assert "sent 7 of 10" in rows["requests"] and "failed 1" in rows["requests"]
    assert "TTFT p50 " in rows["latency"] and "engine" not in rows
    assert f"{s.ttft_p50_ms:,.1f} ms" in rows["latency"]


def test_board_reads_the_array_simulator(monkeypatch):
    """A large simulated run (the array simulator: no request objects) feeds the board too:
    its finished requests' TTFT and TPOT, its in-flight count and its replicas' last step."""
    import numpy as np

    import cbbench.engine.sim.array_sim as array_sim
    from cbbench.engine.args import EngineArgs
    from cbbench.load.arrivals import arrival_times
    from cbbench.load.workload import load_workload, sample_requests
    from cbbench.targets.engine_compact import run_engine_compact

    reqs, _ = sample_requests(load_workload("sharegpt"), 800, 0)
    arrivals = arrival_times(reqs, 200.0, 1.0, "poisson", 0, None)
    opts = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", data_parallel_size=2)
    board = LiveBoard()
    board.plan(800, float(arrivals.max()), 200.0)
    monkeypatch.setattr(array_sim, "CHECK_EVERY_STEPS", 500)
    mid = []
    run = run_engine_compact(opts, reqs, arrivals, live=board,
                             on_progress=lambda done, total: mid.append(board.snapshot()))
    # Mid-run: the replicas' last steps (running counts those that finish in it).
    assert mid and all(m.running and 0 < m.kv_use < 1 and 0 < m.token_budget_use <= 1
                       and m.done + m.failed + m.in_flight == m.sent for m in mid)
    assert [m.done for m in mid] == sorted(m.done for m in mid) and mid[-1].done < 800
    s = board.snapshot()
    r = run.requests
    first = np.array([run.replica_end_s[r.replica[i]][r.first_step[i]] for i in range(len(r))])
    last = np.array([run.replica_end_s[r.replica[i]][r.first_step[i] + r.output_tokens[i] - 1]
                     for i in range(len(r))])
    ttft_ms = (first - r.arrival_s) * 1000.0
    multi = r.output_tokens > 1
    tpot_ms = (last - first)[multi] / (r.output_tokens[multi] - 1) * 1000.0
    assert (s.done, s.failed, s.in_flight, s.sent) == (800, 0, 0, 800)
    close = dict(rel=LIVE_RELATIVE_ERROR)
    assert s.ttft_p50_ms == pytest.approx(float(np.percentile(ttft_ms, 50)), **close)
    assert s.tpot_p50_ms == pytest.approx(float(np.percentile(tpot_ms, 50)), **close)
    assert s.elapsed_s == pytest.approx(run.duration_s)
    assert s.output_tok_s == pytest.approx(int(r.output_tokens.sum()) / s.elapsed_s)


def test_the_last_frame_never_sends_more_than_planned():
    """The engine's last step still counts as running the requests it finished; the panel's
    last frame read "sent 31 of 30". In flight is what the plan has left, at most."""
    from types import SimpleNamespace

    from cbbench.engine.core.request import RequestStatus

    step = SimpleNamespace(num_running=1, num_waiting=0, token_budget=2048,
                           kv_blocks_total=100, kv_blocks_used=3, num_prefill_tokens=0,
                           num_decode_tokens=1)
    engine = SimpleNamespace(records=[step], rejected=[], clock=SimpleNamespace(now=lambda: 3.0))
    board = LiveBoard()
    board.plan(2, 3.0, None)
    board.attach_engine(engine)
    done = [SimpleNamespace(status=RequestStatus.FINISHED, token_times=[1.0, 1.5, 2.0],
                            arrival_time=0.5, num_output_tokens=3) for _ in range(2)]
    board.on_finished(done)  # the last step finished both, and still lists one running
    s = board.snapshot()
    assert (s.done, s.in_flight, s.sent, s.total) == (2, 0, 2, 2)
    assert "sent 2 of 2   in flight 0   done 2" in dict(panel_lines(s))["requests"]
