"""`cbbench serve --api-key`: 401 in OpenAI's error format without or with a wrong key, 200 with
it, for completions, chat and models (and /tokenize, /detokenize, as vLLM guards every route);
/health and /metrics stay open; the key never shows in the server's output, its request log or
a client's result; binding beyond loopback without a key warns. Every wait here is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from helpers import SERVE_MODEL as MODEL
from helpers import serve_app, sim_options, start_server
from typer.testing import CliRunner

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig

KEY = "sk-cbbench-test-7f3a9c1e5b"
WRONG = "sk-cbbench-test-0000000000"
ENV_NAME = "CBBENCH_TEST_API_KEY"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0

CALLS = [
    ("completions", "POST", "/v1/completions", {"prompt": "a b c", "max_tokens": 3}),
    ("completions-stream", "POST", "/v1/completions",
     {"prompt": "a b c", "max_tokens": 3, "stream": True}),
    ("chat", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
    ("models", "GET", "/v1/models", None),
    ("tokenize", "POST", "/tokenize", {"prompt": "a b"}),
    ("detokenize", "POST", "/detokenize", {"tokens": [1, 2]}),
]


@pytest.fixture(scope="module")
def guarded():
    run = start_server(lambda: build_serving_engine(sim_options()), ServeConfig(api_key=KEY))
    with httpx.Client(base_url=run.url, timeout=30.0) as c:
        yield c
    run.stop()


def call(client, method, path, body, key: str | None, scheme: str = "Bearer"):
    headers = {} if key is None else {"Authorization": f"{scheme} {key}"}
    return client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize("name,method,path,body", CALLS, ids=[c[0] for c in CALLS])
def test_key_required_for_every_api_call(guarded, name, method, path, body):
    for key, scheme in ((None, "Bearer"), (WRONG, "Bearer"), (KEY, "Basic"), (KEY + "x", "Bearer")):
        r = call(guarded, method, path, body, key, scheme)
        assert r.status_code == 401, (key, scheme, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key"
        assert KEY not in r.text and WRONG not in r.text
    r = call(guarded, method, path, body, KEY)
    assert r.status_code == 200, r.text
    if name == "completions-stream":
        assert r.text.rstrip().endswith("data: [DONE]")


def test_health_and_metrics_stay_open(guarded):
    assert guarded.get("/health").status_code == 200
    r = guarded.get("/metrics")
    assert r.status_code == 200 and "vllm:time_to_first_token_seconds" in r.text


def test_openai_sdk_with_and_without_the_key(guarded):
    openai = pytest.importorskip("openai")
    base = str(guarded.base_url).rstrip("/") + "/v1"
    good = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=30.0)
    bad = openai.OpenAI(base_url=base, api_key=WRONG, max_retries=0, timeout=30.0)
    try:
        assert [m.id for m in good.models.list()] == [MODEL]
        out = good.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert out.usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=MODEL, prompt="x", max_tokens=1)
    finally:
        good.close()
        bad.close()


# ---- the command -----------------------------------------------------------------------------
def test_bad_api_key_options_are_usage_errors(monkeypatch):
    monkeypatch.delenv(ENV_NAME, raising=False)
    runner = CliRunner()
    r = runner.invoke(serve_app(), ["serve", "--engine", "sim", "--api-key", f"env:{ENV_NAME}"])
    assert r.exit_code == 2 and ENV_NAME in r.output and "not set" in r.output
    r = runner.invoke(serve_app(), ["serve", "--engine", "sim", "--api-key", "two words"])
    assert r.exit_code == 2 and "two words" not in r.output


def _bound_port(host: str) -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind((host, 0))
    s.listen()
    return s, s.getsockname()[1]


def test_non_loopback_without_a_key_warns_once():
    # A port already in use makes the command return right after its start-up messages.
    runner = CliRunner()
    s, port = _bound_port("0.0.0.0")
    with s:
        base = ["serve", "--engine", "sim", "--model", MODEL, "--host", "0.0.0.0", "--port", str(port)]
        r = runner.invoke(serve_app(), base)
        warnings = [ln for ln in r.output.splitlines() if "without --api-key" in ln]
        assert len(warnings) == 1 and "0.0.0.0" in warnings[0]
        r = runner.invoke(serve_app(), [*base, "--api-key", KEY])
        assert "without --api-key" not in r.output and KEY not in r.output
    s, port = _bound_port("127.0.0.1")
    with s:
        r = runner.invoke(serve_app(), ["serve", "--engine", "sim", "--model", MODEL, "--port", str(port)])
        assert "without --api-key" not in r.output


# The real CLI (its notice handler and its exit-2 boundary included).
SERVE_SCRIPT = """
from cbbench.cli.app import main
main()
"""


def test_the_key_is_absent_from_output_request_log_and_results(tmp_path):
    from cbbench.cli.app import app as cli

    log = tmp_path / "requests.jsonl"
    env = {**os.environ, ENV_NAME: KEY, "PYTHONUNBUFFERED": "1", "AUTH_HEADER": f"Bearer {KEY}"}
    cmd = [
        sys.executable, "-c", SERVE_SCRIPT, "serve", "--engine", "sim", "--model", MODEL,
        "--port", "0", "--api-key", f"env:{ENV_NAME}", "--request-log", str(log),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        for x in proc.stdout:
            output.append(x)
            lines.put(x)

    threading.Thread(target=pump, daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while url is None and time.monotonic() < deadline:
            try:
                m = re.search(r"ready at (http://\S+)/v1", lines.get(timeout=0.5))
            except queue.Empty:
                assert proc.poll() is None, "".join(output)
                continue
            url = m.group(1) if m else None
        assert url, "".join(output)
        with httpx.Client(base_url=url, timeout=30.0) as c:
            for key in (None, WRONG, KEY):
                call(c, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}, key)
        result = tmp_path / "result.json"
        r = CliRunner(env={"AUTH_HEADER": f"Bearer {KEY}"}).invoke(cli, [
            "run", "--endpoint", url, "--num-requests", "4", "--request-rate", "50",
            "--header", "Authorization=env:AUTH_HEADER", "--output", str(result),
        ])
        assert r.exit_code == 0, r.output
        assert json.loads(result.read_text())["summary"]["completed"] == 4
        assert KEY not in r.output and KEY not in result.read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
    text = log.read_text()
    assert len(text.splitlines()) == 5  # the key-less and wrong-key calls never reached the engine
    assert KEY not in text
    assert KEY not in "".join(output)
