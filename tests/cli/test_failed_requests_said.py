"""After a run whose requests failed, stderr says why: each error type with its count and one
request's message on one line (analysis/error_summary.py), as vLLM's bench and AIPerf's error
summary do. Before, the console showed only "completed 4 / failed 6" and the max-error-rate
line; the reason (a model name the server does not serve, a prompt over the context) was in
the result JSON alone. stdout stays the table."""

from __future__ import annotations

import json
import re

import pytest
from helpers import SERVE_MODEL, sim_options, start_server
from typer.testing import CliRunner

from cbbench.analysis.error_summary import SAMPLE_MAX_CHARS, error_lines, readable
from cbbench.cli.app import app
from cbbench.cli.serve import build_serving_engine
from cbbench.schema import read_run

SIM = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]
CONTEXT = "300"  # the sim's default workload has prompts over 300 tokens: some are rejected


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


TYPE_LINE = re.compile(r"\d+ requests? failed \([a-z_]+\)")


def _said(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if TYPE_LINE.search(ln)]


def test_a_run_with_rejected_requests_says_why_on_stderr(tmp_path):
    out = tmp_path / "ml.json"
    res = invoke("run", *SIM, "--max-model-len", CONTEXT, "--num-requests", "10",
                 "--output", str(out))
    assert res.exit_code == 1, res.output
    failed = read_run(out).summary.failed
    assert failed
    lines = _said(res)
    assert len(lines) == 1, res.stderr
    assert f"{failed} requests failed (rejected): prompt (" in lines[0]
    assert f"exceed the model's context of {CONTEXT}" in lines[0]
    assert "failed (rejected)" not in res.stdout  # the table's stdout is unchanged
    # Before the max-error-rate line: the cause, then the verdict.
    err = res.stderr.splitlines()
    assert err.index(next(ln for ln in err if "failed (rejected)" in ln)) < err.index(
        next(ln for ln in err if "above --max-error-rate" in ln))


def test_summary_only_still_counts_each_type(tmp_path):
    res = invoke("run", *SIM, "--max-model-len", CONTEXT, "--num-requests", "10",
                 "--summary-only", "--output", str(tmp_path / "s.json"))
    assert res.exit_code == 1, res.output
    assert len(_said(res)) == 1 and "failed (rejected)" in _said(res)[0]


def test_a_clean_run_says_nothing_of_failures(tmp_path):
    res = invoke("run", *SIM, "--num-requests", "4", "--output", str(tmp_path / "ok.json"))
    assert res.exit_code == 0, res.output
    assert not _said(res)


@pytest.fixture(scope="module")
def srv():
    run = start_server(lambda: build_serving_engine(sim_options()))
    yield run
    run.stop()


def test_a_model_the_server_does_not_serve_is_named_on_stderr(srv, tmp_path):
    res = invoke("run", "--endpoint", srv.url, "--served-model", "gpt-4", "--num-requests", "3",
                 "--output", str(tmp_path / "w.json"))
    assert res.exit_code == 1, res.output
    lines = _said(res)
    assert len(lines) == 1, res.stderr
    # The server's JSON error shown as its message, not as a JSON blob.
    assert (f"3 requests failed (http_status): HTTP 404: the model 'gpt-4' does not exist; "
            f"this server serves '{SERVE_MODEL}'") in lines[0]
    # /tokenize answered too, 404 for the model alone: its notice names the model, not a
    # missing /tokenize (it said "did not size prompts (HTTP 404)", the wrong culprit).
    assert "answered that the model 'gpt-4' does not exist" in res.stderr, res.stderr
    assert "check --served-model" in res.stderr
    assert "did not size prompts" not in res.stderr


def test_a_sweep_point_with_failures_says_why(tmp_path):
    res = invoke("sweep", *SIM, "--max-model-len", CONTEXT, "--rates", "50",
                 "--num-requests", "10", "--min-duration", "0.1", "--skip-warmup", "--out-dir", str(tmp_path / "sw"))
    assert res.exit_code == 0, res.output
    lines = _said(res)
    assert len(lines) == 1 and lines[0].startswith("cbbench: rate 50: "), res.stderr
    assert "failed (rejected): prompt (" in lines[0]


# ---- the line itself ------------------------------------------------------------------------


def test_readable_shows_a_json_errors_message_and_an_html_pages_words():
    body = json.dumps({"error": {"message": "the model 'x' does not exist", "code": 404}})
    assert readable(f"HTTP 404: {body}") == "HTTP 404: the model 'x' does not exist"
    assert readable('HTTP 422: {"detail": "bad field"}') == "HTTP 422: bad field"
    page = "<!DOCTYPE HTML>\n<html>\n <body>\n <h1>Error response</h1>\n <p>Error code: 501</p>"
    assert readable(f"HTTP 501: {page}") == "HTTP 501: Error response Error code: 501"
    assert readable("HTTP 500: plain\ntext") == "HTTP 500: plain text"
    long = readable("x " * 500)
    assert len(long) == SAMPLE_MAX_CHARS and long.endswith("…")


def test_error_lines_most_frequent_first_with_one_sample_each():
    from cbbench.schema.run import RunResult

    result = RunResult.model_validate({
        "schema_version": 1, "config": {},
        "summary": {"completed": 1, "failed": 3,
                    "error_types": {"stream_cut": 1, "http_status": 2}},
        "requests": [
            {"id": 0, "error": "HTTP 500: boom", "error_type": "http_status"},
            {"id": 1, "error": "HTTP 503: later", "error_type": "http_status"},
            {"id": 2, "error": "the stream ended early", "error_type": "stream_cut"},
            {"id": 3},
        ],
    })
    assert error_lines(result) == [
        "2 requests failed (http_status): HTTP 500: boom",
        "1 request failed (stream_cut): the stream ended early",
    ]
