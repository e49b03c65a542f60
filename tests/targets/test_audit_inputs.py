"""`cbbench audit` against hostile inputs (issue 37, rules 2, 7 and 8) and a loaded client
(issue 35): its --output never replaces an input, its log reader fails in one line on any file
that is not a request log, a verdict never passes on missing data, and a failure the client's
own lag explains says so. One real run against `cbbench serve --engine sim` is the material."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers import CBBENCH, one_line, serve_process
from typer.testing import CliRunner

from cbbench.analysis.server_side import audit as A
from cbbench.cli.app import app

REQUESTS = 30


@pytest.fixture(scope="module")
def run_and_log(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit-inputs")
    log, res, wl = d / "log.jsonl", d / "r.json", d / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt_len": 30 + i, "output_len": 8}) + "\n"
                          for i in range(REQUESTS)))
    with serve_process("--engine", "sim", "--model", "llama-3-8b", "--gpu", "H200",
                       "--request-log", str(log)) as srv:
        # The run is the material, not the subject: in this process (CliRunner), without a
        # `cbbench` process's ~1.1 s of CPU in imports; the server stays a process of its own.
        out = CliRunner().invoke(app, [
            "run", "--endpoint", srv.url, "--workload", str(wl), "--num-requests",
            str(REQUESTS), "--request-rate", "20", "--save-detailed", "--quiet",
            "--output", str(res)])
        assert out.exit_code == 0, (out.output, out.exception)
    return res, log


def cli(*args):
    return CliRunner().invoke(app, ["audit", *[str(a) for a in args]])


# ---- rule 2: no command writes over its inputs ---------------------------------------------
@pytest.mark.parametrize("target", ["result", "log", "link-to-result", "link-to-log"])
def test_audit_output_over_an_input_is_refused(run_and_log, tmp_path, target):
    """The attack: `audit R.json --server-log L --output R.json` (or L, or a symlink to
    either) replaced the input with the report, exit 0."""
    res, log = run_and_log
    before = res.read_bytes(), log.read_bytes()
    out = {"result": res, "log": log}.get(target)
    if out is None:
        out = tmp_path / "link.json"
        os.symlink(res if target == "link-to-result" else log, out)
    one_line(cli(res, "--server-log", log, "--output", out), "is also an input of this command")
    assert (res.read_bytes(), log.read_bytes()) == before


def test_audit_output_elsewhere_is_written(run_and_log, tmp_path):
    res, log = run_and_log
    r = cli(res, "--server-log", log, "--output", tmp_path / "audit.json")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "audit.json").read_text())
    assert rep["passed"] and rep["coverage"] == {"completed": REQUESTS, "joined": REQUESTS,
                                                 "missing": 0, "passed": True}


# ---- rule 7: the log reader fails in one line ----------------------------------------------
def _lines(log) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines() if x.strip()]


def _write(path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.mark.parametrize("attack,needle", [
    ("binary", "not a JSON line"),
    ("events-a-string", "'events' must be a list"),
    ("events-short", "events[0] must be"),
    ("tokens-1e30", "events[0] must be"),
    ("arrival-nan", "'arrival' must be a time"),
    ("count-a-list", "'output_tokens' must be a count"),
    ("negative-time", "'arrival' must be a time in seconds >= 0"),
])
def test_audit_log_reader_fails_in_one_line(run_and_log, tmp_path, attack, needle):
    """Each was a traceback (IndexError, TypeError, OverflowError, UnicodeDecodeError) or,
    for negative times, a printed transit of -1.8e12 ms."""
    res, log = run_and_log
    bad = tmp_path / "bad.jsonl"
    lines = _lines(log)
    first = lines[0]
    if attack == "binary":
        bad.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00garbage\n")
    else:
        if attack == "events-a-string":
            first["events"] = "abc"
        elif attack == "events-short":
            first["events"] = [[first["arrival"]]]
        elif attack == "tokens-1e30":
            first["events"][0][1] = 10**30
        elif attack == "count-a-list":
            first["output_tokens"] = [1, 2]
        elif attack == "negative-time":
            for x in lines:
                x["arrival"] = -x["arrival"]
        if attack == "arrival-nan":
            bad.write_text(json.dumps(first).replace(str(first["arrival"]), "NaN", 1) + "\n")
        else:
            _write(bad, lines)
    one_line(cli(res, "--server-log", bad), needle)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_audit_log_that_never_ends_is_refused(run_and_log, tmp_path, kind):
    """A FIFO with no writer blocked open() forever; /dev/zero was read without end."""
    res, _ = run_and_log
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    out = subprocess.run([*CBBENCH, "audit", str(res), "--server-log", path],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("cbbench: error: "), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "not a file" in out.stderr


# ---- rule 8: a verdict never passes on missing data ----------------------------------------
def test_audit_with_half_the_requests_absent_fails(run_and_log, tmp_path):
    """The attack: 15 of 30 requests taken out of the log; the audit passed."""
    res, log = run_and_log
    half = tmp_path / "half.jsonl"
    _write(half, _lines(log)[: REQUESTS // 2])
    r = cli(res, "--server-log", half, "--output", tmp_path / "a.json")
    assert r.exit_code == 1, r.output
    assert "FAILED" in r.output and f"15 of {REQUESTS} completed requests are not in the log" \
        in r.output
    rep = json.loads((tmp_path / "a.json").read_text())
    assert rep["coverage"]["missing"] == 15 and not rep["passed"]


def test_audit_with_another_runs_log_says_so(run_and_log, tmp_path):
    """A log from another run: its ids join nothing (one line naming that), and one whose
    ids match but whose clock is elsewhere (times a day away) is refused, not audited."""
    res, log = run_and_log
    other = tmp_path / "other.jsonl"
    lines = _lines(log)
    _write(other, [{**x, "id": x["id"] + "-other"} for x in lines])
    one_line(cli(res, "--server-log", other), "no request of the result joins",
             "is it this run's log?")
    shifted = tmp_path / "shifted.jsonl"
    for x in lines:
        for k, v in list(x.items()):
            if isinstance(v, float) and v > 1e9:
                x[k] = v + 86400.0
        x["events"] = [[t + 86400.0, *rest] for t, *rest in x["events"]]
    _write(shifted, lines)
    one_line(cli(res, "--server-log", shifted), "not this run's log")


# ---- issue 35: a failure the client caused says so -----------------------------------------
def test_audit_failure_on_a_loaded_client_names_the_client(run_and_log, tmp_path):
    """A client that read every event 4 ms late on a loaded machine: FAILED at +4 ms against
    2 ms read as a server bug. With the client's own record of its lag (its event loop woke
    12 ms late at p99), the audit says the client, not the server, is the cause; without
    such a record it says the client's reads were late and nothing it recorded explains it."""
    res, log = run_and_log
    data = json.loads(res.read_text())
    for r in data["requests"]:
        r["token_times_s"] = [t + 0.004 for t in r["token_times_s"]]
    http = data["summary"]["http"]
    http.update(loop_lag_p50_ms=3.0, loop_lag_p99_ms=12.0, client_bound=True)
    late = tmp_path / "late.json"
    late.write_text(json.dumps(data))
    r = cli(late, "--server-log", log)
    assert r.exit_code == 1 and "FAILED" in r.output, r.output
    assert "cause: the client, not the server" in r.output and "p99 12.0 ms" in r.output
    http.update(loop_lag_p50_ms=0.1, loop_lag_p99_ms=0.3, client_bound=False)
    late.write_text(json.dumps(data))
    rep = A.audit(data, A.read_server_log(log))
    assert not rep["passed"] and "the client recorded no lag that explains it" in rep["cause"]


def test_run_server_log_from_another_run_says_so(run_and_log, tmp_path):
    """`run --server-log` with another run's log joined nothing and said nothing; now the
    split is not taken and the reason is given (the runner keeps the run and prints it)."""
    from types import SimpleNamespace

    from cbbench.analysis.server_side.server_join import read_log_for
    from cbbench.errors import UsageError

    _, log = run_and_log
    records = [SimpleNamespace(ok=True, server_request_id=f"chatcmpl-elsewhere-{i}")
               for i in range(3)]
    with pytest.raises(UsageError, match="none of the run's 3 completed requests is in"):
        read_log_for(str(log), records, settle_s=0.0)
    mine = [SimpleNamespace(ok=True, server_request_id=x["id"]) for x in _lines(log)]
    assert len(read_log_for(str(log), mine, settle_s=0.0)) == REQUESTS
