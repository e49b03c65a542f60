"""The HTTP target against a fake OpenAI-compatible streaming server (raw asyncio HTTP/1.1 in a
background thread, 127.0.0.1 only). A request steers the fake with words in its prompt:
`fault:NAME` picks a behaviour (see FakeOpenAI._stream), `delay:S` the seconds between tokens."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cbbench.analysis.metrics import summarize
from cbbench.errors import UsageError
from cbbench.load.prompts import WORD_POOL, build_prompts, load_tokenizer, synthetic_prompt
from cbbench.load.workload import WorkloadRequest
from cbbench.targets.http import error_rate, run_http, send_lag_check
from cbbench.targets.options import EndpointOptions, normalize_endpoint, parse_header, redact_url

MODEL = "fake-model"
CHAT_TEMPLATE_TOKENS = 7  # what the fake's "chat template" adds to the prompt count
STALL_S = 3.0  # the stall fault's bound: longer than the tests' request timeout
TRICKLE_DELAY_S = 0.1
CUT_AFTER = 2  # tokens sent before the cut fault drops the connection
EOS_AFTER = 3  # the eos fault ignores ignore_eos: it stops ("stop") after this many tokens
LLAMA3_TOKENIZER = (
    Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "llama-3.1" / "tokenizer.json"
)
METRICS_PAGE = """# HELP vllm:num_requests_running Requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="{model}"}} {running}
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{model_name="{model}"}} {prompt_tokens}
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="1.0",model_name="{model}"}} 3
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="{model}"}} 3
vllm:e2e_request_latency_seconds_sum{{model_name="{model}"}} 1.5
vllm:e2e_request_latency_seconds_count{{model_name="{model}"}} 3
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.0
"""


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj) -> bytes:
    return _chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")


def _directives(prompt) -> dict[str, str]:
    if not isinstance(prompt, str):
        return {}
    return dict(w.split(":", 1) for w in prompt.split() if ":" in w)


class FakeOpenAI:
    """An OpenAI-compatible streaming server with fault injection, on 127.0.0.1."""

    def __init__(
        self, metrics: bool = True, tls: ssl.SSLContext | None = None, metrics_page=None
    ):
        self.metrics = metrics
        self.metrics_page = metrics_page  # FakeOpenAI -> page text; None: METRICS_PAGE
        self.ttft_s: list[float] = []  # the server's own TTFT and token gaps, as it saw them
        self.gaps_s: list[float] = []
        self.tls = tls
        self.connections = 0  # TCP connections accepted
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests: list[dict] = []  # {"path", "headers", "body", "t"} per POST
        self.prompt_tokens = 0
        self.dropped = 0  # requests dropped unanswered by the stale fault
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls), self._loop
        )
        self._server = fut.result(timeout=5)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        async def shutdown():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def reset(self) -> None:
        self.max_in_flight = 0
        self.requests.clear()

    # -- HTTP --
    async def _handle(self, reader, writer) -> None:
        self.connections += 1
        served = 0  # requests answered on this connection
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    if k:
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", 0))
                body = await reader.readexactly(n) if n else b""
                if served and b"fault:stale" in body:
                    self.dropped += 1
                    break  # as if the server had just timed out the idle connection
                if not await self._route(method, path, headers, body, writer):
                    break
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _plain(writer, status: str, body: bytes, ctype: str = "application/json") -> None:
        writer.write(
            b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), ctype.encode(), len(body), body)
        )

    async def _route(self, method, path, headers, body, writer) -> bool:
        if method == "GET" and path == "/v1/models":
            self._plain(writer, "200 OK", json.dumps({"data": [{"id": MODEL}]}).encode())
            return True
        if method == "GET" and path == "/metrics":
            if not self.metrics:
                self._plain(writer, "404 Not Found", b"not found", "text/plain")
                return True
            page = self.metrics_page(self) if self.metrics_page else METRICS_PAGE.format(
                model=MODEL, running=self.in_flight, prompt_tokens=self.prompt_tokens
            )
            self._plain(writer, "200 OK", page.encode(), "text/plain; version=0.0.4")
            return True
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            req = json.loads(body)
            self.requests.append(
                {"path": path, "headers": headers, "body": req, "t": time.perf_counter()}
            )
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await self._stream(req, path.endswith("chat/completions"), writer)
            finally:
                self.in_flight -= 1
        self._plain(writer, "404 Not Found", b"{}")
        return True

    async def _stream(self, req: dict, chat: bool, writer) -> bool:
        prompt = req["messages"][0]["content"] if chat else req["prompt"]
        d = _directives(prompt)
        fault = d.get("fault", "ok")
        delay = TRICKLE_DELAY_S if fault == "trickle" else float(d.get("delay", 0))
        if fault == "badhead":  # not an HTTP response at all
            writer.write(b"HTTP/1.1 OK-ish\r\nnonsense\r\n\r\n")
            return False
        if fault in ("http500", "http429"):
            code = "500 Internal Server Error" if fault == "http500" else "429 Too Many Requests"
            self._plain(writer, code, json.dumps({"object": "error", "message": fault}).encode())
            return True
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split()) + 1
        n_prompt += CHAT_TEMPLATE_TOKENS if chat else 0
        self.prompt_tokens += n_prompt
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        if chat:  # vLLM's first chat chunk: the role, no text
            writer.write(
                _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            )
        got, last = time.perf_counter(), None
        n = req["max_tokens"]
        if fault == "eosfirst":  # the first token is EOS: a closing chunk and nothing else
            n = 0
            closing = {"index": 0, "text": "", "finish_reason": "stop"}
            writer.write(_event({"choices": [closing]}))
        if fault == "eos":  # the model "emits EOS" early and the server ignores ignore_eos
            n = min(n, EOS_AFTER)
        # pairs: two tokens per event; glued: one token per event, but the text re-tokenizes
        # to fewer tokens (as a generated sequence that is not its text's own encoding).
        text = {"pairs": " a b", "glued": "a"}.get(fault, " a")
        # emptytok (llama.cpp): every other token's text is empty (inside a multi-byte
        # character), and a closing chunk with empty text carries the finish reason; no usage.
        for i in range(n):
            if delay:
                await asyncio.sleep(delay)
            if fault == "cut" and i == CUT_AFTER:
                writer.close()  # no final chunk: an incomplete body
                return False
            if fault == "stall" and i == 1:
                await asyncio.sleep(STALL_S)
            if fault == "malformed" and i == 1:
                writer.write(_chunk(b"data: {not json\n\n"))
                continue
            if fault == "errorevent" and i == 1:
                writer.write(_event({"error": {"message": "engine died", "code": 500}}))
                continue
            if fault == "emptytok":
                piece = "" if i % 2 else text
                choice = (
                    {"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                    else {"index": 0, "text": piece, "finish_reason": None}
                )
                writer.write(_event({"choices": [choice]}))
                continue
            finish = None
            if i == n - 1 and fault != "nodone":
                finish = "stop" if fault == "eos" and n < req["max_tokens"] else "length"
            choice = (
                {"index": 0, "delta": {"content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            if fault == "split":  # CRLF lines, each event cut across two HTTP chunks
                raw = b"data: " + json.dumps({"choices": [choice]}).encode() + b"\r\n\r\n"
                writer.write(_chunk(raw[:9]))
                await writer.drain()
                await asyncio.sleep(0.005)
                writer.write(_chunk(raw[9:]))
                continue
            writer.write(_event({"choices": [choice]}))
            await writer.drain()
            now = time.perf_counter()
            if last is None:
                self.ttft_s.append(now - got)
            else:
                self.gaps_s.append(now - last)
            last = now
        if fault == "emptytok":
            closing = (
                {"index": 0, "delta": {"content": ""}, "finish_reason": "length"} if chat
                else {"index": 0, "text": "", "finish_reason": "length"}
            )
            writer.write(_event({"choices": [closing]}))
        if fault not in ("nousage", "pairs", "glued", "emptytok"):
            usage = {
                "prompt_tokens": n_prompt,
                "completion_tokens": n,
                "total_tokens": n_prompt + n,
            }
            writer.write(_event({"choices": [], "usage": usage}))
        if fault != "nodone":  # nodone: a clean end of the body, but no [DONE] nor finish
            writer.write(_chunk(b"data: [DONE]\n\n"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


@pytest.fixture(scope="module")
def server():
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def fresh(server):
    server.reset()
    return server


def _reqs(prompts, output_len=4) -> list[WorkloadRequest]:
    return [
        WorkloadRequest(i, len(p.split()) + 1, output_len, prompt=p) for i, p in enumerate(prompts)
    ]


def _opts(url: str, **kw) -> EndpointOptions:
    kw.setdefault("served_model", MODEL)
    return EndpointOptions(endpoint=url, **kw)


def _accounted(run, n: int) -> None:
    sent = len(run.records)
    assert sent + run.not_sent == n
    ok = sum(r.ok for r in run.records)
    failed = sum(r.error is not None for r in run.records)
    assert ok + failed == sent
    summary = summarize(run.records, run.duration_s)
    assert summary["completed"] == ok and summary["failed"] == failed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- streaming and counting -----------------------------------------------------------------
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_stream_counts_tokens(fresh, api):
    wreqs = _reqs([f"hello world {i}" for i in range(6)], output_len=5)
    run = run_http(_opts(fresh.url, api=api), wreqs, np.zeros(6), notice=print)
    _accounted(run, 6)
    assert all(r.ok for r in run.records)
    for r in run.records:
        assert r.output_tokens == 5 and len(r.token_times_s) == 5
        assert r.token_times_s == sorted(r.token_times_s) and r.token_times_s[0] >= r.send_s
        extra = CHAT_TEMPLATE_TOKENS if api == "chat" else 0
        assert r.server_prompt_tokens == r.prompt_tokens + extra
    assert run.info["token_count_method"] == {"usage": 6}
    assert run.info["prompt_tokens_mismatch"]["mean_abs_diff"] == (7.0 if api == "chat" else 0.0)
    body = fresh.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5 and body["temperature"] == 0 and body["ignore_eos"] is True
    assert body["model"] == MODEL
    if api == "chat":
        assert fresh.requests[0]["path"] == "/v1/chat/completions"
        assert body["messages"][0]["role"] == "user"
    else:
        assert fresh.requests[0]["path"] == "/v1/completions"
        assert body["prompt"].startswith("hello world")


def test_served_model_discovery_and_no_ignore_eos(fresh):
    opts = EndpointOptions(endpoint=fresh.url + "/v1/", ignore_eos_field=False)
    run = run_http(opts, _reqs(["x"]), [0.0], notice=print)
    assert run.info["served_model"] == MODEL
    assert opts.to_config(run.info["served_model"])["served_model"] == MODEL
    body = fresh.requests[0]["body"]
    assert body["model"] == MODEL and "ignore_eos" not in body


def test_discovery_failure_is_usage_error():
    with pytest.raises(UsageError, match="served-model"):
        run_http(EndpointOptions(f"http://127.0.0.1:{_free_port()}"), _reqs(["x"]), [0.0], print)


def test_header_sent_but_not_in_config(fresh, monkeypatch):
    monkeypatch.setenv("CBBENCH_TEST_KEY", "Bearer sk-secret")
    key, value = parse_header("Authorization=env:CBBENCH_TEST_KEY")
    opts = _opts(fresh.url, headers={key: value, "X-Team": "bench"})
    run_http(opts, _reqs(["x"]), [0.0], notice=print)
    assert fresh.requests[0]["headers"]["authorization"] == "Bearer sk-secret"
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
        EndpointOptions("http://h", api="embeddings").validate()


def test_server_ignoring_ignore_eos_is_counted_and_warned(fresh):
    # 6 requests for 8 tokens; the 4 "eos" ones come back with EOS_AFTER, finish_reason stop.
    prompts = ["fault:eos x"] * 4 + ["x"] * 2
    notes: list[str] = []
    run = run_http(_opts(fresh.url), _reqs(prompts, output_len=8), np.zeros(6), notes.append)
    assert all(r.ok for r in run.records) and all(r.max_tokens == 8 for r in run.records)
    assert [r.output_tokens for r in run.records] == [EOS_AFTER] * 4 + [8, 8]
    assert [r.finish_reason for r in run.records] == ["stop"] * 4 + ["length"] * 2
    short = summarize(run.records, run.duration_s)["short_outputs"]
    assert (short["count"], short["checked"], short["finish_reason_stop"]) == (4, 6, 4)
    assert short["share"] == pytest.approx(4 / 6)
    assert short["mean_shortfall"] == pytest.approx(8 - EOS_AFTER)
    warned = [n for n in notes if "max_tokens" in n]
    assert len(warned) == 1 and "ignore_eos" in warned[0] and "--no-ignore-eos-field" in warned[0]
    assert "4 of 6" in warned[0]

    # A full-length run: short_outputs is 0 and nothing is said.
    notes.clear()
    run = run_http(_opts(fresh.url), _reqs(["x"] * 3, output_len=5), np.zeros(3), notes.append)
    assert summarize(run.records, run.duration_s)["short_outputs"]["count"] == 0
    assert notes == []


def test_no_usage_names_the_method_and_warns_when_counts_disagree(fresh, tiny_tokenizer):
    # glued: one token per event, no usage; the streamed text re-tokenizes to 1 token ("aaaa"
    # is one unknown word). Events are detected as single tokens (each event's text alone is one
    # token), so events are the count, and the tokenizer's disagreement is reported.
    notes: list[str] = []
    opts = _opts(fresh.url, tokenizer=tiny_tokenizer)
    run = run_http(opts, _reqs(["fault:glued x"] * 4, output_len=4), np.zeros(4), notes.append)
    for r in run.records:
        assert r.output_tokens_method == "events" and r.output_tokens == 4
        # one_token_events: this request's events that are one token each, tokenized alone
        assert r.output_token_counts == {"events": 4, "tokenizer": 1, "one_token_events": 4}
    counts = run.info["token_counts"]
    assert counts["output_method"] == {"events": 4}
    assert counts["one_token_per_event"]["detected"] is True
    assert counts["one_token_per_event"]["basis"] == "tokenizer"
    assert counts["disagreement"]["tokenizer_vs_events"]["disagree"] == 4
    assert counts["prompt_method"] == {"usage": 0, "workload": 4}
    warned = [n for n in notes if "disagree" in n]
    assert len(warned) == 1 and "tokenizer vs events differ on 4 of 4" in warned[0]

    # pairs: two tokens per event, no usage: the tokenizer is the count, and it disagrees too.
    notes.clear()
    run = run_http(opts, _reqs(["fault:pairs x"] * 2, output_len=3), np.zeros(2), notes.append)
    assert [(r.output_tokens_method, r.output_tokens) for r in run.records] == [("tokenizer", 6)] * 2
    assert run.info["token_counts"]["one_token_per_event"]["detected"] is False
    assert any("tokenizer vs events differ on 2 of 2" in n for n in notes)

    # No usage and no tokenizer: events, flagged as unverified.
    notes.clear()
    run = run_http(_opts(fresh.url), _reqs(["fault:nousage x"] * 2), np.zeros(2), notes.append)
    assert [r.output_tokens_method for r in run.records] == ["events"] * 2
    assert any("--tokenizer" in n and "stream events" in n for n in notes)

    # With usage, it is the count; the events agree, which shows one token per event.
    notes.clear()
    run = run_http(opts, _reqs(["x"] * 3, output_len=4), np.zeros(3), notes.append)
    assert [r.output_tokens_method for r in run.records] == ["usage"] * 3
    assert run.records[0].output_token_counts == {
        "events": 4, "usage": 4, "tokenizer": 4, "one_token_events": 4,
    }
    assert run.info["token_counts"]["one_token_per_event"] == {
        "detected": True, "basis": "usage", "share": 1.0, "checked": 3,
    }
    assert notes == []


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_empty_text_events_are_tokens_but_not_token_times(fresh, api):
    # 6 tokens, of which 3 have empty text, then an empty closing chunk with the finish reason.
    notes: list[str] = []
    run = run_http(_opts(fresh.url, api=api), _reqs(["fault:emptytok x"] * 2, output_len=6),
                   np.zeros(2), notes.append)
    for r in run.records:
        assert r.ok and r.output_tokens == 6 and r.output_tokens_method == "events"
        assert len(r.token_times_s) == 3 and r.finish_reason == "length"
    assert summarize(run.records, run.duration_s)["short_outputs"]["count"] == 0
    assert not [n for n in notes if "max_tokens" in n]


def test_no_output_at_all_says_why(fresh):
    run = run_http(_opts(fresh.url), _reqs(["fault:eosfirst x"]), [0.0], print)
    rec = run.records[0]
    assert rec.error_type == "bad_event" and "finish_reason 'stop'" in rec.error


def test_short_counts_at_finish_length_are_called_a_counting_problem():
    from cbbench.analysis.records import RequestRecord
    from cbbench.analysis.token_counts import short_output_warning, short_outputs

    def rec(out: int, finish: str) -> RequestRecord:
        return RequestRecord(0, 5, out, 0.0, token_times_s=[0.1, 0.2], max_tokens=10,
                             finish_reason=finish)

    so = short_outputs([rec(9, "length"), rec(10, "length")])
    assert (so["count"], so["finish_reason_length"], so["finish_reason_stop"]) == (1, 1, 0)
    line = short_output_warning(so, ignore_eos_sent=True)
    assert "counted shorter" in line and "ignore_eos" not in line
    so = short_outputs([rec(4, "stop"), rec(10, "length")])
    assert "ignore_eos" in short_output_warning(so, ignore_eos_sent=True)
    assert "--no-ignore-eos-field" in short_output_warning(so, ignore_eos_sent=False)
    assert short_output_warning(short_outputs([rec(10, "length")] * 3), True) is None


def test_chat_without_usage_warns_about_template_tokens(fresh):
    notes: list[str] = []
    run_http(_opts(fresh.url, api="chat"), _reqs(["fault:nousage x"]), [0.0], notes.append)
    assert any("chat template" in n for n in notes)


def test_token_count_fallbacks(fresh, tiny_tokenizer):
    wreqs = _reqs(["fault:nousage", "fault:pairs"], output_len=3)
    run = run_http(_opts(fresh.url), wreqs, [0.0, 0.0], notice=print)
    assert [r.output_tokens for r in run.records] == [3, 3]  # events
    assert run.info["token_count_method"] == {"events": 2}
    run = run_http(_opts(fresh.url, tokenizer=tiny_tokenizer), wreqs, [0.0, 0.0], notice=print)
    assert [r.output_tokens for r in run.records] == [3, 6]  # " a b" per event is 2 tokens
    assert run.info["token_count_method"] == {"tokenizer": 2}


# ---- schedule and concurrency ---------------------------------------------------------------
def test_arrival_schedule_honored(fresh):
    n = 25
    arrivals = np.arange(n) * 0.02  # 50 requests/s for 0.5 s
    progress: list[tuple[int, int]] = []
    run = run_http(
        _opts(fresh.url),
        _reqs(["x"] * n),
        arrivals,
        print,
        on_progress=lambda *a: progress.append(a),
    )
    _accounted(run, n)
    assert progress[-1] == (n, n) and len(progress) < n  # throttled, ends complete
    lags = np.array([r.send_s - r.intended_start_s for r in run.records])
    assert (lags >= 0).all()
    assert np.median(lags) < 0.005 and lags.max() < 0.05
    assert not run.info["client_fell_behind"]
    assert [r.intended_start_s for r in run.records] == pytest.approx(arrivals.tolist())
    server_t = np.array([q["t"] for q in fresh.requests])
    assert np.median(np.diff(server_t)) > 0.015  # spread out, not sent in a burst
    assert run.duration_s >= arrivals[-1]


def test_max_concurrency_caps_in_flight(fresh):
    n, cap = 12, 3
    wreqs = _reqs(["delay:0.03"] * n, output_len=3)
    run = run_http(_opts(fresh.url, max_concurrency=cap), wreqs, np.zeros(n), notice=print)
    _accounted(run, n)
    assert all(r.ok for r in run.records)
    assert fresh.max_in_flight == cap and run.info["max_in_flight"] == cap
    queued = sorted(r.first_scheduled_s for r in run.records)
    assert queued[-1] > 0.15  # the last wave waited for three earlier ones (~0.09 s each)
    assert not run.info["client_fell_behind"]  # the wait for a slot is not client lag


def test_client_fell_behind_warns(fresh):
    notes: list[str] = []
    blocked = []

    def block_loop(done, total):  # stalls the client's event loop once
        if not blocked:
            blocked.append(1)
            time.sleep(0.3)

    n = 20
    run = run_http(
        _opts(fresh.url),
        _reqs(["x"] * n),
        np.arange(n) * 0.005,
        notes.append,
        on_progress=block_loop,
    )
    assert run.info["client_fell_behind"] and run.info["send_lag_p50_ms"] > 10
    # One fell-behind warning (a slow machine may add the event-loop-lag one: the same stall).
    assert sum("fell behind" in n for n in notes) == 1
    assert send_lag_check([0.5] * 95 + [150] * 5)["client_fell_behind"]
    assert not send_lag_check([0.5] * 100)["client_fell_behind"]


def test_should_stop_lets_in_flight_requests_finish_within_the_grace_period(fresh):
    arrivals = [0.0, 0.05, 0.1] + [5.0 + i for i in range(7)]
    wreqs = _reqs(["delay:0.05"] * 10, output_len=10)
    t = time.perf_counter()
    run = run_http(
        _opts(fresh.url), wreqs, arrivals, print,
        should_stop=lambda: time.perf_counter() - t > 0.2, grace_s=5.0,
    )
    assert time.perf_counter() - t < 4.0  # the 7 later arrivals were never sent
    assert run.interrupted and run.not_sent == 7 and len(run.records) == 3
    assert all(r.error is None and r.output_tokens == 10 for r in run.records)
    _accounted(run, 10)


def test_should_stop_cancels_what_the_grace_period_does_not_cover(fresh):
    arrivals = [0.0, 0.05, 0.1] + [5.0 + i for i in range(7)]
    wreqs = _reqs(["delay:0.2"] * 10, output_len=10)
    t = time.perf_counter()
    run = run_http(
        _opts(fresh.url), wreqs, arrivals, print,
        should_stop=lambda: time.perf_counter() - t > 0.4, grace_s=0.0,
    )
    assert time.perf_counter() - t < 2.0
    assert run.interrupted and run.not_sent == 7 and len(run.records) == 3
    assert {r.error_type for r in run.records} == {"interrupted"}
    assert all(len(r.token_times_s) >= 1 for r in run.records)
    _accounted(run, 10)


# ---- failures -------------------------------------------------------------------------------
def test_faults_are_recorded_per_request(fresh):
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
    wreqs = _reqs([f"fault:{f} please" for f in names], output_len=5)
    t = time.perf_counter()
    run = run_http(_opts(fresh.url, request_timeout_s=1.0), wreqs, np.zeros(len(names)), print)
    assert time.perf_counter() - t < STALL_S  # the timeout cut the stall short
    _accounted(run, len(names))
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


def test_split_events_and_stale_connection_retry(fresh):
    # The second request reuses the first one's connection, which the server then drops
    # without an answer: the client retries once on a new connection.
    wreqs = _reqs(["fault:split", "fault:stale"], output_len=3)
    run = run_http(_opts(fresh.url), wreqs, [0.0, 0.2], print)
    assert [r.error_type for r in run.records] == [None, None]
    assert [len(r.token_times_s) for r in run.records] == [3, 3]
    assert len(fresh.requests) == 2 and fresh.dropped == 1  # reused, dropped, retried


def test_keep_alive_reuses_connections(fresh):
    # Spaced out, so each request finds the previous one's connection idle in the pool.
    before = fresh.connections
    n = 10
    run = run_http(_opts(fresh.url), _reqs(["x"] * n), np.arange(n) * 0.03, print)
    assert all(r.ok for r in run.records)
    assert fresh.connections - before == 1


def test_malformed_response_head_is_bad_event(fresh):
    run = run_http(_opts(fresh.url), _reqs(["fault:badhead", "x"]), [0.0, 0.0], print)
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
        run = run_http(_opts(s.url), _reqs(["x"]), [0.0], print)
        assert s.requests == []
        assert run.records[0].error_type == "connect"
        assert "certificate" in run.records[0].error.lower()
        # Trusted through SSL_CERT_FILE (read when the verifying context is made, so in a new
        # process): the stream goes through.
        code = (
            "import sys; from cbbench.targets.http import EndpointOptions, run_http; "
            "from cbbench.load.workload import WorkloadRequest; "
            "w = [WorkloadRequest(0, 2, 3, prompt='hi')]; "
            "r = run_http(EndpointOptions(sys.argv[1], served_model=sys.argv[2]), w, [0.0], "
            "lambda m: None).records[0]; print(r.error_type, r.error, len(r.token_times_s))"
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
    run = run_http(_opts(f"http://127.0.0.1:{_free_port()}"), _reqs(["x", "y"]), [0.0, 0.0], print)
    _accounted(run, 2)
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
    run = run_http(_opts("http://cbbench-test.invalid:8000"), _reqs(["x"]), [0.0], print)
    _accounted(run, 1)
    assert run.records[0].error_type == "dns"


# ---- server metrics -------------------------------------------------------------------------
def test_scrape_metrics(fresh):
    n = 8
    run = run_http(
        _opts(fresh.url, scrape_metrics=True), _reqs(["delay:0.02"] * n), np.arange(n) * 0.15, print
    )
    rows = run.info["server_metrics"]
    names = {r["name"] for r in rows}
    assert names == {"vllm:num_requests_running", "vllm:prompt_tokens_total"}
    times = sorted({r["t_s"] for r in rows})
    assert len(times) >= 3 and times[0] < 0.1
    assert rows[0]["labels"] == {"model_name": MODEL}
    assert run.info["server_metrics_scrapes"]["failed"] == 0


def test_scrape_failure_is_not_fatal_and_said_once():
    notes: list[str] = []
    with FakeOpenAI(metrics=False) as s:
        run = run_http(
            _opts(s.url, scrape_metrics=True), _reqs(["x"] * 3), [0.0, 0.3, 0.6], notes.append
        )
    assert all(r.ok for r in run.records)
    scrapes = run.info["server_metrics_scrapes"]
    assert scrapes["failed"] >= 1 and "HTTP 404" in scrapes["errors"][0]
    assert run.info["server_metrics"] == []
    said = [n for n in notes if "metrics" in n]  # (a loaded machine may add a send-lag line)
    assert len(said) == 1 and "GET /metrics failed" in said[0] and "HTTP 404" in said[0]


HIST_BUCKETS = (0.025, 0.05, 0.5, 1.0)


def _histogram(name: str, values: list[float]) -> str:
    lines = [f"# TYPE {name} histogram"]
    for le in (*HIST_BUCKETS, float("inf")):
        n = sum(v <= le for v in values)
        lines.append(f'{name}_bucket{{le="{"+Inf" if le == float("inf") else le}",model_name="m"}} {n}')
    lines.append(f'{name}_sum{{model_name="m"}} {sum(values)}')
    lines.append(f'{name}_count{{model_name="m"}} {len(values)}')
    return "\n".join(lines) + "\n"


def vllm_histograms_page(fake: FakeOpenAI) -> str:
    """vLLM's TTFT and (older name) per-token latency histograms, from what the fake saw."""
    return _histogram("vllm:time_to_first_token_seconds", fake.ttft_s) + _histogram(
        "vllm:time_per_output_token_seconds", fake.gaps_s
    )


def test_server_side_ttft_from_vllm_histograms():
    with FakeOpenAI(metrics_page=vllm_histograms_page) as s:
        # Earlier traffic (TTFT ~1 ms: the first buckets) is in the histograms before the run.
        run_http(_opts(s.url), _reqs(["x"] * 3, output_len=2), np.zeros(3), print)
        before = len(s.ttft_s)
        # The run: TTFT and token gaps of 60 ms, all in the (50, 500] ms bucket, so the
        # interpolated p50 is its middle, 275 ms, and the mean is the fake's own mean.
        n = 4
        run = run_http(
            _opts(s.url, scrape_metrics=True), _reqs(["delay:0.06"] * n, output_len=3),
            np.arange(n) * 0.01, print,
        )
        ours = s.ttft_s[before:]
    assert all(0.05 < t <= 0.5 for t in ours) and len(ours) == n
    assert all(t <= 0.05 for t in s.ttft_s[:before])
    lat = run.info["server_latency"]
    ttft = lat["ttft_ms"]
    assert ttft["histogram"] == "vllm:time_to_first_token_seconds"
    assert ttft["observations"] == n  # the run's requests only: the difference of two scrapes
    assert ttft["server_p50"] == pytest.approx(275.0)
    assert ttft["server_mean"] == pytest.approx(1000 * sum(ours) / n, rel=1e-6)
    client = [r.ttft_from_send_s * 1000 for r in run.records]
    assert ttft["client_p50"] == pytest.approx(float(np.percentile(client, 50)))
    assert ttft["diff_p50"] == pytest.approx(ttft["client_p50"] - 275.0)
    assert ttft["client_p50"] >= 60.0  # the client cannot see the first token before the server sent it
    assert ttft["server_p50_bucket"] == [50.0, 500.0] and ttft["client_within_bucket"]
    itl = lat["itl_ms"]
    assert itl["histogram"] == "vllm:time_per_output_token_seconds"
    assert itl["observations"] == n * 2 and itl["server_p50"] == pytest.approx(275.0)
    assert "tpot_ms" not in lat and "e2el_ms" not in lat  # not exposed: not reported


def test_histogram_quantile_by_hand():
    from cbbench.analysis.server_latency import histogram_quantile, quantile_bucket

    inf = float("inf")
    # 10 observations: 2 <= 0.1, 8 more <= 0.2. p50 rank 5: 0.1 + 0.1 * (5 - 2) / 8.
    assert histogram_quantile(0.5, {0.1: 2, 0.2: 10, inf: 10}) == pytest.approx(0.1375)
    assert histogram_quantile(0.5, {0.1: 0, 0.2: 0, inf: 4}) == 0.2  # beyond the last bound
    assert histogram_quantile(0.1, {0.1: 4, inf: 4}) == pytest.approx(0.01)  # from 0: 0.1 * 0.4 / 4
    assert histogram_quantile(0.5, {0.1: 0, inf: 0}) is None
    assert quantile_bucket(0.5, {0.1: 2, 0.2: 10, inf: 10}) == (0.1, 0.2)
    assert quantile_bucket(0.5, {0.1: 0, 0.2: 0, inf: 4}) == (0.2, inf)


LLAMACPP_PAGE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 41
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 2
# TYPE tgi_queue_size gauge
tgi_queue_size 0
# TYPE process_open_fds gauge
process_open_fds 12
"""


def test_scrape_keeps_llamacpp_sglang_and_tgi_names():
    with FakeOpenAI(metrics_page=lambda fake: LLAMACPP_PAGE) as s:
        notes: list[str] = []
        run = run_http(_opts(s.url, scrape_metrics=True), _reqs(["x"] * 2), [0.0, 0.3], notes.append)
        names = {r["name"] for r in run.info["server_metrics"]}
        assert names == {
            "llamacpp:prompt_tokens_total", "llamacpp:requests_processing",
            "sglang:num_running_reqs", "tgi_queue_size",
        }
        assert not [n for n in notes if "metrics" in n] and "server_latency" not in run.info
        # A filter keeps what it finds instead.
        run = run_http(
            _opts(s.url, scrape_metrics=True, scrape_metrics_filter=r"^process_|prompt_tokens_total$"),
            _reqs(["x"]), [0.0], notes.append,
        )
        names = {r["name"] for r in run.info["server_metrics"]}
        assert names == {"process_open_fds", "llamacpp:prompt_tokens_total"}
        # A filter that finds nothing: one warning line, naming the filter.
        run = run_http(
            _opts(s.url, scrape_metrics=True, scrape_metrics_filter="^nothing_here"),
            _reqs(["x"]), [0.0], notes.append,
        )
    said = [n for n in notes if "metrics" in n]
    assert run.info["server_metrics"] == [] and len(said) == 1
    assert "no metric matched" in said[0] and "^nothing_here" in said[0]


def test_bad_scrape_filter_is_a_usage_error():
    with pytest.raises(UsageError, match="--scrape-metrics-filter"):
        EndpointOptions("http://h", scrape_metrics_filter="(unclosed").validate()


# ---- prompts --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> str:
    """A word-level tokenizer over the prompt pool that adds a BOS, like Llama-3's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORD_POOL)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_synthetic_prompts_exact_with_tokenizer(tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    wreqs = [WorkloadRequest(i, n, 4) for i, n in enumerate([1, 2, 5, 100, 1000])]
    prompts, kinds = build_prompts(wreqs, "completions", seed=3, tokenizer=tok)
    assert kinds == {"synthetic_exact": 5}
    for w, p in zip(wreqs, prompts):
        assert len(tok.encode(p).ids) == max(2, w.prompt_len)  # BOS + content (>= 1 word)
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


def test_token_id_prompts(fresh, tiny_tokenizer):
    ids = (5, 6, 7)
    wreqs = [WorkloadRequest(0, 3, 2, prompt_token_ids=ids)]
    run = run_http(_opts(fresh.url), wreqs, [0.0], print)
    assert fresh.requests[0]["body"]["prompt"] == [5, 6, 7]
    assert run.records[0].server_prompt_tokens == 3
    with pytest.raises(UsageError, match="tokenizer"):
        build_prompts(wreqs, "chat", seed=0)
    prompts, kinds = build_prompts(wreqs, "chat", 0, load_tokenizer(tiny_tokenizer))
    assert prompts == [" ".join(WORD_POOL[3:6])] and kinds == {"decoded": 1}
