"""Bad input, end to end: every case runs `cbbench` as its console script does and must exit 2
with exactly one stderr line starting `cbbench: error:`, nothing on stdout, no traceback, and no
result (or temporary) file left behind.

The cases run in this process (helpers.cli_in_process: the console script's own entry, ~50 ms
a case instead of a process's ~1 CPU-s of imports); test_real_processes_say_the_same runs a
few of them as real `cbbench` processes and requires the very same status, stdout and stderr.

What tests/cli/test_cli_run.py, tests/load/test_workload.py, tests/analysis/test_gate.py and tests/analysis/test_compare.py
already cover is not repeated here (tests/FAILURE_MODES.md maps each failure mode to its test).
The cases run once per module.

In-process tests at the end: requests that can never fit (beyond the context or the whole KV
pool) are rejected with their reason while the run goes on, and the bugs found (xfail).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cli_in_process

from cbbench.engine.args import ENGINES
from cbbench.engine.model_config import preset_names
from cbbench.engine.sim.gpu_specs import gpu_names
from cbbench.load.workload import JSONL_FIELDS, builtin_names
from cbbench.schema.run import Request, RunResult

CBBENCH = shutil.which("cbbench")
COMMAND = [CBBENCH] if CBBENCH else [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
SIM = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--num-requests", "5"]
TORCH = ["run", "--engine", "torch", "--device", "cpu", "--model", "tiny", "--num-requests", "5"]
GOOD_LINE = json.dumps({"prompt_len": 4, "output_len": 2})
# /proc takes no new files, not even from root: an output path there is unwritable for anyone.
UNWRITABLE = "/proc/cbbench-test-output/x.json"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _jsonl(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# name -> content of a workload file in the shared folder (None: no file at all)
WORKLOADS: dict[str, str | bytes | None] = {
    "missing.jsonl": None,
    "malformed.jsonl": _jsonl(GOOD_LINE, GOOD_LINE, '{"prompt_len": 4, "output_len": 2', GOOD_LINE),
    "unknown_field.jsonl": _jsonl(GOOD_LINE, '{"prompt_len": 4, "output_len": 2, "temperature": 1}'),
    "wrong_type.jsonl": _jsonl('{"prompt_len": "4", "output_len": 2}'),
    "float_len.jsonl": _jsonl(GOOD_LINE, '{"prompt_len": 4, "output_len": 2.5}'),
    "zero_output.jsonl": _jsonl(GOOD_LINE, GOOD_LINE, '{"prompt_len": 4, "output_len": 0}'),
    "negative_prompt.jsonl": _jsonl('{"prompt_len": -3, "output_len": 2}'),
    # Valid JSON, past int64: the summary's columns raised OverflowError after the run.
    "huge_priority.jsonl": _jsonl('{"prompt_len": 10, "output_len": 5, '
                                  '"priority": 9223372036854775808}'),
    "huge_output.jsonl": _jsonl(GOOD_LINE, '{"prompt_len": 10, "output_len": 1' + "0" * 20 + "}"),
    "not_an_object.jsonl": _jsonl(GOOD_LINE, "[4, 2]"),
    "bad_ids.jsonl": _jsonl('{"prompt_token_ids": [1, -2], "output_len": 2}'),
    "empty.jsonl": "",
    "binary.jsonl": b"\xff\xfe\x00\x01garbage\n",
    "short_trace.jsonl": _jsonl(*(
        json.dumps({"prompt_len": 4, "output_len": 2, "arrival_s": i * 0.1}) for i in range(3)
    )),
    "trace_5s.jsonl": _jsonl(*(
        json.dumps({"prompt_len": 4, "output_len": 2, "arrival_s": i * 5}) for i in range(3)
    )),
    "vocab.jsonl": _jsonl(json.dumps({"prompt_token_ids": [1, 2, 100000], "output_len": 2})),
}

# id -> (argv, texts the one error line must contain). {w} is the workloads folder, {o} the
# case's own output folder (it must stay empty), {r} a folder of result files.
CASES: dict[str, tuple[list[str], list[str]]] = {
    # ---- workload files ------------------------------------------------------------------------
    "workload-missing": (
        [*SIM, "--workload", "{w}/missing.jsonl"], ["workload file not found", "missing.jsonl"]),
    "workload-is-a-folder": ([*SIM, "--workload", "{w}"], ["cannot read workload file"]),
    "workload-malformed-json-names-the-line": (
        [*SIM, "--workload", "{w}/malformed.jsonl"], ["malformed.jsonl:3: malformed JSON"]),
    "workload-unknown-field-lists-allowed": (
        [*SIM, "--workload", "{w}/unknown_field.jsonl"],
        ["unknown_field.jsonl:2: unknown field(s) temperature",
         "allowed: " + ", ".join(sorted(JSONL_FIELDS))]),
    "workload-wrong-type": (
        [*SIM, "--workload", "{w}/wrong_type.jsonl"],
        ["wrong_type.jsonl:1: 'prompt_len' must be an integer, got str"]),
    "workload-float-length": (
        [*SIM, "--workload", "{w}/float_len.jsonl"],
        ["float_len.jsonl:2: 'output_len' must be an integer, got float"]),
    "workload-zero-output": (
        [*SIM, "--workload", "{w}/zero_output.jsonl"],
        ["zero_output.jsonl:3: 'output_len' must be >= 1, got 0"]),
    "workload-negative-prompt": (
        [*SIM, "--workload", "{w}/negative_prompt.jsonl"],
        ["negative_prompt.jsonl:1: 'prompt_len' must be >= 1, got -3"]),
    # --workload random never reached the sampler's check: -1 was a numpy ValueError traceback,
    # 0 an empty result with exit 0.
    "num-requests-negative-random": (
        [*SIM, "--workload", "random", "--num-requests", "-1"],
        ["--num-requests must be >= 1, got -1"]),
    "num-requests-zero-random": (
        [*SIM, "--workload", "random", "--num-requests", "0"],
        ["--num-requests must be >= 1, got 0"]),
    # numpy's overflow RuntimeWarning came out as two more stderr lines before the error.
    "time-scale-overflows": (
        [*SIM, "--workload", "{w}/trace_5s.jsonl", "--num-requests", "3", "--arrival",
         "trace", "--time-scale", "1e308"],
        ["the arrival schedule spans inf s, more than 2592000 s (30 days): check --time-scale "
         "and the trace's arrival_s"]),
    # The rate was recorded in the config and the header, and never used.
    "arrival-trace-with-a-rate": (
        [*SIM, "--workload", "{w}/trace_5s.jsonl", "--arrival", "trace", "--request-rate", "5"],
        ["--arrival trace replays the trace's own arrival_s: drop --request-rate"]),
    "burstiness-at-rate-inf": (
        [*SIM, "--burstiness", "0.5"],
        ["--burstiness shapes the gaps between arrivals: at --request-rate inf"]),
    "burstiness-with-constant-arrivals": (
        [*SIM, "--burstiness", "0.5", "--arrival", "constant", "--request-rate", "5"],
        ["--burstiness shapes gamma arrivals: with --arrival constant it does nothing"]),
    "save-detailed-and-summary-only": (
        [*SIM, "--save-detailed", "--summary-only"],
        ["--save-detailed adds to each request's record and --summary-only keeps none"]),
    "workload-priority-past-int64": (
        [*SIM, "--workload", "{w}/huge_priority.jsonl"],
        ["huge_priority.jsonl:1: 'priority' must be a 64-bit integer (within "
         "[-9223372036854775808, 9223372036854775807]), got 9223372036854775808"]),
    "workload-length-past-int64": (
        [*SIM, "--workload", "{w}/huge_output.jsonl"],
        ["huge_output.jsonl:2: 'output_len' must be a 64-bit integer"]),
    "workload-line-not-an-object": (
        [*SIM, "--workload", "{w}/not_an_object.jsonl"],
        ["not_an_object.jsonl:2: expected a JSON object, got list"]),
    "workload-negative-token-id": (
        [*SIM, "--workload", "{w}/bad_ids.jsonl"], ["bad_ids.jsonl:1: 'prompt_token_ids'"]),
    "workload-empty": ([*SIM, "--workload", "{w}/empty.jsonl"], ["holds no requests"]),
    "workload-not-utf8": ([*SIM, "--workload", "{w}/binary.jsonl"], ["cannot read workload file"]),
    "workload-trace-shorter-than-num-requests": (
        ["run", "--engine", "sim", "--workload", "{w}/short_trace.jsonl", "--num-requests", "10"],
        ["the trace has 3 timed requests"]),
    "arrival-trace-without-timestamps": (
        [*SIM, "--arrival", "trace"], ["--arrival trace needs a workload"]),
    "token-id-outside-the-vocabulary": (
        [*TORCH, "--workload", "{w}/vocab.jsonl", "--num-requests", "1"],
        ["token id 100000 is outside the model's vocabulary of 512"]),
    # ---- unknown names: the message lists the valid ones ---------------------------------------
    "unknown-workload-lists-builtins": (
        [*SIM, "--workload", "nope"], ["unknown workload 'nope'", *builtin_names()]),
    "unknown-model-lists-presets": ([*SIM, "--model", "gpt-17"], ["unknown model", *preset_names()]),
    "unknown-gpu-lists-gpus": ([*SIM, "--gpu", "tpu-v9"], ["unknown GPU 'tpu-v9'", *gpu_names()]),
    "unknown-engine-lists-engines": (
        [*SIM, "--engine", "vllm"], ["--engine must be one of", "'vllm'", *ENGINES]),
    "unknown-attention-backend-lists-backends": (
        [*TORCH, "--attention-backend", "cutlass"],
        ["--attention-backend must be one of", "'cutlass'", "reference", "torch", "triton",
         "flash-attn"]),
    "unknown-arrival": ([*SIM, "--arrival", "uniform"], ["unknown arrival process", "gamma"]),
    "unknown-kv-allocation": ([*SIM, "--kv-allocation", "x"], ["paged", "reserved"]),
    "unknown-dtype": ([*SIM, "--dtype", "fp8"], ["--dtype must be one of", "'fp8'", "bf16", "fp32"]),
    "unknown-device": ([*TORCH, "--device", "tpu"], ["--device must be one of", "'tpu'", "cpu", "cuda"]),
    "unknown-preemption-mode": ([*SIM, "--preemption", "drop"], ["'drop'", "recompute", "swap"]),
    "unknown-queue-policy": ([*SIM, "--policy", "lifo"], ["'lifo'", "fcfs", "priority"]),
    "swap-space-negative": ([*SIM, "--swap-space", "-1"], ["--swap-space"]),
    "workloads-show-unknown": (["workloads", "show", "nope"], ["unknown workload 'nope'"]),
    # ---- numbers out of range ------------------------------------------------------------------
    "rate-negative": ([*SIM, "--request-rate", "-1"], ["invalid request rate '-1'"]),
    "rate-nan": ([*SIM, "--request-rate", "nan"], ["invalid request rate 'nan'"]),
    "rate-empty": ([*SIM, "--request-rate", ""], ["invalid request rate ''"]),
    "burstiness-negative": ([*SIM, "--burstiness", "-1"], ["--burstiness"]),
    "burstiness-inf": ([*SIM, "--burstiness", "inf"], ["--burstiness"]),
    "max-error-rate-above-1": ([*SIM, "--max-error-rate", "2"], ["--max-error-rate"]),
    "telemetry-interval-zero": ([*SIM, "--telemetry-interval", "0"], ["--telemetry-interval"]),
    "max-concurrency-without-endpoint": ([*SIM, "--max-concurrency", "4"], ["--endpoint"]),
    "top-p-zero": ([*SIM, "--top-p", "0"], ["--top-p"]),
    "temperature-negative": ([*SIM, "--temperature", "-1"], ["--temperature"]),
    "gpu-memory-utilization-above-1": ([*SIM, "--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization must be in (0, 1], got 1.5"]),
    "block-size-zero": ([*SIM, "--block-size", "0"], ["--block-size must be >= 1"]),
    "token-budget-zero": ([*SIM, "--max-num-batched-tokens", "0"], ["--max-num-batched-tokens"]),
    "kv-blocks-zero": ([*SIM, "--num-kv-blocks", "0"], ["--num-kv-blocks must be >= 1"]),
    "max-model-len-zero": ([*SIM, "--max-model-len", "0"], ["--max-model-len must be >= 1"]),
    "top-k-negative": ([*SIM, "--top-k", "-2"], ["--top-k must be >= -1"]),  # -1 is off, as vLLM
    "eta-memory-above-1": ([*SIM, "--eta-memory", "2"], ["--eta-memory must be in (0, 1], got 2.0"]),
    "overhead-negative": ([*SIM, "--iteration-overhead-us", "-1"], ["--iteration-overhead-us must be >= 0"]),
    # ---- issue 19: non-finite numbers and names the sim ignored (serve's are checked before it
    # listens: each case would otherwise serve for ever, until the subprocess timeout) --------
    "serve-overhead-inf": (
        ["serve", "--engine", "sim", "--port", "0", "--iteration-overhead-us", "inf"],
        ["--iteration-overhead-us must be a finite number, got inf"]),
    "serve-read-timeout-nan": (
        ["serve", "--engine", "sim", "--port", "0", "--read-timeout", "nan"], ["--read-timeout"]),
    "run-overhead-nan": ([*SIM, "--iteration-overhead-us", "nan"], ["--iteration-overhead-us"]),
    "run-attention-backend-bogus-on-sim": (
        [*SIM, "--attention-backend", "bogus"], ["--attention-backend must be one of"]),
    "serve-attention-backend-bogus-on-sim": (
        ["serve", "--engine", "sim", "--port", "0", "--attention-backend", "bogus"],
        ["--attention-backend must be one of"]),
    "endpoint-port-out-of-range": (
        [*SIM, "--endpoint", "http://127.0.0.1:99999"],
        ["invalid --endpoint 'http://127.0.0.1:99999'", "Port out of range"]),
    "endpoint-unclosed-ipv6-bracket": (
        [*SIM, "--endpoint", "http://user:secret@[::1"], ["invalid --endpoint 'http://[::1'"]),
    "endpoint-control-character": (  # urlsplit dropped the CR LF: a different path was used
        [*SIM, "--endpoint", "http://127.0.0.1:8000/v1\r\nX: y"], ["a control character"]),
    "endpoint-space": (
        [*SIM, "--endpoint", "http://127.0.0.1:8000/v 1"], ["a space"]),
    "endpoint-port-not-a-number": (
        [*SIM, "--endpoint", "http://localhost:80a"], ["invalid --endpoint"]),
    "sweep-endpoint-port-out-of-range": (
        ["sweep", "--endpoint", "http://127.0.0.1:70000", "--rates", "1"], ["invalid --endpoint"]),
    # ---- SLO strings ---------------------------------------------------------------------------
    "slo-without-value": ([*SIM, "--slo", "ttft"], ["invalid SLO 'ttft'", "ttft, tpot, e2el"]),
    "slo-not-a-number": ([*SIM, "--slo", "ttft=fast"], ["milliseconds expected"]),
    "slo-zero": ([*SIM, "--slo", "ttft=500,tpot=0"], ["must be > 0"]),
    "slo-nan": ([*SIM, "--slo", "e2el=nan"], ["must be > 0"]),
    # ---- outputs that cannot be written: refused before the run --------------------------------
    "run-output-unwritable": ([*SIM, "--output", UNWRITABLE], ["cannot"]),
    "compare-markdown-unwritable": (
        ["compare", "{r}/a.json", "{r}/b.json", "--markdown", UNWRITABLE], ["cannot"]),
    "compare-variants-out-dir-unwritable": (
        ["compare", "--engine", "sim", "--num-requests", "5", "--variants", "static,continuous",
         "--out-dir", "/proc/cbbench-test-variants"], ["cannot"]),
    "gate-junit-unwritable": (
        ["gate", "{r}/a.json", "--baseline", "{r}/b.json", "--junit", UNWRITABLE], ["cannot"]),
    # ---- result files: another schema version, not a result, a folder --------------------------
    "compare-other-schema-version": (
        ["compare", "{r}/a.json", "{r}/v2.json"], ["schema_version 2", "reads version 1"]),
    "gate-other-schema-version-baseline": (
        ["gate", "{r}/a.json", "--baseline", "{r}/v2.json"], ["schema_version 2"]),
    "report-other-schema-version": (
        ["report", "{r}/a.json", "{r}/v2.json", "--out", "{o}/report"], ["schema_version 2"]),
    "compare-not-a-result": (["compare", "{r}/a.json", "{r}/list.json"], ["no schema_version"]),
    "compare-not-json": (["compare", "{r}/a.json", "{r}/torn.json"], ["is not valid JSON"]),
    "gate-result-is-a-folder": (
        ["gate", "{r}/a.json", "--baseline", "{r}"], ["result file", "is a folder; give a file"]),
    # ---- gate thresholds -----------------------------------------------------------------------
    "gate-threshold-unknown-metric": (
        ["gate", "{r}/a.json", "--baseline", "{r}/b.json", "--max-regression", "speed=5%"],
        ["unknown metric 'speed'", "output_throughput"]),
    "gate-threshold-no-value": (
        ["gate", "{r}/a.json", "--baseline", "{r}/b.json", "--max-regression", "ttft_ms.p99"],
        ["invalid threshold"]),
    "gate-threshold-negative": (
        ["gate", "{r}/a.json", "--baseline", "{r}/b.json", "--max-regression", "ttft_ms.p99=-3%"],
        ["must be a number >= 0"]),
    "gate-threshold-not-a-number": (
        ["gate", "{r}/a.json", "--baseline", "{r}/b.json", "--max-regression", "failed=many"],
        ["invalid threshold value"]),
    # issue 19: true == 1 in Python; a negative throughput is no baseline
    "gate-schema-version-true": (
        ["gate", "{r}/a.json", "--baseline", "{r}/vtrue.json"], ["schema_version True"]),
    "compare-schema-version-float": (
        ["compare", "{r}/a.json", "{r}/vfloat.json"], ["schema_version 1.0"]),
    "gate-negative-throughput-baseline": (
        ["gate", "{r}/a.json", "--baseline", "{r}/negative.json"],
        ["output_throughput = -100.0: it cannot be negative"]),
    "gate-unknown-option": (
        ["gate", "{r}/a.json", "--baseline", "{r}/b.json", "--max-regresion", "failed=0"],
        ["no such option: --max-regresion"]),
}


def _fill(arg: str, w: Path, o: Path, r: Path) -> str:
    return arg.replace("{w}", str(w)).replace("{o}", str(o)).replace("{r}", str(r))


ENV = {"CUDA_VISIBLE_DEVICES": "", "COLUMNS": "200"}
# Cases also run as real `cbbench` processes (test_real_processes_say_the_same): one of each
# kind of boundary: a library UsageError, click's parse error, a result file's reader.
REAL_PROCESS_CASES = ("workload-missing", "gate-unknown-option", "compare-other-schema-version",
                      "rate-nan")


def _run(argv: list[str], cwd: Path):
    """The command in this process (helpers.cli_in_process): (outcome, seconds)."""
    t = time.monotonic()
    outcome = cli_in_process(argv, cwd=cwd, env=ENV)
    return outcome, time.monotonic() - t


def _run_process(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The command as a real `cbbench` process: (process, seconds)."""
    env = dict(os.environ, **ENV)
    t = time.monotonic()
    proc = subprocess.run(
        [*COMMAND, *argv], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    return proc, time.monotonic() - t


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    w = tmp_path_factory.mktemp("workloads")
    for name, content in WORKLOADS.items():
        if content is None:
            continue
        p = w / name
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    r = tmp_path_factory.mktemp("results")
    from cbbench.analysis.result import SCHEMA_VERSION, write_result

    base = {
        "schema_version": SCHEMA_VERSION, "interrupted": False,
        "config": {"workload": "sharegpt", "num_requests": 5, "seed": 0, "request_rate": "inf",
                   "burstiness": 1.0, "arrival": "gamma"},
        "summary": {"completed": 5, "failed": 0, "output_throughput": 100.0,
                    "request_throughput": 1.0, "ttft_ms": {"p50": 1.0, "p99": 2.0},
                    "tpot_ms": {"p50": 1.0, "p99": 2.0}, "itl_ms": {"p99": 2.0},
                    "e2el_ms": {"p99": 3.0}},
    }
    write_result(r / "a.json", base)
    write_result(r / "b.json", base)
    (r / "v2.json").write_text(json.dumps({**base, "schema_version": 2}))
    (r / "list.json").write_text("[1, 2, 3]")
    (r / "vtrue.json").write_text(json.dumps({**base, "schema_version": True}))
    (r / "vfloat.json").write_text(json.dumps({**base, "schema_version": 1.0}))
    negative = {**base, "summary": {**base["summary"], "output_throughput": -100.0}}
    (r / "negative.json").write_text(json.dumps(negative))
    (r / "torn.json").write_text(json.dumps(base)[:40])
    return w, r


def _case_argv(name: str, w: Path, o: Path, r: Path) -> list[str]:
    argv = [_fill(a, w, o, r) for a in CASES[name][0]]
    if argv[0] == "run" and "--output" not in argv:
        argv += ["--output", str(o / "x.json")]
    return argv


@pytest.fixture(scope="module")
def outcomes(folders, tmp_path_factory):
    """Every case, in this process: id -> (outcome, seconds, its output folder)."""
    w, r = folders
    root = tmp_path_factory.mktemp("cases")
    done = {}
    for name in CASES:
        o = root / name
        o.mkdir()
        argv = _case_argv(name, w, o, r)
        # serve stays a real process: were its check missing, it would serve for ever here.
        proc, secs = (_run_process if argv[0] == "serve" else _run)(argv, o)
        done[name] = (proc, secs, o)
    return done


def _assert_one_error_line(proc, texts=()) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("cbbench: error: "), line
    for t in texts:
        assert t in line, (t, line)
    assert proc.stdout == "", proc.stdout
    return line


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_with_one_line(outcomes, case):
    proc, _, out = outcomes[case]
    _assert_one_error_line(proc, CASES[case][1])
    assert _files_under(out) == [], "a partial or temporary file was left"


@pytest.mark.parametrize("case", REAL_PROCESS_CASES)
def test_real_processes_say_the_same(outcomes, folders, tmp_path, case):
    """The in-process cases stand for real processes: a real `cbbench` process exits with the
    same status and prints the same stdout and stderr, byte for byte (the case's output folder
    differs only in its name, so each side's is put back as {o})."""
    w, r = folders
    mine, _, o = outcomes[case]
    proc, _ = _run_process(_case_argv(case, w, tmp_path, r), tmp_path)
    _assert_one_error_line(proc, CASES[case][1])
    assert _files_under(tmp_path) == []
    assert (proc.returncode, proc.stdout, proc.stderr.replace(str(tmp_path), "{o}")) == (
        mine.returncode, mine.stdout, mine.stderr.replace(str(o), "{o}"))


def test_unwritable_output_is_refused_before_the_run(outcomes):
    """The output is checked before the workload is read or the engine is built: the run
    returns at once (a real 5-request run takes longer, and 'auto' would first print its 'no
    GPU found' notice), with only the error line."""
    proc, secs, _ = outcomes["run-output-unwritable"]
    assert "no GPU found" not in proc.stderr
    assert secs < 20
    big = ["run", "--engine", "auto", "--workload", "long-prompt", "--num-requests", "100000",
           "--output", UNWRITABLE]
    proc, secs = _run_process(big, Path.cwd())  # a real process: its own, whole start-up
    _assert_one_error_line(proc, ["cannot"])
    assert secs < 20, f"took {secs:.1f} s: did the run start?"


def test_unreadable_workload_file(tmp_path):
    w = tmp_path / "secret.jsonl"
    w.write_text(GOOD_LINE + "\n")
    w.chmod(0)
    try:
        readable = os.access(w, os.R_OK)
        if readable:
            pytest.skip("running as root (or with CAP_DAC_OVERRIDE): mode 000 does not stop reads")
        proc, _ = _run([*SIM, "--workload", str(w), "--output", str(tmp_path / "o" / "x.json")],
                       tmp_path)
        _assert_one_error_line(proc, ["cannot read workload file", "Permission denied"])
        assert not (tmp_path / "o" / "x.json").exists()
    finally:
        w.chmod(0o644)


def test_read_only_output_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root (or with CAP_DAC_OVERRIDE): mode 555 does not stop writes")
        proc, _ = _run([*SIM, "--output", str(ro / "x.json")], tmp_path)
        _assert_one_error_line(proc, ["cannot write to"])
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_negative_seed(tmp_path):
    proc, _ = _run([*SIM, "--seed", "-1", "--output", str(tmp_path / "x.json")], tmp_path)
    _assert_one_error_line(proc, ["--seed"])


@pytest.mark.parametrize(
    "args", [["--num-requests", "many"], ["--no-such-flag"]], ids=["not-an-int", "unknown-flag"]
)
def test_option_parse_errors_exit_2(tmp_path, args):
    """Click's own parse errors exit 2 without a traceback."""
    proc, _ = _run([*SIM, *args, "--output", str(tmp_path / "x.json")], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_option_parse_errors_are_one_line(tmp_path):
    proc, _ = _run([*SIM, "--num-requests", "many", "--output", str(tmp_path / "x.json")],
                   tmp_path)
    _assert_one_error_line(proc, ["--num-requests"])


# ---- requests that can never fit: rejected with the reason, the run goes on -----------------
def _spec(tmp_path: Path, lines: list[dict], **engine):
    from helpers import run_spec

    from cbbench.engine.args import EngineArgs

    w = tmp_path / "w.jsonl"
    w.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_spec(workload=str(w), num_requests=len(lines), engine=EngineArgs(**engine))


def _by_id(result: RunResult) -> dict[int, Request]:
    return {r.id: r for r in result.requests or []}


def test_prompt_beyond_the_context_is_rejected_and_the_run_goes_on(tmp_path):
    from cbbench.bench.runner import execute_run

    lines = [{"prompt_len": 100, "output_len": 8}] * 3 + [{"prompt_len": 9000, "output_len": 8}]
    result = execute_run(_spec(tmp_path, lines, engine="sim"))
    s = result.summary
    assert s.completed == 3 and s.failed == 1
    assert s.error_types == {"rejected": 1}
    bad = _by_id(result)[3]
    assert "exceed the model's context of 8192" in bad.error
    assert bad.output_tokens == 0 and bad.ttft_ms is None


def test_prompt_beyond_the_whole_kv_pool_is_rejected_and_the_run_goes_on(tmp_path):
    from cbbench.bench.runner import execute_run

    lines = [{"prompt_len": 40, "output_len": 8}] * 3 + [{"prompt_len": 500, "output_len": 8}]
    spec = _spec(tmp_path, lines, engine="sim", num_kv_blocks=8, block_size=16)
    result = execute_run(spec)
    s = result.summary
    assert s.completed == 3 and s.error_types == {"rejected": 1}
    assert "needs 32 KV blocks but the whole pool has 8" in _by_id(result)[3].error


def test_torch_engine_rejects_a_prompt_beyond_the_context(tmp_path):
    pytest.importorskip("torch")
    from cbbench.bench.runner import execute_run

    lines = [{"prompt_len": 12, "output_len": 4}] * 2 + [{"prompt_len": 300, "output_len": 4}]
    spec = _spec(tmp_path, lines, engine="torch", device="cpu", model="tiny", max_model_len=128,
                 num_kv_blocks=64)
    result = execute_run(spec)
    s = result.summary
    assert s.completed == 2 and s.error_types == {"rejected": 1}
    assert "exceed the model's context of 128" in _by_id(result)[2].error


def test_torch_engine_rejects_an_absurd_prompt_len_without_building_it(tmp_path):
    pytest.importorskip("torch")
    from cbbench.bench.runner import execute_run

    lines = [{"prompt_len": 12, "output_len": 4}, {"prompt_len": 10**12, "output_len": 4}]
    spec = _spec(tmp_path, lines, engine="torch", device="cpu", model="tiny", num_kv_blocks=64)
    result = execute_run(spec)
    assert result.summary.error_types == {"rejected": 1}


def test_absurd_arrival_time_is_a_usage_error(tmp_path):
    pytest.importorskip("torch")
    from cbbench.bench.runner import execute_run
    from cbbench.errors import UsageError

    lines = [{"prompt_len": 8, "output_len": 2, "arrival_s": 0},
             {"prompt_len": 8, "output_len": 2, "arrival_s": 1e300}]
    spec = _spec(tmp_path, lines, engine="torch", device="cpu", model="tiny", num_kv_blocks=64)
    with pytest.raises(UsageError, match="arrival_s"):
        execute_run(spec)
