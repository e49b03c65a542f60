"""`cbbench run` and `cbbench workloads` end to end on the simulated engine.

Successful runs go through typer's CliRunner (in-process, fast); the error paths run the
console script's own entry (helpers.cli_in_process: its exit status, its stdout and stderr
apart), so "one line on stderr, exit code 2, no traceback" is checked as the script gives it;
tests/cli/test_bad_input.py checks that real processes say the same, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import CliOutcome, cli_in_process
from typer.testing import CliRunner

from cbbench import __version__
from cbbench.analysis.result import SCHEMA_VERSION
from cbbench.cli.app import app
from cbbench.schema import read_run, to_dict

STATS = ("mean", "std", "p50", "p90", "p95", "p99")
REQUEST_FIELDS = ("id", "prompt_tokens", "output_tokens", "ttft_ms", "tpot_ms", "e2el_ms", "error")
ITERATION_FIELDS = (
    "index", "start_s", "duration_s", "num_prefill_tokens", "num_decode_tokens", "token_budget",
    "num_running", "num_waiting", "num_preempted", "kv_blocks_used", "kv_blocks_total",
)
SIM = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def cbbench(*args: str, cwd: Path | None = None) -> CliOutcome:
    """`cbbench ARGS` as its console script runs it, in this process (no ~1 CPU-s start-up)."""
    return cli_in_process(args, cwd=cwd)


@pytest.fixture(scope="module")
def run_200(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tmp" / "x.json"
    res = invoke(*SIM, "--num-requests", "200", "--output", str(out))
    return res, out


# ---- a successful run -----------------------------------------------------------------------
def test_run_exits_0_and_prints_the_table(run_200):
    res, out = run_200
    assert res.exit_code == 0, res.output
    stdout = res.stdout
    for text in ("TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2EL (ms)", "output throughput",
                 "completed / failed", "200 / 0", f"result: {out}"):
        assert text in stdout, text
    assert "Traceback" not in res.output


def test_run_writes_a_versioned_result(run_200):
    _, out = run_200
    assert out.is_file()
    data = json.loads(out.read_text())
    assert to_dict(read_run(out)) == data
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert data["cbbench_version"] == __version__
    assert data["interrupted"] is False
    cfg = data["config"]
    assert cfg["workload"] == "sharegpt" and cfg["num_requests"] == 200
    assert cfg["engine"] == "sim" and cfg["gpu"] == "h200" and cfg["model"] == "llama-3-8b"

    s = data["summary"]
    assert s["completed"] == 200 and s["failed"] == 0
    for key in ("duration_s", "request_throughput", "output_throughput", "total_token_throughput"):
        assert isinstance(s[key], float) and s[key] > 0, key
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat in STATS:
            assert isinstance(s[key][stat], float), (key, stat)
        assert s[key]["p50"] <= s[key]["p90"] <= s[key]["p95"] <= s[key]["p99"]
    assert s["request_throughput"] == pytest.approx(200 / s["duration_s"])

    reqs = data["requests"]
    assert len(reqs) == 200
    assert sorted(r["id"] for r in reqs) == sorted({r["id"] for r in reqs})  # distinct draws
    for r in reqs:
        for f in REQUEST_FIELDS:
            assert f in r, f
        assert r["error"] is None
        assert r["output_tokens"] >= 1 and r["prompt_tokens"] >= 1
        assert 0 < r["ttft_ms"] <= r["e2el_ms"]
        assert (r["tpot_ms"] is None) == (r["output_tokens"] == 1)
        assert "itl_ms" not in r  # only with --save-detailed
    assert s["total_output_tokens"] == sum(r["output_tokens"] for r in reqs)

    its = data["iterations"]
    assert its and [it["index"] for it in its] == list(range(len(its)))
    for it in its:
        for f in ITERATION_FIELDS:
            assert f in it, f
        assert it["num_prefill_tokens"] + it["num_decode_tokens"] <= it["token_budget"]
        assert 0 <= it["kv_blocks_used"] <= it["kv_blocks_total"]
        assert it["duration_s"] > 0
    if not any(it["num_preempted"] for it in its):
        # Without preemption each request's first token comes from its prefill, every other
        # token from a decode row.
        decode_tokens = sum(it["num_decode_tokens"] for it in its)
        assert decode_tokens + len(reqs) == s["total_output_tokens"]


def test_json_flag_prints_valid_json(tmp_path):
    out = tmp_path / "j.json"
    res = invoke(*SIM, "--num-requests", "30", "--output", str(out), "--json")
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)  # nothing but the JSON on stdout
    assert printed["summary"] == json.loads(out.read_text())["summary"]
    assert printed["schema_version"] == 1


def test_save_detailed_adds_itl_lists(tmp_path):
    out = tmp_path / "d.json"
    res = invoke(*SIM, "--num-requests", "30", "--output", str(out), "--save-detailed")
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    for r in data["requests"]:
        assert len(r["itl_ms"]) == r["output_tokens"] - 1
        assert len(r["token_times_s"]) == r["output_tokens"]
        assert all(x >= 0 for x in r["itl_ms"])
    pooled = [x for r in data["requests"] for x in r["itl_ms"]]
    assert data["summary"]["itl_ms"]["count"] == len(pooled)
    assert data["summary"]["itl_ms"]["mean"] == pytest.approx(sum(pooled) / len(pooled))


def test_slo_adds_goodput(tmp_path):
    out = tmp_path / "g.json"
    res = invoke(*SIM, "--num-requests", "30", "--output", str(out), "--slo", "ttft=1e9,tpot=1e9")
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())["summary"]
    assert s["slo"] == {"ttft": 1e9, "tpot": 1e9}
    assert s["goodput"] == pytest.approx(s["request_throughput"])
    assert "goodput" in res.stdout


def test_default_output_goes_to_results_in_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke(*SIM, "--num-requests", "10")
    assert res.exit_code == 0, res.output
    files = list((tmp_path / "results").glob("run-*-sim.json"))
    assert len(files) == 1
    assert read_run(files[0]).summary.completed == 10


# ---- version, help, workloads ---------------------------------------------------------------
def test_version():
    res = invoke("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"cbbench {__version__}"
    proc = cbbench("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"cbbench {__version__}"


@pytest.mark.parametrize(
    ("args", "texts"),
    [
        (["--help"], ["run", "workloads"]),
        (["run", "--help"], ["--workload", "--num-requests", "--request-rate", "--slo", "--json"]),
        (["workloads", "--help"], ["list", "show"]),
    ],
)
def test_help(args, texts):
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    for t in texts:
        assert t in res.stdout, t


def test_workloads_list_and_show():
    res = invoke("workloads", "list")
    assert res.exit_code == 0, res.output
    assert "sharegpt" in res.stdout and "long-prompt" in res.stdout
    from cbbench.load.workload import load_workload

    n = len(load_workload("sharegpt").requests)
    assert str(n) in res.stdout
    res = invoke("workloads", "show", "sharegpt")
    assert res.exit_code == 0, res.output
    assert f"sharegpt: {n} requests" in res.stdout
    assert "prompt_len" in res.stdout and "output_len" in res.stdout


# ---- errors: exit 2, one line, no traceback, no file ----------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--gpu", "tpu-v9"], "unknown GPU 'tpu-v9'"),
        (["--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["--request-rate", "0"], "invalid request rate '0'"),
        (["--request-rate", "abc"], "invalid request rate 'abc'"),
        (["--slo", "ttfb=5"], "invalid SLO"),
        (["--slo", "ttft=-1"], "must be > 0"),
        (["--num-requests", "0"], "--num-requests must be >= 1"),
        (["--burstiness", "0"], "--burstiness must be > 0"),
        (["--scheduler", "fifo"], "--scheduler must be one of continuous, static, got 'fifo'"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    out_dir = tmp_path / "out"
    out = out_dir / "x.json"
    # A later flag wins: a bad --num-requests overrides the 10.
    proc = cbbench(*SIM, "--num-requests", "10", *args, "--output", str(out))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cbbench: error: "), lines[0]
    assert message in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists()
    assert not out_dir.exists() or list(out_dir.iterdir()) == []  # no temp files either


def test_bad_input_in_process_too(tmp_path):
    out = tmp_path / "x.json"
    res = invoke(*SIM, "--workload", "nope", "--output", str(out))
    assert res.exit_code == 2
    assert res.stderr.startswith("cbbench: error: unknown workload")
    assert not out.exists()


def test_unwritable_output_path(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    out = blocker / "x.json"  # a path under a regular file
    proc = cbbench(*SIM, "--num-requests", "10", "--output", str(out))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert blocker.read_text() == "not a folder"
    # An existing folder as the output path is refused too.
    proc = cbbench(*SIM, "--num-requests", "10", "--output", str(tmp_path))
    assert proc.returncode == 2 and "is a folder" in proc.stderr


def test_bad_jsonl_workload_names_the_line(tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text('{"prompt_len": 4, "output_len": 2}\n{"prompt_len": 4}\n')
    out = tmp_path / "x.json"
    proc = cbbench(*SIM, "--workload", str(w), "--output", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"cbbench: error: {w}:2: missing 'output_len'"
    assert not out.exists()


def test_jsonl_workload_runs(tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text("".join(
        json.dumps({"prompt_len": 8 + i, "output_len": 3, "arrival_s": i * 0.01}) + "\n"
        for i in range(5)
    ))
    out = tmp_path / "x.json"
    res = invoke(*SIM, "--workload", str(w), "--num-requests", "5", "--output", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["config"]["arrival"] == "trace"
    assert data["summary"]["completed"] == 5
    assert data["summary"]["total_output_tokens"] == 15


def test_rejected_requests_are_reported_and_decide_the_exit_code(tmp_path):
    out = tmp_path / "x.json"
    res = invoke(*SIM, "--num-requests", "50", "--max-model-len", "300", "--output", str(out))
    # Failures beyond --max-error-rate (default 0) exit 1, after the result is written.
    assert res.exit_code == 1, res.output
    lenient = invoke(
        *SIM, "--num-requests", "50", "--max-model-len", "300", "--max-error-rate", "1",
        "--output", str(tmp_path / "y.json"),
    )
    assert lenient.exit_code == 0, lenient.output
    data = json.loads(out.read_text())
    s = data["summary"]
    assert s["failed"] > 0 and s["completed"] + s["failed"] == 50
    assert s["error_types"] == {"rejected": s["failed"]}
    for r in data["requests"]:
        if r["error"] is not None:
            assert "context of 300" in r["error"]
            assert r["ttft_ms"] is None and r["output_tokens"] == 0


def test_a_short_timed_trace_runs_without_num_requests(tmp_path):
    w = tmp_path / "trace.jsonl"
    w.write_text("".join(
        json.dumps({"prompt_len": 8, "output_len": 3, "arrival_s": i * 0.1}) + "\n"
        for i in range(5)
    ))
    out = tmp_path / "x.json"
    res = invoke(*SIM, "--workload", str(w), "--output", str(out))
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["summary"]["completed"] == 5


# ---- result files ---------------------------------------------------------------------------
def test_result_dumps_and_atomic_write(tmp_path):
    from cbbench.analysis.result import dumps, write_atomic, write_result

    assert json.loads(dumps({"a": float("nan"), "b": [float("inf"), 1.5]})) == {
        "a": None, "b": [None, 1.5]
    }
    p = tmp_path / "sub" / "r.json"
    write_result(p, {"schema_version": 1, "config": {}, "summary": {}})
    assert read_run(p).schema_version == 1
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "sub" / "bad.json", 123)  # fails mid-write
    assert sorted(x.name for x in (tmp_path / "sub").iterdir()) == ["r.json"]  # no temp left


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "result file not found"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "no schema_version"),
        ('{"config": {}, "summary": {}}', "no schema_version"),
        ('{"schema_version": 2, "config": {}, "summary": {}}', "schema_version 2"),
        ('{"schema_version": 1, "summary": {}}', "missing its 'config' section"),
        ('{"schema_version": 1, "config": {}, "summary": []}', "missing its 'summary' section"),
    ],
)
def test_load_result_schema_checks(tmp_path, content, message):
    from cbbench.errors import UsageError

    p = tmp_path / "r.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(UsageError, match=message):
        read_run(p)


def test_a_label_the_terminal_cannot_encode_keeps_the_result(tmp_path):
    """PYTHONIOENCODING=latin-1 and --label 😀: the table (printed before the result is
    written) raised UnicodeEncodeError, a 51-line traceback and no result. Now the character
    is printed escaped and the result holds the label as given."""
    import os
    import subprocess

    from helpers import CBBENCH

    out = tmp_path / "r.json"
    proc = subprocess.run(
        [*CBBENCH, "run", "--engine", "sim", "--workload", "random", "--num-requests", "3",
         "--input-len", "16", "--output-len", "4", "--label", "run-\U0001f600",
         "--output", str(out)],
        capture_output=True, env={**os.environ, "PYTHONIOENCODING": "latin-1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode("latin-1")
    assert b"run-\\U0001f600" in proc.stdout
    assert read_run(out).config.label == "run-\U0001f600"
