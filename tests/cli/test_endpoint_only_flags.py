"""The endpoint flags without --endpoint: each does nothing for the bundled engine, so each is
refused (exit 2, one line naming the flag) when given, even at its default value, and the run
never starts. Before, `run` and `sweep --engine sim` took `--api embeddings`, `--tokenizer
/nonexistent`, `--header X=1`, `--served-model foo`, `--request-timeout -1`, `--balance
least-in-flight` and `--no-ignore-eos-field`, ran, and exited 0. With --endpoint, a missing
--tokenizer and a timeout <= 0 are refused before the first point runs (a sweep started its
first point, then failed with two stderr lines)."""

from __future__ import annotations

import pytest
from helpers import cli_in_process

RUN = ["run", "--engine", "sim", "--workload", "random", "--num-requests", "3"]
SWEEP = ["sweep", "--engine", "sim", "--workload", "random", "--num-requests", "3",
         "--rates", "1", "--min-duration", "0"]
# An address nothing listens on: the refusals below come before any connection.
NOWHERE = "http://127.0.0.1:9"

CASES = {
    "api": (["--api", "embeddings"], "--api needs --endpoint"),
    "api-at-its-default": (["--api", "completions"], "--api needs --endpoint"),
    "tokenizer": (["--tokenizer", "/nonexistent"], "--tokenizer needs --endpoint"),
    "header": (["--header", "X=1"], "--header needs --endpoint"),
    "served-model": (["--served-model", "foo"],
                     "--served-model needs --endpoint (it names the model an endpoint serves)"),
    "request-timeout": (["--request-timeout", "-1"], "--request-timeout needs --endpoint"),
    "request-timeout-at-its-default": (["--request-timeout", "600"],
                                       "--request-timeout needs --endpoint"),
    "balance": (["--balance", "least-in-flight"], "--balance needs --endpoint"),
    "no-ignore-eos-field": (["--no-ignore-eos-field"], "--no-ignore-eos-field needs --endpoint"),
    "batch-size": (["--batch-size", "2"], "--batch-size needs --endpoint"),
    "lora-modules": (["--lora-modules", "a=0.5"], "--lora-modules needs --endpoint"),
}


def refused(res, message: str, out_path) -> None:
    assert res.returncode == 2, (res.args, res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), res.stderr
    assert message in lines[0]
    assert not out_path.exists()  # nothing ran


@pytest.mark.parametrize("extra,message", list(CASES.values()), ids=list(CASES))
def test_run_refuses_an_endpoint_flag_without_an_endpoint(extra, message, tmp_path):
    out = tmp_path / "r.json"
    refused(cli_in_process([*RUN, *extra, "--output", out], cwd=tmp_path), message, out)


@pytest.mark.parametrize("extra,message", list(CASES.values()), ids=list(CASES))
def test_sweep_refuses_an_endpoint_flag_without_an_endpoint(extra, message, tmp_path):
    out = tmp_path / "sw"
    refused(cli_in_process([*SWEEP, *extra, "--out-dir", out], cwd=tmp_path), message, out)


def test_capacity_refuses_an_endpoint_flag_without_an_endpoint(tmp_path):
    out = tmp_path / "c.json"
    res = cli_in_process(["capacity", "--engine", "sim", "--workload", "random",
                          "--num-requests", "3", "--slo", "ttft=100", "--start-rate", "1",
                          "--served-model", "foo", "--out", out], cwd=tmp_path)
    refused(res, "--served-model needs --endpoint", out)


def test_the_flags_at_their_defaults_unsaid_still_run(tmp_path):
    """No endpoint flag given: the bundled engine runs as before."""
    out = tmp_path / "r.json"
    res = cli_in_process([*RUN, "--output", out, "--quiet"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert out.is_file()


@pytest.mark.parametrize("extra,message", [
    (["--tokenizer", "/nonexistent"], "--tokenizer /nonexistent: no such file or folder"),
    (["--request-timeout", "-1"], "--request-timeout must be a positive number"),
])
@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_a_bad_endpoint_flag_stops_the_probes_before_the_first(command, extra, message, tmp_path):
    args = [command, "--endpoint", NOWHERE, "--workload", "random", "--num-requests", "3",
            "--min-duration", "0", *extra]
    out = tmp_path / "out"
    if command == "sweep":
        args += ["--rates", "1", "--out-dir", out]
    else:
        args += ["--slo", "ttft=100", "--start-rate", "1", "--out", out]
    refused(cli_in_process(args, cwd=tmp_path), message, out)
