"""cbbench's result readers against hostile files and outputs (a reviewer's round on audit,
compare, report, import, gate, export and calibrate). Each case was a traceback, a partial
output, a hang or an absurd import:

- audit: a server-log line holding a 401-digit integer (OverflowError), a tool call of
  ``argument_tokens: "many"`` (TypeError), ``event_tokens`` shorter than ``token_times_s``
  (IndexError), a 10^30-token event (OverflowError): now one line, exit 2, naming the line or
  the request;
- audit --output and compare --csv/--markdown on a full disk printed their table, then exit 2:
  now nothing on stdout;
- report with one of its files' names taken by a folder wrote three PNGs, then exit 2: now the
  folder is left as it was;
- an AIPerf record with ``credit_issued_ns: 0`` imported as a 55-year run; a vLLM bench file
  with empty lists as a 0-request result: both refused;
- a FIFO with no writer hung gate, export, calibrate and report: now refused before any open.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import helpers
import pytest
from helpers import CBBENCH
from typer.testing import CliRunner

from cbbench.cli.app import app

T0 = 1000.0  # the run clock's zero on the epoch
REQUESTS = 3
DEV_FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="needs /dev/full")
SIM = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(res, *texts: str) -> str:
    """helpers.one_line, and nothing on stdout."""
    line = helpers.one_line(res, *texts)
    assert res.stdout == "", res.stdout
    return line


# ---- audit: a hand-made result and its server log ------------------------------------------
def _request(i: int, **kw) -> dict:
    """Request i: sent at 10 ms + i ms, three events (2, 1, 1 tokens) 40, 50 and 61 ms later."""
    send = 0.010 + i * 0.001
    return {"id": i, "send_s": send, "token_times_s": [send + 0.040, send + 0.050, send + 0.061],
            "event_tokens": [2, 1, 1], "output_tokens": 4, "server_request_id": f"chatcmpl-{i}",
            "tool_calls": [{"id": "c1", "name": "f", "argument_tokens": 1}], **kw}


def _line(i: int) -> dict:
    """The server's line of request i: arrived 1 ms after the send, each event as read."""
    send = T0 + 0.010 + i * 0.001
    return {"id": f"chatcmpl-{i}", "status": 200, "finish": "length", "arrival": send + 0.001,
            "output_tokens": 4, "tool_call_tokens": 1,
            "events": [[send + 0.040, 2, "answer"], [send + 0.050, 1, "answer"],
                       [send + 0.061, 1, "tool"]]}


def _audit_files(tmp_path: Path, first: dict | None = None) -> tuple[Path, Path]:
    """A result (its first request updated by ``first``) and its log, as files."""
    reqs = [_request(i) for i in range(REQUESTS)]
    reqs[0].update(first or {})
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"schema_version": 1, "config": {},
                               "summary": {"http": {"t0_epoch_s": T0}}, "requests": reqs}))
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(_line(i)) + "\n" for i in range(REQUESTS)))
    return res, log


def test_audit_of_the_hand_made_files_passes(tmp_path):
    """The material the cases below break: a clean pair audits and passes."""
    res, log = _audit_files(tmp_path)
    r = cli("audit", res, "--server-log", log)
    assert r.exit_code == 0 and "PASSED" in r.stdout, (r.output, r.exception)


def test_audit_log_line_with_a_huge_integer_is_one_line(tmp_path):
    """`{"id":"x","arrival":1 and 400 zeros}`: OverflowError in math.isfinite, a traceback.
    The log reader now takes the JSON files' rule (engine/json_file.py: 308 digits)."""
    res, log = _audit_files(tmp_path)
    with open(log, "a") as f:
        f.write('{"id": "x", "arrival": 1' + "0" * 400 + "}\n")
    one_line(cli("audit", res, "--server-log", log), f"{log}:{REQUESTS + 1}:",
             "an integer of 401 digits")


@pytest.mark.parametrize("first,needle", [
    ({"tool_calls": [{"argument_tokens": "many"}]}, "tool_calls[0].argument_tokens"),
    ({"tool_calls": [{"argument_tokens": -3}]}, "tool_calls[0].argument_tokens"),
    ({"event_tokens": [1, 1]}, "event_tokens has 2 entries for its 3 token_times_s"),
    ({"event_tokens": [10**30, 1, 1]}, "event_tokens must be counts"),
])
def test_audit_of_a_request_cbbench_did_not_write_is_one_line(tmp_path, first, needle):
    """Each was a traceback (TypeError, IndexError, OverflowError) or a count of -3. Refused,
    naming the request, rather than audited without it: the audit cannot read what the client
    counted, and a request left out would fail the coverage under a wrong reason."""
    res, log = _audit_files(tmp_path, first)
    one_line(cli("audit", res, "--server-log", log), "request 0:", needle)


@needs_dev_full
def test_audit_output_on_a_full_disk_prints_nothing(tmp_path):
    """The table was printed, then `cannot write /dev/full`, exit 2."""
    res, log = _audit_files(tmp_path)
    one_line(cli("audit", res, "--server-log", log, "--output", DEV_FULL), "cannot write")


# ---- compare and report: small simulated runs ------------------------------------------------
@pytest.fixture(scope="module")
def sim_results(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("sim")
    out = []
    for name, rate in (("a", "4"), ("b", "8")):
        path = d / f"{name}.json"
        r = cli("run", *SIM, "--num-requests", "8", "--request-rate", rate, "--quiet",
                "--output", path)
        assert r.exit_code == 0, (r.output, r.exception)
        out.append(path)
    return out[0], out[1]


@needs_dev_full
@pytest.mark.parametrize("flag", ["--csv", "--markdown"])
def test_compare_file_on_a_full_disk_prints_nothing(sim_results, flag):
    a, b = sim_results
    one_line(cli("compare", a, b, flag, DEV_FULL), "cannot write /dev/full")


def test_compare_writes_its_file_and_prints_the_table(sim_results, tmp_path):
    a, b = sim_results
    r = cli("compare", a, b, "--csv", tmp_path / "c.csv")
    assert r.exit_code == 0 and "completed" in r.stdout and "note:" in r.stdout, r.output
    assert (tmp_path / "c.csv").read_text().strip()


def test_report_with_a_file_name_taken_by_a_folder_leaves_the_folder_as_it_was(
        sim_results, tmp_path):
    """kv_usage.png a folder: exit 2 after latency_cdfs.png, token_budget.png and
    batch_occupancy.png were written beside the old report. Now every file is rendered
    first and all are replaced together."""
    a, _ = sim_results
    out = tmp_path / "out"
    out.mkdir()
    old = {"latency_cdfs.png": b"old cdfs", "report.html": b"old page"}
    for name, data in old.items():
        (out / name).write_bytes(data)
    (out / "kv_usage.png").mkdir()
    one_line(cli("report", a, "--out", out), f"{out / 'kv_usage.png'} is a folder")
    assert sorted(p.name for p in out.iterdir()) == sorted([*old, "kv_usage.png"])
    for name, data in old.items():
        assert (out / name).read_bytes() == data
    (out / "kv_usage.png").rmdir()
    r = cli("report", a, "--out", out)
    assert r.exit_code == 0, (r.output, r.exception)
    written = r.stdout.split()
    assert str(out / "kv_usage.png") in written and str(out / "report.html") in written
    assert (out / "kv_usage.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "latency_cdfs.png").read_bytes() != old["latency_cdfs.png"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staged file left


# ---- import ----------------------------------------------------------------------------------
BASE_NS = 1_733_500_000_000_000_000  # 2024-12-06, on AIPerf's time.time_ns()


def _aiperf_line(k: int, start_ns: int | None = None, issued_ns: int | None = None) -> str:
    start = BASE_NS + k * 100_000_000 if start_ns is None else start_ns
    metrics = {
        "time_to_first_token": {"value": 50.0, "unit": "ms"},
        "request_latency": {"value": 140.0, "unit": "ms"},
        "inter_chunk_latency": {"value": [10.0] * 9, "unit": "ms"},
        "output_sequence_length": {"value": 10, "unit": "tokens"},
        "input_sequence_length": {"value": 100, "unit": "tokens"},
    }
    return json.dumps({"metadata": {"request_start_ns": start,
                                    "credit_issued_ns": start if issued_ns is None else issued_ns,
                                    "x_request_id": f"r{k}", "benchmark_phase": "profiling"},
                       "metrics": metrics, "error": None})


@pytest.mark.parametrize("bad,needle", [
    ({"issued_ns": 0}, "metadata.credit_issued_ns 0 is"),
    ({"issued_ns": BASE_NS + 2 * 86_400 * 10**9}, "metadata.credit_issued_ns"),
    ({"start_ns": 5}, "metadata.request_start_ns 5 is"),
])
def test_aiperf_record_with_a_time_not_of_its_run_is_refused(tmp_path, bad, needle):
    """credit_issued_ns 0 (1970): imported, exit 0, as a run of 55 years with a TTFT mean of
    3.5e11 ms; a send of 5 ns likewise moved every other record 55 years on."""
    src = tmp_path / "profile_export.jsonl"
    src.write_text("\n".join([_aiperf_line(0), _aiperf_line(1, **bad), _aiperf_line(2)]) + "\n")
    out = tmp_path / "o.json"
    one_line(cli("import", src, "--from", "aiperf", "--out", out), f"{src}:2:", needle,
             "not a time of this run")
    assert not out.exists()


def test_aiperf_credit_released_seconds_before_its_send_imports(tmp_path):
    """A client that fell 3 s behind its schedule is a run's, not a broken file's: the send
    lag is kept."""
    src = tmp_path / "profile_export.jsonl"
    late = BASE_NS + 4 * 10**9
    src.write_text("\n".join([_aiperf_line(0), _aiperf_line(1, late, BASE_NS + 10**9)]) + "\n")
    out = tmp_path / "o.json"
    r = cli("import", src, "--from", "aiperf", "--out", out)
    assert r.exit_code == 0, (r.output, r.exception)
    s = json.loads(out.read_text())["summary"]
    assert s["send_lag_ms"]["mean"] == pytest.approx(1500.0)  # 0 and 3000 ms


def test_vllm_bench_file_without_requests_is_refused(tmp_path):
    """Empty per-request lists imported as a result of 0 requests, exit 0."""
    data = {"date": "20250101-120000", "duration": 5.0, "request_rate": "inf",
            "model_id": "m", **{k: [] for k in ("input_lens", "output_lens", "ttfts", "itls",
                                                "latencies", "start_times", "errors")}}
    src = tmp_path / "vllm.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "o.json"
    one_line(cli("import", src, "--from", "vllm-bench", "--out", out), "holds no requests")
    assert not out.exists()


# ---- a FIFO with no writer as an input -------------------------------------------------------
@pytest.mark.parametrize("command", ["gate", "export", "calibrate", "report", "compare"])
def test_fifo_as_an_input_is_refused_not_waited_on(tmp_path, sim_results, command):
    """open() of a FIFO with no writer blocks forever: each command hung until killed. In a
    process of its own, with a timeout, so a hang fails the test rather than the suite."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    a, _ = sim_results
    argv = {"gate": ["gate", fifo, "--baseline", a],
            "export": ["export", fifo, "--out", tmp_path / "x.json"],
            "calibrate": ["calibrate", fifo, "--out", tmp_path / "p.json"],
            "report": ["report", fifo, "--out", tmp_path / "rep"],
            "compare": ["compare", fifo, a]}[command]
    proc = subprocess.run([*CBBENCH, *map(str, argv)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("cbbench: error: ") and "is a FIFO, not a file" in lines[0]
    assert proc.stdout == ""


# ---- two outputs of one command on one path ----------------------------------------------------
@pytest.mark.parametrize("argv,said", [
    (["compare", "{a}", "{b}", "--markdown", "{o}/x", "--csv", "{o}/x"],
     "--csv {o}/x is also where --markdown writes"),
    (["gate", "{a}", "--baseline", "{b}", "--junit", "{o}/x", "--markdown", "{o}/x"],
     "--markdown {o}/x is also where --junit writes"),
    (["compare", *SIM, "--workload", "random", "--num-requests", "2", "--variants",
      "static,continuous", "--out-dir", "{o}/v", "--csv", "{o}/v/static.json"],
     "variant static's result {o}/v/static.json is also where --csv writes"),
])
def test_two_outputs_on_one_path_are_refused_before_anything_runs(tmp_path, sim_results, argv,
                                                                  said):
    """The later write replaced the earlier one without a word (compare's CSV over a variant's
    saved result, exit 0). Now one line, exit 2, before any variant runs or file is written."""
    a, b = sim_results
    out = tmp_path / "out"
    out.mkdir()
    fill = {"{a}": str(a), "{b}": str(b)}
    args = [fill.get(x, x.replace("{o}", str(out))) for x in argv]
    one_line(cli(*args), said.replace("{o}", str(out)))
    assert list(out.iterdir()) == []


def test_compare_writes_its_markdown_and_csv_both_or_neither(tmp_path, sim_results):
    """A CSV that failed midway (a full disk: here a file-size limit the Markdown passes, EFBIG
    as ENOSPC would be) left the Markdown written beside a one-line error. Now the two are
    staged together: neither is written, one line, exit 2, nothing on stdout."""
    import sys

    a, b = sim_results
    ok = tmp_path / "ok"
    ok.mkdir()
    assert cli("compare", a, b, "--markdown", ok / "c.md", "--csv", ok / "c.csv").exit_code == 0
    sizes = {p.suffix: p.stat().st_size for p in ok.iterdir()}
    small, large = sorted(sizes.values())
    assert small < large, sizes
    limit = (small + large) // 2
    full = tmp_path / "full"
    full.mkdir()
    code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
            "from cbbench.cli.app import main; main()")
    proc = subprocess.run([sys.executable, "-c", code, "compare", str(a), str(b), "--markdown",
                           str(full / "c.md"), "--csv", str(full / "c.csv")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("cbbench: error: cannot write") and \
        len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""
    assert sorted(full.iterdir()) == []  # no file, no temporary


# ---- another of cbbench's files where a run result is read ----------------------------------
def test_a_sweep_file_is_named_as_one_with_the_results_to_give(tmp_path):
    # sweep.json given to compare, gate or export: "... is missing its 'summary' section", as
    # if it were a broken result; it is a sweep file, made of the per-rate results beside it.
    sweep = tmp_path / "sweep.json"
    points = [{"rate": r, "num_requests": 10, "completed": 10, "failed": 0,
               "file": f"rate-{r}.json"} for r in (4, 8)]
    sweep.write_text(json.dumps({"kind": "cbbench-sweep", "schema_version": 1,
                                 "points": points}))
    run = tmp_path / "a.json"
    run.write_text(json.dumps({"schema_version": 1, "config": {}, "summary": {}}))
    for args in (["compare", sweep, run], ["gate", sweep, "--baseline", run],
                 ["export", sweep, "--format", "csv", "--out", tmp_path / "x.csv"]):
        one_line(cli(*args), f"{sweep} is a sweep file", "not a run result",
                 "rate-*.json", "(rate-4.json, rate-8.json)")
    capacity = tmp_path / "capacity.json"
    capacity.write_text(json.dumps({"kind": "cbbench-capacity", "schema_version": 1}))
    one_line(cli("compare", capacity, run), "is a capacity file", "probe-*-rate-*.json")
