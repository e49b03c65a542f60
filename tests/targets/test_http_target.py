"""The HTTP target against the fake OpenAI-compatible streaming server of fake_openai.py:
streaming, the schedule and concurrency, failures, prompts. Token counts and short outputs are
in test_http_counts.py, /metrics scraping in test_http_scrape.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fake_openai import (
    CHAT_TEMPLATE_TOKENS,
    CUT_AFTER,
    MODEL,
    STALL_S,
    TRICKLE_DELAY_S,
    FakeOpenAI,
    assert_accounted,
    endpoint_options,
    make_tiny_tokenizer,
    prompt_requests,
)
from helpers import free_port

from cbbench.analysis.summary.metrics import summarize
from cbbench.errors import UsageError
from cbbench.load.prompts import WORD_POOL, build_prompts, load_tokenizer, synthetic_prompt
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.http import error_rate, run_http, send_lag_check
from cbbench.targets.options import EndpointOptions, normalize_endpoint, parse_header, redact_url

LLAMA3_TOKENIZER = (
    Path(__file__).resolve().parents[3] / "shared" / "tokenizers" / "llama-3.1" / "tokenizer.json"
)

# ---- streaming and counting -----------------------------------------------------------------
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_stream_counts_tokens(fresh_fake_server, api):
    wreqs = prompt_requests([f"hello world {i}" for i in range(6)], output_len=5)
    run = run_http(endpoint_options(fresh_fake_server.url, api=api), wreqs, np.zeros(6))
    assert_accounted(run, 6)
    assert all(r.ok for r in run.records)
    for r in run.records:
        assert r.output_tokens == 5 and len(r.token_times_s) == 5
        assert r.token_times_s == sorted(r.token_times_s) and r.token_times_s[0] >= r.send_s
        extra = CHAT_TEMPLATE_TOKENS if api == "chat" else 0
        assert r.server_prompt_tokens == r.prompt_tokens + extra
        assert r.server_request_id is None  # the fake server's chunks carry no "id"
    assert run.info["token_count_method"] == {"usage": 6}
    assert run.info["prompt_tokens_mismatch"]["mean_abs_diff"] == (7.0 if api == "chat" else 0.0)
    body = fresh_fake_server.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {
        "include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == 5 and body["temperature"] == 0 and body["ignore_eos"] is True
    assert body["model"] == MODEL
    if api == "chat":
        assert fresh_fake_server.requests[0]["path"] == "/v1/chat/completions"
        assert body["messages"][0]["role"] == "user"
    else:
        assert fresh_fake_server.requests[0]["path"] == "/v1/completions"
        assert body["prompt"].startswith("hello world")


def test_stream_keeps_the_first_response_id():
    """OpenAI's response id is read from the first chunk that has one (the role chunk of a
    chat stream may come first without), never replaced, and cut when absurdly long."""
    from cbbench.targets.sse import MAX_RESPONSE_ID_CHARS, SseStream

    def events(*objs) -> bytes:
        return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)

    def tok(text, **extra):
        return {"choices": [{"index": 0, "text": text, "finish_reason": None}], **extra}

    st = SseStream(False, [])
    st.feed(events(tok("a"), tok("b", id="cmpl-7"), tok("c", id="cmpl-8")), 1.0)
    st.feed(b"data: [DONE]\n\n", 2.0)
    st.close(2.0)
    assert st.response_id == "cmpl-7" and st.times == [1.0, 1.0, 1.0]
    st = SseStream(False, [])
    st.feed(events(tok("a", id=7), tok("b", id="x" * (2 * MAX_RESPONSE_ID_CHARS))), 1.0)
    assert st.response_id == "x" * MAX_RESPONSE_ID_CHARS  # a non-string id is not an id


def test_served_model_discovery_and_no_ignore_eos(fresh_fake_server):
    opts = EndpointOptions(endpoint=fresh_fake_server.url + "/v1/", ignore_eos_field=False)
    run = run_http(opts, prompt_requests(["x"]), [0.0])
    assert run.info["served_model"] == MODEL
    assert opts.to_config(run.info["served_model"])["served_model"] == MODEL
    body = fresh_fake_server.requests[0]["body"]
    assert body["model"] == MODEL and "ignore_eos" not in body


def test_discovery_failure_is_usage_error():
    with pytest.raises(UsageError, match="served-model"):
        run_http(EndpointOptions(f"http://127.0.0.1:{free_port()}"), prompt_requests(["x"]), [0.0])


def test_header_sent_but_not_in_config(fresh_fake_server, monkeypatch):
    monkeypatch.setenv("CBBENCH_TEST_KEY", "Bearer sk-secret")
    key, value = parse_header("Authorization=env:CBBENCH_TEST_KEY")
    opts = endpoint_options(fresh_fake_server.url, headers={key: value, "X-Team": "bench"})
    run_http(opts, prompt_requests(["x"]), [0.0])
    assert fresh_fake_server.requests[0]["headers"]["authorization"] == "Bearer sk-secret"
    config = json.dumps(opts.to_config())
    assert "sk-secret" not in config and "bench" not in config
    assert opts.to_config()["header_names"] == ["Authorization", "X-Team"]


def test_parse_header(monkeypatch):
    monkeypatch.setenv("CBBENCH_TEST_KEY", "v1")
    assert parse_header("X-Key=abc=def") == ("X-Key", "abc=def")
    assert parse_header("X-Key=$CBBENCH_TEST_KEY") == ("X-Key", "v1")
    assert parse_header("X-Key=") == ("X-Key", "")
    monkeypatch.delenv("CBBENCH_TEST_NOPE", raising=False)
    for bad in ("novalue", "=v", "Bad Name=v", "X=env:CBBENCH_TEST_NOPE", "X=$1x", "X=a\nb"):
        with pytest.raises(UsageError):
            parse_header(bad)


def test_endpoint_forms_and_redaction():
    assert normalize_endpoint("http://h:8000/v1/") == "http://h:8000"
    assert normalize_endpoint("https://h/proxy/v1") == "https://h/proxy"
    for bad in ("h:8000", "ftp://h", "http://h/?key=1"):
        with pytest.raises(UsageError):
            normalize_endpoint(bad)
    assert redact_url("http://user:pw@h:8000/v1?key=s") == "http://h:8000/v1"
    assert "pw" not in json.dumps(EndpointOptions("http://user:pw@h:1").to_config())
    with pytest.raises(UsageError):
        EndpointOptions("http://h", api="embedding").validate()  # not an API


# ---- schedule and concurrency ---------------------------------------------------------------
def test_arrival_schedule_honored(fresh_fake_server):
    n = 25
    arrivals = np.arange(n) * 0.02  # 50 requests/s for 0.5 s
    progress: list[tuple[int, int]] = []
    run = run_http(
        endpoint_options(fresh_fake_server.url),
        prompt_requests(["x"] * n),
        arrivals,
        on_progress=lambda *a: progress.append(a),
    )
    assert_accounted(run, n)
    assert progress[-1] == (n, n) and len(progress) < n  # throttled, ends complete
    lags = np.array([r.send_s - r.intended_start_s for r in run.records])
    assert (lags >= 0).all()
    assert np.median(lags) < 0.005 and lags.max() < 0.05
    assert not run.info["client_fell_behind"]
    assert [r.intended_start_s for r in run.records] == pytest.approx(arrivals.tolist())
    server_t = np.array([q["t"] for q in fresh_fake_server.requests])
    assert np.median(np.diff(server_t)) > 0.015  # spread out, not sent in a burst
    assert run.duration_s >= arrivals[-1]


def test_max_concurrency_caps_in_flight(fresh_fake_server):
    n, cap = 12, 3
    wreqs = prompt_requests(["delay:0.03"] * n, output_len=3)
    run = run_http(endpoint_options(fresh_fake_server.url, max_concurrency=cap), wreqs, np.zeros(n))
    assert_accounted(run, n)
    assert all(r.ok for r in run.records)
    assert fresh_fake_server.max_in_flight == cap and run.info["max_in_flight"] == cap
    queued = sorted(r.first_scheduled_s for r in run.records)
    assert queued[-1] > 0.15  # the last wave waited for three earlier ones (~0.09 s each)
    assert not run.info["client_fell_behind"]  # the wait for a slot is not client lag


def test_client_fell_behind_warns(fresh_fake_server, notices):
    notes = notices  # the logged notices (conftest)
    blocked = []

    def block_loop(done, total):  # stalls the client's event loop once
        if not blocked:
            blocked.append(1)
            time.sleep(0.3)

    n = 20
    run = run_http(
        endpoint_options(fresh_fake_server.url),
        prompt_requests(["x"] * n),
        np.arange(n) * 0.005,
        on_progress=block_loop,
    )
    assert run.info["client_fell_behind"] and run.info["send_lag_p50_ms"] > 10
    # One fell-behind warning (a slow machine may add the event-loop-lag one: the same stall).
    assert sum("fell behind" in n for n in notes) == 1
    assert send_lag_check([0.5] * 95 + [150] * 5)["client_fell_behind"]
    assert not send_lag_check([0.5] * 100)["client_fell_behind"]


def test_should_stop_lets_in_flight_requests_finish_within_the_grace_period(fresh_fake_server):
    arrivals = [0.0, 0.05, 0.1] + [5.0 + i for i in range(7)]
    wreqs = prompt_requests(["delay:0.05"] * 10, output_len=10)
    t = time.perf_counter()
    run = run_http(
        endpoint_options(fresh_fake_server.url), wreqs, arrivals,
        should_stop=lambda: time.perf_counter() - t > 0.2, grace_s=5.0,
    )
    assert time.perf_counter() - t < 4.0  # the 7 later arrivals were never sent
    assert run.interrupted and run.not_sent == 7 and len(run.records) == 3
    assert all(r.error is None and r.output_tokens == 10 for r in run.records)
    assert_accounted(run, 10)


def test_should_stop_cancels_what_the_grace_period_does_not_cover(fresh_fake_server):
    arrivals = [0.0, 0.05, 0.1] + [5.0 + i for i in range(7)]
    wreqs = prompt_requests(["delay:0.2"] * 10, output_len=10)
    t = time.perf_counter()
    run = run_http(
        endpoint_options(fresh_fake_server.url), wreqs, arrivals,
        should_stop=lambda: time.perf_counter() - t > 0.4, grace_s=0.0,
    )
    assert time.perf_counter() - t < 2.0
    assert run.interrupted and run.not_sent == 7 and len(run.records) == 3
    assert {r.error_type for r in run.records} == {"interrupted"}
    assert all(len(r.token_times_s) >= 1 for r in run.records)
    assert_accounted(run, 10)


# ---- failures -------------------------------------------------------------------------------
def test_faults_are_recorded_per_request(fresh_fake_server):
    expected = {
        "ok": None,
        "cut": "stream_cut",
        "http500": "http_status",
        "http429": "http_status",
        "stall": "timeout",
        "malformed": "bad_event",
        "trickle": None,
        "errorevent": "bad_event",
        "nousage": None,
        "nodone": "stream_cut",
    }
    names = list(expected)
    wreqs = prompt_requests([f"fault:{f} please" for f in names], output_len=5)
    t = time.perf_counter()
    run = run_http(endpoint_options(fresh_fake_server.url, request_timeout_s=1.0), wreqs, np.zeros(len(names)))
    assert time.perf_counter() - t < STALL_S  # the timeout cut the stall short
    assert_accounted(run, len(names))
    got = {names[r.id]: r for r in run.records}
    assert {f: r.error_type for f, r in got.items()} == expected
    assert got["http500"].error.startswith("HTTP 500:") and "http500" in got["http500"].error
    assert got["http429"].error.startswith("HTTP 429:")
    assert len(got["cut"].token_times_s) == CUT_AFTER
    assert got["trickle"].e2el_s > 4 * TRICKLE_DELAY_S
    assert got["stall"].error and "1 s" in got["stall"].error
    assert "engine died" in got["errorevent"].error
    assert error_rate(run.records) == pytest.approx(7 / 10)
    assert summarize(run.records, run.duration_s)["error_types"] == {
        "stream_cut": 2,
        "http_status": 2,
        "timeout": 1,
        "bad_event": 2,
    }


def test_split_events_and_stale_connection_retry(fresh_fake_server):
    # The second request reuses the first one's connection, which the server then drops
    # without an answer: the client retries once on a new connection.
    wreqs = prompt_requests(["fault:split", "fault:stale"], output_len=3)
    run = run_http(endpoint_options(fresh_fake_server.url), wreqs, [0.0, 0.2])
    assert [r.error_type for r in run.records] == [None, None]
    assert [len(r.token_times_s) for r in run.records] == [3, 3]
    assert len(fresh_fake_server.requests) == 2 and fresh_fake_server.dropped == 1  # reused, dropped, retried


def test_keep_alive_reuses_connections(fresh_fake_server):
    # One request in flight at a time (not spacing in time, which a loaded machine can
    # overlap), so each request finds the previous one's connection idle in the pool.
    before = fresh_fake_server.connections
    n = 10
    opts = endpoint_options(fresh_fake_server.url, max_concurrency=1)
    run = run_http(opts, prompt_requests(["x"] * n), np.arange(n) * 0.001)
    assert all(r.ok for r in run.records)
    assert fresh_fake_server.connections - before == 1


def test_malformed_response_head_is_bad_event(fresh_fake_server):
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests(["fault:badhead", "x"]), [0.0, 0.0])
    assert [r.error_type for r in run.records] == ["bad_event", None]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    with FakeOpenAI(tls=ctx) as s:
        # An untrusted (self-signed) certificate: the handshake fails, a connect error.
        run = run_http(endpoint_options(s.url), prompt_requests(["x"]), [0.0])
        assert s.requests == []
        assert run.records[0].error_type == "connect"
        assert "certificate" in run.records[0].error.lower()
        # Trusted through SSL_CERT_FILE (read when the verifying context is made, so in a new
        # process): the stream goes through.
        code = (
            "import sys; from cbbench.targets.http import EndpointOptions, run_http; "
            "from cbbench.load.workload_types import WorkloadRequest; "
            "w = [WorkloadRequest(0, 2, 3, prompt='hi')]; "
            "r = run_http(EndpointOptions(sys.argv[1], served_model=sys.argv[2]), w, [0.0]"
            ").records[0]; print(r.error_type, r.error, len(r.token_times_s))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, s.url, MODEL],
            env={**os.environ, "SSL_CERT_FILE": str(cert)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout.split() == ["None", "None", "3"], out.stderr[-2000:]
        assert len(s.requests) == 1


def test_connection_refused_is_connect():
    run = run_http(endpoint_options(f"http://127.0.0.1:{free_port()}"), prompt_requests(["x", "y"]), [0.0, 0.0])
    assert_accounted(run, 2)
    assert [r.error_type for r in run.records] == ["connect", "connect"]
    assert summarize(run.records, run.duration_s)["completed"] == 0


def test_dns_failure_is_dns(monkeypatch):
    # No resolver traffic: .invalid names fail inside this process.
    real = socket.getaddrinfo

    def fake_getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    run = run_http(endpoint_options("http://cbbench-test.invalid:8000"), prompt_requests(["x"]), [0.0])
    assert_accounted(run, 1)
    assert run.records[0].error_type == "dns"


# ---- prompts --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> str:
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_synthetic_prompts_exact_with_tokenizer(tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    # (a 1-token prompt, the BOS alone, is refused: test_text_prompt_len.py)
    wreqs = [WorkloadRequest(i, n, 4) for i, n in enumerate([2, 5, 100, 1000])]
    prompts, kinds = build_prompts(wreqs, "completions", seed=3, tokenizer=tok)
    assert kinds == {"synthetic_exact": 4}
    for w, p in zip(wreqs, prompts):
        assert len(tok.encode(p).ids) == w.prompt_len  # BOS + content
    again, _ = build_prompts(wreqs, "completions", seed=3, tokenizer=tok)
    other, _ = build_prompts(wreqs, "completions", seed=4, tokenizer=tok)
    assert again == prompts and other != prompts


@pytest.mark.skipif(not LLAMA3_TOKENIZER.exists(), reason="no Llama-3.1 tokenizer.json in shared/")
def test_synthetic_prompts_exact_with_llama3():
    tok = load_tokenizer(str(LLAMA3_TOKENIZER))
    wreqs = [WorkloadRequest(i, n, 4) for i, n in enumerate([2, 17, 300, 1024])]
    prompts, _ = build_prompts(wreqs, "chat", seed=0, tokenizer=tok)
    assert [len(tok.encode(p).ids) for p in prompts] == [2, 17, 300, 1024]


def test_synthetic_prompts_approx_without_tokenizer():
    p = synthetic_prompt(100, request_id=5, seed=0)
    assert len(p.split()) == 99 and set(p.split()) <= set(WORD_POOL)
    assert p == synthetic_prompt(100, request_id=5, seed=0) != synthetic_prompt(100, 6, 0)


def test_token_id_prompts(fresh_fake_server, tiny_tokenizer):
    ids = (5, 6, 7)
    wreqs = [WorkloadRequest(0, 3, 2, prompt_token_ids=ids)]
    run = run_http(endpoint_options(fresh_fake_server.url), wreqs, [0.0])
    assert fresh_fake_server.requests[0]["body"]["prompt"] == [5, 6, 7]
    assert run.records[0].server_prompt_tokens == 3
    with pytest.raises(UsageError, match="tokenizer"):
        build_prompts(wreqs, "chat", seed=0)
    prompts, kinds = build_prompts(wreqs, "chat", 0, load_tokenizer(tiny_tokenizer))
    assert prompts == [" ".join(WORD_POOL[3:6])] and kinds == {"decoded": 1}
