"""`cbbench audit` joins by send order when the result has no response ids (an import from a
tool that records none, vLLM bench): the same run audited both ways gives the same figures,
and a log that is not the run's alone is refused in one line."""

from __future__ import annotations

import json

import pytest
from helpers import serve_process
from typer.testing import CliRunner

from cbbench.analysis.server_side import audit as A
from cbbench.cli.app import app
from cbbench.errors import UsageError

REQUESTS = 24


@pytest.fixture(scope="module")
def run_and_log(tmp_path_factory):
    d = tmp_path_factory.mktemp("order")
    log, res, wl = d / "log.jsonl", d / "r.json", d / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt_len": 30 + i, "output_len": 12}) + "\n"
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
    return json.loads(res.read_text()), A.read_server_log(log), d


def test_send_order_join_gives_the_id_joins_figures(run_and_log):
    result, log, _ = run_and_log
    by_id = A.audit(result, log)
    assert by_id["joined_by"] == "server_request_id" and by_id["joined"] == REQUESTS
    anonymous = json.loads(json.dumps(result))
    for r in anonymous["requests"]:
        r["server_request_id"] = None
    by_order = A.audit(anonymous, log)
    assert by_order["joined_by"] == "send_order" and by_order["joined"] == REQUESTS
    for name in A.TIMING_METRICS:
        assert by_order["metrics"][name] == by_id["metrics"][name], name
    assert by_order["metrics"]["output_tokens"]["mismatched"] == 0


def test_a_log_that_is_not_the_runs_alone_is_refused(run_and_log):
    result, log, d = run_and_log
    anonymous = json.loads(json.dumps(result))
    for r in anonymous["requests"]:
        r["server_request_id"] = None
    extra = dict(log)
    first = next(iter(log.values()))
    extra["cmpl-another-run"] = {**first, "id": "cmpl-another-run", "arrival": 0.0}
    with pytest.raises(UsageError, match=f"its {REQUESTS} sent requests cannot be joined by "
                                         f"send order to the log's {REQUESTS + 1} lines"):
        A.audit(anonymous, extra)
    # Through the CLI: one line, exit 2.
    res_path, log_path = d / "anon.json", d / "extra.jsonl"
    res_path.write_text(json.dumps(anonymous))
    log_path.write_text("".join(json.dumps(x) + "\n" for x in extra.values()))
    # (in this process: the real console script's boundary is test_audit.py's bad-input test)
    out = CliRunner().invoke(app, ["audit", str(res_path), "--server-log", str(log_path)])
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.exit_code == 2 and len(lines) == 1 and "send order" in lines[0], out.stderr


def test_a_client_chosen_id_joins_the_servers_id_that_ends_in_it(run_and_log):
    """AIPerf records the X-Request-Id it sent; the server's response id is cmpl-<that id>."""
    result, log, _ = run_and_log
    tails = json.loads(json.dumps(result))
    for r in tails["requests"]:
        r["server_request_id"] = r["server_request_id"].split("-", 1)[1]
    rep = A.audit(tails, log)
    assert rep["joined_by"] == "server_request_id" and rep["joined"] == REQUESTS
    assert rep["metrics"]["ttft_ms"] == A.audit(result, log)["metrics"]["ttft_ms"]
    for r in tails["requests"]:
        r["server_request_id"] = "nobody-" + r["server_request_id"]  # the check can fail
    with pytest.raises(UsageError, match=f"{REQUESTS} not in the log"):
        A.audit(tails, log)
