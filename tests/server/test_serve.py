"""`cbbench serve`: the OpenAI-compatible server in front of the simulated engine.

The server runs in-process (uvicorn in a thread, on a free 127.0.0.1 port) with the sim engine
on the wall clock; a 2 ms per-iteration overhead keeps token gaps well above scheduling noise.
Every network loop here is bounded in count and time.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time

import httpx
import pytest
from helpers import (
    POLL_S,
    SERVE_BLOCK_SIZE,
    SERVE_CONTEXT,
    SERVE_KV_BLOCKS,
    SERVE_MODEL,
    SERVE_OVERHEAD_US,
    START_TIMEOUT_S,
    serve_app,
    sim_options,
    start_server,
)

from cbbench.cli.serve import build_serving_engine
from cbbench.errors import UsageError
from cbbench.load.prompts import load_tokenizer
from cbbench.server.app import ServeConfig
from cbbench.server.protocol import ChatMessage, render_chat
from cbbench.server.text import SIM_TOKEN_TEXT, HashedWordCodec, TokenizerCodec

# The small simulated engine every test here serves (tests/helpers.py).
MODEL = SERVE_MODEL
CONTEXT = SERVE_CONTEXT
KV_BLOCKS = SERVE_KV_BLOCKS
BLOCK_SIZE = SERVE_BLOCK_SIZE
OVERHEAD_US = SERVE_OVERHEAD_US


@pytest.fixture(scope="module")
def srv():
    run = start_server(lambda: build_serving_engine(sim_options()))
    yield run
    run.stop()


@pytest.fixture()
def client(srv):
    with httpx.Client(base_url=srv.url, timeout=30.0) as c:
        yield c


def sse_events(lines) -> list:
    """Parsed `data:` payloads of an SSE stream, [DONE] as the string."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def wait_idle(engine, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    snap = engine.snapshot()
    while time.monotonic() < deadline:
        snap = engine.snapshot()
        if snap.kv_blocks_used == 0 and snap.running == 0 and snap.waiting == 0:
            break
        time.sleep(POLL_S)
    return snap


def metric_value(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# ---- lifecycle ---------------------------------------------------------------------------------
def test_health_is_503_until_the_engine_is_ready():
    gate = threading.Event()

    def slow_build():
        assert gate.wait(START_TIMEOUT_S)
        return build_serving_engine(sim_options())

    run = start_server(slow_build, ServeConfig(served_model_name="bench-model"), wait_ready=False)
    try:
        with httpx.Client(base_url=run.url, timeout=10.0) as c:
            r = c.get("/health")
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "engine_not_ready"
            r = c.post("/v1/completions", json={"prompt": "hi"})
            assert r.status_code == 503
            gate.set()
            assert run.engine.wait_ready(START_TIMEOUT_S)
            assert c.get("/health").status_code == 200
            assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["bench-model"]
            r = c.post("/v1/completions", json={"model": "bench-model", "prompt": "hi"})
            assert r.json()["usage"]["completion_tokens"] == 16  # the documented default
    finally:
        gate.set()
        run.stop()


def test_engine_build_failure_is_503_with_the_reason():
    def bad_build():
        raise UsageError("unknown GPU 'nope'")

    run = start_server(bad_build, wait_ready=False)
    try:
        assert not run.engine.wait_ready(START_TIMEOUT_S)
        with httpx.Client(base_url=run.url, timeout=10.0) as c:
            r = c.get("/health")
            assert r.status_code == 503
            assert "unknown GPU" in r.json()["error"]["message"]
    finally:
        run.stop()


def test_engine_failure_mid_run_fails_requests_and_health():
    def build():
        engine, info = build_serving_engine(sim_options())

        def broken_step():
            raise RuntimeError("kaboom")

        engine.step = broken_step
        return engine, info

    run = start_server(build)
    try:
        with httpx.Client(base_url=run.url, timeout=10.0) as c:
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
            assert r.status_code == 503
            assert "kaboom" in r.json()["error"]["message"]
            assert c.get("/health").status_code == 503
            r = c.post("/v1/completions", json={"prompt": "hi", "stream": True})
            assert r.status_code == 503
    finally:
        run.stop()


def test_models_lists_the_served_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == CONTEXT


# ---- completions and chat ----------------------------------------------------------------------
def test_completion_non_streaming(client):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "one two three", "max_tokens": 7})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] == SIM_TOKEN_TEXT * 7
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}


def test_completion_streaming_with_usage(client):
    req = {
        "prompt": "a b c d", "max_tokens": 12, "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/completions", json=req) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    tokens = events[:-2]
    assert len(tokens) == 12
    assert all(e["choices"][0]["text"] == SIM_TOKEN_TEXT for e in tokens)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 11 + ["length"]


def test_completion_prompt_as_token_ids(client):
    r = client.post("/v1/completions", json={"prompt": list(range(100, 133)), "max_tokens": 2})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 33
    r = client.post("/v1/completions", json={"prompt": [[5, 6, 7]], "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens"] == 3


def test_streaming_without_usage_has_no_usage_chunk(client):
    req = {"prompt": "x", "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/completions", json=req) as r:
        events = sse_events(r.iter_lines())
    assert len(events) == 4 and events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])


def test_chat_non_streaming_and_max_completion_tokens(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    r = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": msgs, "max_tokens": 50, "max_completion_tokens": 5},
    )
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": SIM_TOKEN_TEXT * 5,
                                           "refusal": None}
    # The documented template, one token per word without a tokenizer.
    prompt = render_chat([ChatMessage(**m) for m in msgs])
    assert body["usage"]["prompt_tokens"] == len(prompt.split())
    assert body["usage"]["completion_tokens"] == 5


def test_chat_streaming_with_usage(client):
    req = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi you"}]}],
        "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [e["choices"][0]["delta"]["content"] for e in events[1:-2]]
    assert deltas == [SIM_TOKEN_TEXT] * 6
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("options", [
    {"continuous_usage_stats": True},
    {"include_usage": True, "continuous_usage_stats": True},
    {"include_usage": True},
], ids=["continuous-alone", "both", "include-alone"])
def test_continuous_usage_follows_vllms_rule(client, path, options):
    """vLLM's should_include_usage: per-chunk usage only when include_usage AND
    continuous_usage_stats, and then on chat's opening role chunk too (completion_tokens 0);
    continuous_usage_stats alone is ignored."""
    body = ({"messages": [{"role": "user", "content": "hi you"}]} if "chat" in path
            else {"prompt": "hi you"})
    req = {**body, "max_tokens": 3, "stream": True, "stream_options": options}
    with client.stream("POST", path, json=req) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    continuous = options.get("include_usage", False) and options.get("continuous_usage_stats")
    running = [e.get("usage") for e in chunks]
    if continuous:
        want = ([0] if "chat" in path else []) + [1, 2, 3]
        assert [u["completion_tokens"] for u in running] == want
        prompt = running[0]["prompt_tokens"]
        assert prompt == (4 if "chat" in path else 2)  # the template's 2 around chat's words
        assert all(u["prompt_tokens"] == prompt and
                   u["total_tokens"] == prompt + u["completion_tokens"] for u in running)
    else:
        assert running == [None] * len(chunks)
    final = [e for e in events[:-1] if not e["choices"]]
    assert len(final) == (1 if options.get("include_usage") else 0)


def test_openai_sdk_streams_completions_and_chat(srv):
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30.0)
    try:
        assert [m.id for m in sdk.models.list()] == [MODEL]
        text, usage = [], None
        for chunk in sdk.completions.create(
            model=MODEL, prompt="the quick brown fox", max_tokens=9, stream=True,
            stream_options={"include_usage": True},
        ):
            if chunk.choices:
                text.append(chunk.choices[0].text)
            if chunk.usage is not None:
                usage = chunk.usage
        assert "".join(text) == SIM_TOKEN_TEXT * 9
        assert (usage.prompt_tokens, usage.completion_tokens) == (4, 9)

        parts, usage, finish = [], None, None
        for chunk in sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8,
            stream=True, stream_options={"include_usage": True},
        ):
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert "".join(parts) == SIM_TOKEN_TEXT * 8
        assert finish == "length"
        assert usage.completion_tokens == 8

        resp = sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_completion_tokens=3
        )
        assert resp.choices[0].message.content == SIM_TOKEN_TEXT * 3
        with pytest.raises(openai.NotFoundError):
            sdk.completions.create(model="gpt-nope", prompt="x", max_tokens=1)
        with pytest.raises(openai.BadRequestError):
            sdk.completions.create(model=MODEL, prompt="x", max_tokens=10 * CONTEXT)
    finally:
        sdk.close()


# ---- bad input: OpenAI-style 400s (and a 404 for an unknown model) -----------------------------
BAD_REQUESTS = [
    ("malformed-json", "/v1/completions", b'{"prompt": "x",', 400, None),
    ("not-an-object", "/v1/completions", b"[1, 2, 3]", 400, None),
    ("missing-prompt", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("missing-messages", "/v1/chat/completions", {"max_tokens": 3}, 400, "messages"),
    ("empty-messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("negative-max-tokens", "/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("zero-max-tokens", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("max-tokens-beyond-context", "/v1/completions", {"prompt": "x", "max_tokens": CONTEXT}, 400, None),
    ("prompt-beyond-context", "/v1/completions", {"prompt": "w " * (CONTEXT + 10)}, 400, None),
    ("prompt-beyond-kv-pool", "/v1/completions",
     {"prompt": "w " * (KV_BLOCKS * BLOCK_SIZE + 100), "max_tokens": 1}, 400, None),
    ("empty-prompt", "/v1/completions", {"prompt": ""}, 400, None),
    ("token-id-outside-vocab", "/v1/completions", {"prompt": [1, 10**9]}, 400, "prompt"),
    ("bad-temperature-type", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400,
     "temperature"),
    ("top-p-zero", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("n-2", "/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("stop", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "stop": ["\n"]}, 400, "stop"),
    ("batch-of-prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    # Fields that change the output: a 400 naming them, not dropped (protocol.py's promise).
    ("logit-bias", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}}, 400,
     "logit_bias"),
    ("logit-bias-completions", "/v1/completions", {"prompt": "x", "logit_bias": {"5": -100}},
     400, "logit_bias"),
    ("min-tokens-above-max-tokens", "/v1/completions",
     {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ("negative-min-tokens", "/v1/completions", {"prompt": "x", "min_tokens": -1}, 400,
     "min_tokens"),
    ("stop-token-ids-not-ids", "/v1/completions", {"prompt": "x", "stop_token_ids": ["a"]},
     400, "stop_token_ids.0"),
    ("image-content", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     None),
    ("unknown-model", "/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
]


@pytest.mark.parametrize(
    "path,payload,status,param", [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_requests_get_openai_style_errors(client, path, payload, status, param):
    if isinstance(payload, bytes):
        r = client.post(path, content=payload, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=payload)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["message"]
    if param is not None:
        assert err["param"] == param
    if status == 404:
        assert err["code"] == "model_not_found"


@pytest.mark.parametrize("fields", [
    {"min_tokens": 0, "stop_token_ids": [], "logit_bias": {}},
    {"min_tokens": None, "stop_token_ids": None, "logit_bias": None},
    {"min_tokens": 4, "stop_token_ids": [3, 4]},  # the simulator's outputs run to max_tokens
], ids=["defaults", "nulls", "held"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_output_fields_at_their_defaults_or_held_are_accepted(client, path, fields):
    body = {"prompt": "x"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "x"}]}
    r = client.post(path, json={**body, "max_tokens": 4, **fields})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_rejections_carry_the_engine_reason(client):
    err = client.post("/v1/completions", json={"prompt": "x", "max_tokens": CONTEXT}).json()["error"]
    assert err["code"] == "request_rejected" and "context" in err["message"]
    big = "w " * (KV_BLOCKS * BLOCK_SIZE + 100)
    err = client.post("/v1/completions", json={"prompt": big, "max_tokens": 1}).json()["error"]
    assert "KV blocks" in err["message"]
    assert client.get("/health").status_code == 200  # still serving


# ---- metrics -----------------------------------------------------------------------------------
def test_metrics_are_exposed(client):
    before = metric_value(client, "cbbench_requests_finished_total")
    client.post("/v1/completions", json={"prompt": "x y", "max_tokens": 4})
    text = client.get("/metrics").text
    for name in (
        "cbbench_num_requests_running", "cbbench_num_requests_waiting",
        "cbbench_kv_cache_usage_perc", "cbbench_iteration_prefill_tokens_bucket",
        "cbbench_iteration_decode_tokens_bucket", "cbbench_iteration_duration_seconds_bucket",
        "cbbench_requests_finished_total", "cbbench_requests_aborted_total",
        "cbbench_requests_rejected_total", "cbbench_prompt_tokens_total",
        "cbbench_generation_tokens_total",
    ):
        assert name in text, name
    assert metric_value(client, "cbbench_requests_finished_total") == before + 1
    assert metric_value(client, "cbbench_kv_cache_blocks_total") == KV_BLOCKS
    assert metric_value(client, "cbbench_generation_tokens_total") >= 4


# ---- disconnects free the KV cache -------------------------------------------------------------
LONG_OUTPUT = 3000  # ~8 s of 2.7 ms iterations: far longer than the checks below wait


def test_stream_disconnect_aborts_and_frees_kv(srv, client):
    aborted = metric_value(client, "cbbench_requests_aborted_total")
    req = {"prompt": "p " * 40, "max_tokens": LONG_OUTPUT, "stream": True}
    with httpx.Client(base_url=srv.url, timeout=30.0) as c, c.stream("POST", "/v1/completions", json=req) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 5:
                # Checked while the stream is open: leaving httpx's line iterator closes the
                # connection, and under load the server's abort could free the KV first.
                assert srv.engine.snapshot().kv_blocks_used > 0
                break
    t0 = time.monotonic()
    snap = wait_idle(srv.engine, timeout=3.0)
    assert snap.kv_blocks_used == 0 and snap.running == 0, snap
    assert time.monotonic() - t0 < 3.0
    assert metric_value(client, "cbbench_requests_aborted_total") == aborted + 1


def test_non_streaming_disconnect_aborts(srv, client):
    aborted = metric_value(client, "cbbench_requests_aborted_total")
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=srv.url, timeout=0.3) as c:
        c.post("/v1/completions", json={"prompt": "p", "max_tokens": LONG_OUTPUT})
    snap = wait_idle(srv.engine, timeout=3.0)
    assert snap.kv_blocks_used == 0 and snap.running == 0, snap
    assert metric_value(client, "cbbench_requests_aborted_total") == aborted + 1


# ---- the server's token times agree with the client's ------------------------------------------
def test_server_token_times_match_what_the_client_saw(client):
    n = 60
    req = {"prompt": "t " * 20, "max_tokens": n, "stream": True, "return_token_times": True}
    sent = time.perf_counter()
    seen: list[float] = []
    final = None
    with client.stream("POST", "/v1/completions", json=req) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            seen.append(time.perf_counter())
            chunk = json.loads(line[len("data: ") :])
            if chunk["choices"][0]["finish_reason"]:
                final = chunk
    ext = final["cbbench"]
    server = ext["token_times"]
    assert len(server) == len(seen) == n
    assert sent <= ext["arrival_time"] < server[0]
    assert all(a <= b for a, b in zip(server, server[1:]))
    lags = [c - s for c, s in zip(seen, server)]
    # A token reaches the client after the engine made it, and soon after.
    assert min(lags) > -1e-3, lags
    assert statistics.median(lags) < 0.02, lags
    assert max(lags) < 0.25, lags
    # Client-side TTFT and the engine's agree, and so does the span of the decode (ITL on
    # average); the tolerance allows a scheduling hiccup on a loaded CI machine.
    assert abs((seen[0] - sent) - (server[0] - sent)) < 0.05
    server_span = server[-1] - server[0]
    assert server_span > (n - 1) * OVERHEAD_US * 1e-6
    assert abs((seen[-1] - seen[0]) - server_span) < 0.05


# ---- text --------------------------------------------------------------------------------------
def test_hashed_word_codec_is_stable():
    codec = HashedWordCodec(1000)
    ids = codec.encode("  the cat  sat\non the mat ")
    assert len(ids) == 6 and ids[0] == ids[4] and all(0 <= i < 1000 for i in ids)
    assert ids == HashedWordCodec(1000).encode("the cat sat on the mat")
    dec = codec.decoder()
    assert dec.push(None) == SIM_TOKEN_TEXT and dec.push(42) == " 42"


@pytest.mark.parametrize("chat", [False, True])
def test_token_event_template_writes_what_json_dumps_would(chat):
    from cbbench.server.chunks import Shape

    shape = Shape(chat, 'model "x" ✓', client_request_id="id-ü\"1")
    for text in ("", " tok", 'quote " back \\ slash', "new\nline\ttab", "ünï ✓ 日本 😀", "\x00\x1f"):
        expected = b"data: " + json.dumps(shape.chunk(text, None), separators=(",", ":")).encode()
        assert shape.token_event(text) == expected + b"\n\n"
        assert json.loads(shape.token_event(text)[6:])["id"].endswith('-id-ü"1')


def test_tokenizer_codec_decodes_incrementally(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    text = "héllo wörld, 日本語 the quick brown fox jumps ✓ over the lazy dog"
    tok.train_from_iterator([text] * 5, trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    codec = TokenizerCodec(load_tokenizer(str(tmp_path)))  # a folder works too
    ids = codec.encode(text)
    assert len(ids) > 5
    dec = codec.decoder()
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == tok.decode(ids) == text
    with pytest.raises(ValueError):
        load_tokenizer(str(tmp_path / "missing.json"))


# ---- the command --------------------------------------------------------------------------------
def test_serve_command_rejects_bad_options():
    from typer.testing import CliRunner

    runner = CliRunner()
    r = runner.invoke(serve_app(), ["serve", "--engine", "sim", "--port", "70000"])
    assert r.exit_code == 2 and "--port" in r.output
    r = runner.invoke(serve_app(), ["serve", "--engine", "sim", "--tokenizer", "/nonexistent"])
    assert r.exit_code == 2 and "tokenizer" in r.output
    r = runner.invoke(
        serve_app(), ["serve", "--engine", "sim", "--gpu", "no-such-gpu", "--port", "0"]
    )
    assert r.exit_code == 2 and "no-such-gpu" in r.output.lower()
    r = runner.invoke(
        serve_app(), ["serve", "--engine", "sim", "--request-log", "/nonexistent/dir/log.jsonl"]
    )
    assert r.exit_code == 2 and "--request-log" in r.output


def test_port_in_use_is_not_a_hang():
    # A bound port: uvicorn fails to start, and the command returns instead of waiting forever.
    from typer.testing import CliRunner

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        r = CliRunner().invoke(
            serve_app(), ["serve", "--engine", "sim", "--model", MODEL, "--port", str(port)]
        )
    assert r.exit_code != 0
    assert time.monotonic() - t0 < START_TIMEOUT_S
