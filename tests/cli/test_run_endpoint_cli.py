"""The CLI wiring of `cbbench run --endpoint`: options to EndpointOptions, the result file, exit
codes (0, 1 over --max-error-rate after the result is written, 2 for bad flags).

Targets, all on 127.0.0.1: the in-process `cbbench serve --engine sim` of test_serve.py, the
fault-injecting fake of test_http_target.py, and a port nothing listens on. Every command runs
with sys.argv set to its own command line, as a real invocation has it (the result records it).
Every network loop here is bounded in count and time.
"""

from __future__ import annotations

import json
import sys

import pytest
from fake_openai import MODEL as FAKE_MODEL
from fake_openai import FakeOpenAI
from helpers import SERVE_MODEL as MODEL
from helpers import free_port, sim_options, start_server
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.cli.serve import build_serving_engine
from cbbench.schema import read_run, to_dict

SECRET = "Bearer sk-cbbench-test-0123456789"
N = 12
OUTPUT_LEN = 16


@pytest.fixture(scope="module")
def srv():
    run = start_server(lambda: build_serving_engine(sim_options()))
    yield run
    run.stop()


@pytest.fixture
def workload(tmp_path):
    """N length-only requests (synthetic prompts work for both APIs)."""
    path = tmp_path / "small.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt_len": 20 + i, "output_len": OUTPUT_LEN}) + "\n" for i in range(N))
    )
    return path


def invoke(monkeypatch, *args: str):
    monkeypatch.setattr(sys, "argv", ["cbbench", *args])
    return CliRunner().invoke(app, list(args))


def endpoint_run(monkeypatch, url: str, workload, out, *extra: str):
    return invoke(
        monkeypatch, "run", "--endpoint", url, "--workload", str(workload),
        "--num-requests", str(N), "--output", str(out), *extra,
    )


def one_error_line(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and not res.stdout, res.output
    assert lines[0].startswith("cbbench: error: ")
    assert "Traceback" not in res.output
    return lines[0]


# ---- against the sim server ----------------------------------------------------------------
def test_endpoint_run_writes_an_http_result(srv, workload, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", SECRET)
    out = tmp_path / "http.json"
    res = endpoint_run(
        monkeypatch, srv.url, workload, out, "--request-rate", "100",
        "--header", "Authorization=env:MY_KEY", "--header", "X-Team=$MY_KEY",
    )
    assert res.exit_code == 0, res.output
    assert f"result: {out}" in res.stdout
    text = out.read_text()
    result = to_dict(read_run(out))
    cfg = result["config"]
    assert cfg["target"] == "http"
    assert cfg["endpoint"] == srv.url and cfg["api"] == "completions"
    assert cfg["header_names"] == ["Authorization", "X-Team"]
    assert cfg["served_model"] == MODEL and cfg["served_model_requested"] is None
    assert cfg["num_requests"] == N and cfg["request_rate"] == 100
    # Header names, never values: not in the file, nor on the terminal.
    assert SECRET not in text and "sk-cbbench" not in text
    assert "sk-cbbench" not in res.output

    s = result["summary"]
    assert s["completed"] == N and s["failed"] == 0
    http = s["http"]
    assert http["target"] == "http" and http["served_model"] == MODEL
    assert http["models_listed"] == [MODEL]  # discovered from /v1/models
    assert http["token_count_method"] == {"usage": N}
    assert http["not_sent"] == 0
    assert [r["output_tokens"] for r in result["requests"]] == [OUTPUT_LEN] * N
    assert all(r["send_lag_ms"] >= 0 and r["ttft_ms"] > 0 for r in result["requests"])
    assert result["iterations"] == []  # an endpoint has no engine iterations to report

    tel = result["telemetry"]
    assert tel["available"] is False and tel["samples"] == [] and tel["gpu_indices"] == []
    assert "remote endpoint" in tel["reason"] and "--gpu-index" in tel["reason"]


def test_server_side_latency_from_cbbench_serve(srv, workload, tmp_path, monkeypatch):
    # cbbench serve exposes vLLM's latency histograms: the run puts the server's own figures
    # beside the client's, over this run's requests only (the server has served others).
    out = tmp_path / "latency.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--request-rate", "50",
                       "--scrape-metrics")
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    lat = result["summary"]["http"]["server_latency"]
    assert set(lat) >= {"ttft_ms", "itl_ms", "tpot_ms", "e2el_ms", "note"}
    assert lat["ttft_ms"]["observations"] == N and lat["e2el_ms"]["observations"] == N
    assert lat["itl_ms"]["observations"] == N * (OUTPUT_LEN - 1)
    rows = result["requests"]
    client_ttft = [r["ttft_ms"] - r["send_lag_ms"] for r in rows]  # from the send
    # Per request the server's TTFT is inside the client's, so the exact means are ordered.
    assert 0 < lat["ttft_ms"]["server_mean"] <= sum(client_ttft) / N
    t = lat["ttft_ms"]
    assert t["diff_p50"] == pytest.approx(t["client_p50"] - t["server_p50"])
    assert "server" in res.stdout and "client - server" in res.stdout
    assert "before" in result["server_histograms"] and "after" in result["server_histograms"]


def test_chat_api(srv, workload, tmp_path, monkeypatch):
    out = tmp_path / "chat.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--api", "chat")
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    assert result["config"]["api"] == "chat" and result["summary"]["http"]["api"] == "chat"
    assert result["summary"]["completed"] == N
    assert [r["output_tokens"] for r in result["requests"]] == [OUTPUT_LEN] * N
    # The chat template's tokens come on top of the prompt: the server counts more.
    assert result["summary"]["http"]["prompt_tokens_mismatch"]["mean_diff"] > 0


def test_served_model_is_used(srv, workload, tmp_path, monkeypatch):
    out = tmp_path / "named.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--served-model", MODEL)
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    assert result["config"]["served_model"] == MODEL
    assert result["config"]["served_model_requested"] == MODEL
    assert "models_listed" not in result["summary"]["http"]  # no /v1/models look-up

    # A name the server does not serve: it is what every request asks for, and each one fails.
    out = tmp_path / "misnamed.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--served-model", "not-served")
    assert res.exit_code == 1, res.output
    result = to_dict(read_run(out))
    assert result["config"]["served_model"] == "not-served"
    assert result["summary"]["error_types"] == {"http_status": N}
    assert all(
        r["error"].startswith("HTTP 404") and "not-served" in r["error"]
        for r in result["requests"]
    )


def test_a_cap_that_never_binds_is_no_slot_wait(srv, workload, tmp_path, monkeypatch):
    """--max-concurrency above the run's concurrency: no request waits for a slot, so its slot
    wait is 0 and the dispatcher's lateness is send lag, as it is without the cap (the time
    after the acquire was recorded as the slot, so the send lag moved into slot wait)."""
    out = tmp_path / "uncapped.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--max-concurrency", str(N + 1),
                       "--request-rate", "50", "--seed", "1")
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    rows = result["requests"]
    assert result["summary"]["http"]["max_in_flight"] <= N
    assert [r["slot_wait_ms"] for r in rows] == [0.0] * N
    for r in rows:  # the send lag is the whole gap from the intended start to the send
        assert r["ttft_ms"] - r["ttft_from_send_ms"] == pytest.approx(r["send_lag_ms"], abs=1e-6)
    assert result["summary"]["send_lag_ms"]["p99"] > 0


def test_a_closed_loops_steady_window_lasts_while_requests_wait_for_a_slot(
        srv, workload, tmp_path, monkeypatch):
    """--max-concurrency 1 at 200 req/s: the 12 requests' intended starts end by ~0.06 s, but
    they get their slot one after another until the last one's. The steady window closed at the
    last intended arrival, leaving out nearly all of the loop's busy time; it now runs to the
    last request's slot (the run drains only after it)."""
    out = tmp_path / "closed.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--max-concurrency", "1",
                       "--request-rate", "200", "--seed", "2")
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    rows = result["requests"]
    last_intended = max(r["intended_start_s"] for r in rows)
    last_slot = max(r["intended_start_s"] + r["slot_wait_ms"] / 1000 for r in rows)
    assert last_slot > last_intended + 0.1  # the loop waited well past the schedule
    a, b = result["summary"]["steady_state"]["window_s"]
    assert b > last_intended + 0.1 and b <= last_slot + 1e-9
    assert result["summary"]["steady_state"]["arrivals_end_s"] == pytest.approx(last_slot)


def test_max_concurrency_caps_in_flight(srv, workload, tmp_path, monkeypatch):
    cap = 4
    out = tmp_path / "capped.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--max-concurrency", str(cap))
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    assert result["config"]["max_concurrency"] == cap
    assert result["summary"]["http"]["max_in_flight"] == cap  # all N arrive at t=0
    assert result["summary"]["completed"] == N
    rows = result["requests"]
    # From the records alone: [send, last token] intervals never overlap more than the cap.
    events = []
    for r in rows:
        send = r["intended_start_s"] + (r["slot_wait_ms"] + r["send_lag_ms"]) / 1000
        events += [(send, 1), (r["intended_start_s"] + r["e2el_ms"] / 1000, -1)]
    level = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts on ties
        level += step
        peak = max(peak, level)
    assert peak == cap
    # Requests past the first `cap` waited for a slot (a request here takes ~16 iterations of
    # ~2.7 ms): slot wait is reported, not send lag, and not as the client falling behind.
    waited = sorted(r["slot_wait_ms"] for r in rows)
    assert len(waited) == N and waited[-(N - cap)] > 10
    assert [r["queue_ms"] for r in rows] == [r["slot_wait_ms"] for r in rows]
    s = result["summary"]
    assert not s["http"]["client_fell_behind"] and "fell behind" not in res.output
    assert s["send_lag_ms"]["p50"] < 10 and s["slot_wait_ms"]["p99"] > 10
    assert s["http"]["send_lag_p50_ms"] == pytest.approx(s["send_lag_ms"]["p50"])
    # Both bases: from the intended start (the table's) and from the send, per request and in
    # the summary; they differ by the slot wait plus the (small) send lag.
    assert s["latency_basis"] == "intended_start"
    for r in rows:
        gap = r["ttft_ms"] - r["ttft_from_send_ms"]
        assert gap == pytest.approx(r["slot_wait_ms"] + r["send_lag_ms"], abs=1e-6)
    assert s["from_send"]["ttft_ms"]["count"] == N
    assert s["from_send"]["ttft_ms"]["p99"] < s["ttft_ms"]["p99"]
    assert s["from_send"]["e2el_ms"]["mean"] < s["e2el_ms"]["mean"]
    assert "TTFT from send (ms)" in res.stdout and "slot wait (ms)" in res.stdout
    assert "count from the intended start" in res.stdout


def test_a_closed_loops_slo_is_judged_from_the_send(srv, workload, tmp_path, monkeypatch):
    """--max-concurrency 1 with every request at t=0 and --slo ttft=200,e2el=400: a request
    here takes ~16 iterations of ~2.7 ms, so the later ones wait for their slot far past the
    limits. Goodput counted the wait (0 or 1 of 12 met it, whatever the server did); it is
    judged from the send, as vLLM's --goodput, in the summary, the table and the requests
    sweep and capacity read."""
    from cbbench.analysis.summary.slo import run_attainment

    out = tmp_path / "closed_slo.json"
    res = endpoint_run(monkeypatch, srv.url, workload, out, "--max-concurrency", "1",
                       "--slo", "ttft=200,e2el=400")
    assert res.exit_code == 0, res.output
    result = read_run(out)
    s = to_dict(result)["summary"]
    assert s["ttft_ms"]["p99"] > 400  # the wait for the slot, from the intended start
    assert s["from_send"]["e2el_ms"]["p99"] < 400
    assert s["slo_attainment"] == 1.0 and s["slo_basis"] == "send"
    assert s["goodput"] == pytest.approx(N / s["duration_s"])
    assert run_attainment(result, {"ttft": 200.0, "e2el": 400.0}) == 1.0
    assert "100.0% (TTFT, E2EL from send)" in res.stdout


# ---- exit codes: failures ------------------------------------------------------------------
@pytest.fixture
def faulty(tmp_path):
    """Six requests for the fake server, two of which fail (an HTTP 500 and a cut stream)."""
    prompts = ["ok one", "fault:http500 two", "ok three", "fault:cut four", "ok five", "ok six"]
    path = tmp_path / "faulty.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "output_len": 4}) + "\n" for p in prompts))
    return path, len(prompts)


def test_failures_exit_1_after_writing_the_result(fake_server, faulty, tmp_path, monkeypatch):
    path, n = faulty
    out = tmp_path / "faulty.json"
    res = invoke(
        monkeypatch, "run", "--endpoint", fake_server.url, "--workload", str(path),
        "--num-requests", str(n), "--output", str(out),
    )
    assert res.exit_code == 1, res.output
    assert f"result: {out}" in res.stdout  # the table and the path came first
    assert "2 of 6 requests failed" in res.stderr and "--max-error-rate" in res.stderr
    assert "Traceback" not in res.output
    result = to_dict(read_run(out))  # complete and valid
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (4, 2)
    assert s["error_types"] == {"http_status": 1, "stream_cut": 1}
    assert result["config"]["target"] == "http"
    assert result["config"]["served_model"] == FAKE_MODEL
    assert len(result["requests"]) == n


@pytest.mark.parametrize("rate,code", [("1", 0), ("0.5", 0), ("0.3", 1)])
def test_max_error_rate_decides_the_exit_code(fake_server, faulty, tmp_path, monkeypatch, rate, code):
    path, n = faulty  # 2 of 6 fail: 33%
    out = tmp_path / "faulty.json"
    res = invoke(
        monkeypatch, "run", "--endpoint", fake_server.url, "--workload", str(path),
        "--num-requests", str(n), "--output", str(out), "--max-error-rate", rate,
    )
    assert res.exit_code == code, res.output
    assert to_dict(read_run(out))["summary"]["failed"] == 2


def test_server_ignoring_ignore_eos_warns_and_counts(fake_server, tmp_path, monkeypatch):
    prompts = ["fault:eos one", "fault:eos two", "three", "four"]
    path = tmp_path / "eos.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "output_len": 10}) + "\n" for p in prompts))
    out = tmp_path / "eos.json"
    res = invoke(
        monkeypatch, "run", "--endpoint", fake_server.url, "--workload", str(path),
        "--num-requests", "4", "--output", str(out),
    )
    assert res.exit_code == 0, res.output  # the requests completed: a warning, not a failure
    warned = [line for line in res.stderr.splitlines() if "max_tokens" in line]
    assert len(warned) == 1 and warned[0].startswith("cbbench: warning: ")
    assert "ignore_eos" in warned[0] and "--no-ignore-eos-field" in warned[0]
    result = to_dict(read_run(out))
    short = result["summary"]["short_outputs"]
    assert (short["count"], short["checked"], short["share"]) == (2, 4, 0.5)
    assert short["mean_shortfall"] == 10 - 3
    by_prompt = {r["output_tokens"] for r in result["requests"] if r["finish_reason"] == "stop"}
    assert by_prompt == {3}
    assert all(r["max_tokens"] == 10 and r["output_tokens_method"] == "usage"
               for r in result["requests"])
    assert "short outputs (< max_tokens)" in res.stdout and "2 / 4" in res.stdout


def test_scrape_metrics_without_a_metrics_page_is_one_warning_line(workload, tmp_path, monkeypatch):
    out = tmp_path / "nometrics.json"
    with FakeOpenAI(metrics=False) as s:
        res = endpoint_run(monkeypatch, s.url, workload, out, "--scrape-metrics")
    assert res.exit_code == 0, res.output
    said = [line for line in res.stderr.splitlines() if "metrics" in line]
    assert len(said) == 1 and said[0].startswith("cbbench: warning: --scrape-metrics")
    assert "HTTP 404" in said[0]
    assert to_dict(read_run(out))["server_metrics"] == []


def test_scrape_metrics_filter_flag(fake_server, workload, tmp_path, monkeypatch):
    out = tmp_path / "filtered.json"
    # The filter alone asks for the scrape; the fake's page has process_cpu_seconds_total.
    res = endpoint_run(monkeypatch, fake_server.url, workload, out, "--scrape-metrics-filter", "^process_")
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    assert result["config"]["scrape_metrics"] is True
    assert result["config"]["scrape_metrics_filter"] == "^process_"
    assert {r["name"] for r in result["server_metrics"]} == {"process_cpu_seconds_total"}
    res = endpoint_run(monkeypatch, fake_server.url, workload, out, "--scrape-metrics-filter", "(")
    assert res.exit_code == 2 and "--scrape-metrics-filter" in one_error_line(res)


def test_header_value_is_sent_but_never_written(fake_server, workload, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", SECRET)
    fake_server.reset()
    out = tmp_path / "auth.json"
    res = endpoint_run(
        monkeypatch, fake_server.url, workload, out, "--header", "Authorization=env:MY_KEY"
    )
    assert res.exit_code == 0, res.output
    assert len(fake_server.requests) == N
    assert {q["headers"]["authorization"] for q in fake_server.requests} == {SECRET}
    assert SECRET not in out.read_text() and "sk-cbbench" not in res.output
    assert to_dict(read_run(out))["config"]["header_names"] == ["Authorization"]


def test_closed_port_records_connect_failures(workload, tmp_path, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "closed.json"
    res = endpoint_run(monkeypatch, url, workload, out, "--served-model", "m")
    assert res.exit_code == 1, res.output
    result = to_dict(read_run(out))
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (0, N)
    assert s["error_types"] == {"connect": N}
    assert all(r["error_type"] == "connect" and r["error"] for r in result["requests"])
    assert result["config"]["endpoint"] == url


def test_closed_port_without_served_model_is_a_usage_error(workload, tmp_path, monkeypatch):
    out = tmp_path / "closed.json"
    res = endpoint_run(monkeypatch, f"http://127.0.0.1:{free_port()}", workload, out)
    assert res.exit_code == 2, res.output
    assert "--served-model" in one_error_line(res)
    assert not out.exists()


# ---- exit codes: bad flags -----------------------------------------------------------------
@pytest.mark.parametrize(
    "flags,mentions",
    [
        (["--header", "noequals"], "--header"),
        (["--header", "Bad Name=x"], "--header"),
        (["--header", "Authorization=env:CBBENCH_TEST_UNSET"], "CBBENCH_TEST_UNSET"),
        (["--api", "foo"], "--api"),
        (["--request-timeout", "0"], "--request-timeout"),
        (["--request-timeout", "nan"], "--request-timeout"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--max-error-rate", "2"], "--max-error-rate"),
        (["--endpoint", "127.0.0.1:8000"], "--endpoint"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_flags_exit_2_with_one_line(workload, tmp_path, monkeypatch, flags, mentions):
    monkeypatch.delenv("CBBENCH_TEST_UNSET", raising=False)
    out = tmp_path / "never.json"
    # A closed port: a flag checked after the run starts would show as connect failures.
    res = endpoint_run(
        monkeypatch, f"http://127.0.0.1:{free_port()}", workload, out, "--served-model", "m",
        *flags,
    )
    assert res.exit_code == 2, res.output
    assert mentions in one_error_line(res)
    assert not out.exists()


def test_max_concurrency_needs_an_endpoint(workload, tmp_path, monkeypatch):
    out = tmp_path / "never.json"
    res = invoke(
        monkeypatch, "run", "--engine", "sim", "--workload", str(workload), "--num-requests",
        str(N), "--output", str(out), "--max-concurrency", "4",
    )
    assert res.exit_code == 2, res.output
    assert "--endpoint" in one_error_line(res)
    assert not out.exists()


# ---- secrets on the command line -----------------------------------------------------------
@pytest.mark.parametrize("where", ["header", "url"])
def test_no_secret_from_the_command_line_in_the_result(srv, workload, tmp_path, monkeypatch, where):
    secret = "sk-literal-cbbench-secret"
    out = tmp_path / "literal.json"
    if where == "header":
        res = endpoint_run(monkeypatch, srv.url, workload, out, "--header", f"X-Api-Key={secret}")
    else:
        url = srv.url.replace("http://", f"http://user:{secret}@")
        res = endpoint_run(monkeypatch, url, workload, out)
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    assert result["config"]["endpoint"] == srv.url  # the redacted field is right
    assert secret not in out.read_text()


def test_no_secret_from_the_command_line_in_the_capacity_file(srv, workload, tmp_path,
                                                               monkeypatch):
    """capacity.json records the command as a run's result does: redacted."""
    secret = "sk-literal-cbbench-secret"
    out = tmp_path / "capacity.json"
    url = srv.url.replace("http://", f"http://user:{secret}@")
    res = invoke(monkeypatch, "capacity", "--endpoint", url, "--workload", str(workload),
                 "--header", f"X-Api-Key={secret}", "--slo", "ttft_p99=100000",
                 "--start-rate", "20", "--num-requests", "4", "--max-requests", "4",
                 "--min-duration", "0.1", "--precision", "0.9", "--out", str(out))
    # 4 requests judge no steady state: "not judged" (exit 1), the file written all the same.
    assert res.exit_code == 1, res.output
    doc = json.loads(out.read_text())
    assert "--header 'X-Api-Key=<redacted>'" in doc["command"]
    assert secret not in out.read_text()
