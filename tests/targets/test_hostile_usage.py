"""What a server says about itself never costs a run nor skews its figures (the hostile-server
review of `cbbench run --endpoint`): a malformed vLLM `metrics` block lost the whole run at
validation; a /v1/models answer with ids that are not names (ints, dicts, a lone surrogate,
JSON nested 100k deep) gave tracebacks, or sent the run and lost it at the end; a lone
surrogate in streamed text broke --tokenizer counting in an unretrieved task exception; running
usage that never grows gave a per-token ITL 8x too short; and usage that contradicts the stream
(0 completion tokens over 8 text events, reasoning tokens above completion tokens) was taken.

Each case runs the CLI against the fake server (tests/fake_openai.py) answering with the exact
bytes the review's raw server sent.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fake_openai import MODEL, FakeOpenAI, make_tiny_tokenizer
from helpers import invoke_app

from cbbench.targets.apis import server_tokenize

N = 4
OUT = 8  # tokens (text events) per request
GAP_S = 0.02  # between the events of the paced scripts: ITL must come out near it
SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def ev(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def tok(text, finish=None, usage=None) -> bytes:
    o = {"id": "cmpl-x", "object": "text_completion",
         "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        o["usage"] = usage
    return ev(o)


def text_events(n: int = OUT, usage=None) -> list[bytes]:
    return [tok(" a", "length" if i == n - 1 else None, usage) for i in range(n)]


def closing(usage: dict, **extra) -> list[bytes]:
    """The final usage-only chunk, and [DONE]."""
    return [ev({"id": "cmpl-x", "choices": [], "usage": usage, **extra}), b"data: [DONE]\n\n"]


class ScriptedFake(FakeOpenAI):
    """The fake OpenAI server answering GET /v1/models with `models_body` (exact bytes) and
    every completion with `events` (exact bytes, one HTTP chunk each, `gap_s` apart)."""

    def __init__(self, events: list[bytes] | None = None, models_body: bytes | None = None,
                 gap_s: float = 0.0):
        super().__init__(metrics=False)
        self.events, self.models_body, self.gap_s = events, models_body, gap_s

    async def _route(self, method, path, headers, body, writer) -> bool:
        if method == "GET" and path == "/v1/models" and self.models_body is not None:
            self._plain(writer, "200 OK", self.models_body)
            return True
        if method == "POST" and path == "/v1/completions" and self.events is not None:
            self.requests.append({"path": path, "body": json.loads(body)})
            writer.write(SSE_HEAD)
            for e in self.events:
                writer.write(_chunk(e))
                await writer.drain()
                if self.gap_s:  # the server's own pace (what ITL measures), not a test wait
                    await asyncio.sleep(self.gap_s)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        return await super()._route(method, path, headers, body, writer)


def run_cli(url: str, out, *extra: str):
    return invoke_app([
        "run", "--endpoint", url, "--workload", "random", "--input-len", "8",
        "--output-len", str(OUT), "--num-requests", str(N), "--request-rate", "inf",
        "--output", str(out), "--quiet", "--save-detailed", "--max-error-rate", "1", *extra,
    ])


def warnings_of(res) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.startswith("cbbench: warning:")]


def one_error_line(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and not res.stdout, res.output
    assert lines[0].startswith("cbbench: error: ") and "Traceback" not in res.output
    return lines[0]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> str:
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def scripted_run(tmp_path, events, *extra, gap_s=0.0):
    """The CLI run against a server streaming `events`: (the CLI's result, the result file's
    JSON or None)."""
    out = tmp_path / "r.json"
    with ScriptedFake(events, gap_s=gap_s) as s:
        res = run_cli(s.url, out, "--served-model", MODEL, *extra)
    return res, (json.loads(out.read_text()) if out.exists() else None)


# ---- 1. a malformed vLLM `metrics` block (--enable-per-request-metrics) ----------------------
BAD_METRICS = {
    "queue_time_ms": "abc",
    "time_to_first_token_ms": [1],
    "generation_time_ms": -5,
    "mean_itl_ms": {"a": 1},
    "tokens_per_second": True,
}


def test_a_malformed_metrics_block_keeps_the_run_and_its_good_fields(tmp_path):
    metrics = {**BAD_METRICS, "tokens_per_second": 160.0, "queue_time_ms": 2}
    events = text_events() + closing({"prompt_tokens": 3, "completion_tokens": OUT},
                                     metrics=metrics)
    res, result = scripted_run(tmp_path, events)
    assert res.exit_code == 0, res.output
    assert result is not None and len(result["requests"]) == N
    for r in result["requests"]:
        assert r["error"] is None and r["output_tokens"] == OUT
        assert r["server_timing"] == {"queue_time_ms": 2, "tokens_per_second": 160.0}
    dropped = [w for w in warnings_of(res) if "metrics" in w]
    assert len(dropped) == 1, res.stderr  # one line for the run, not one per request
    assert f"{N} of {N}" in dropped[0] and "time_to_first_token_ms" in dropped[0]


def test_a_metrics_block_with_nothing_usable_is_left_out(tmp_path):
    events = text_events() + closing({"prompt_tokens": 3, "completion_tokens": OUT},
                                     metrics=BAD_METRICS)
    res, result = scripted_run(tmp_path, events)
    assert res.exit_code == 0, res.output
    assert all(r.get("server_timing") is None for r in result["requests"])
    assert len([w for w in warnings_of(res) if "metrics" in w]) == 1


# ---- 2. /v1/models ids that are not names --------------------------------------------------
MODELS_BODIES = {
    "int ids": b'{"data":[{"id":1},{"id":2}]}',
    "dict id": b'{"data":[{"id":{"a":1}}]}',
    "list id": b'{"data":[{"id":["a"]}]}',
    "one int id": b'{"data":[{"id":7}]}',
    "surrogate id": b'{"data":[{"id":"m\\ud800"}]}',
    "empty id": b'{"data":[{"id":""}]}',
    "null id": b'{"data":[{"id":null}]}',
    "an int adapter": b'{"data":[{"id":"a"},{"id":5,"parent":"a"}]}',
    "100k deep": b'{"data":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.parametrize("kind", sorted(MODELS_BODIES))
def test_model_ids_that_are_not_names_stop_before_the_run(tmp_path, kind):
    out = tmp_path / "r.json"
    with ScriptedFake(text_events(), models_body=MODELS_BODIES[kind]) as s:
        res = run_cli(s.url, out)
        sent = len(s.requests)
    line = one_error_line(res)
    assert "/v1/models" in line and "--served-model" in line
    assert sent == 0 and not out.exists()  # nothing was sent, nothing written


def test_a_tokenize_answer_nested_100k_deep_leaves_prompts_approximate(tmp_path, notices):
    deep = b"[" * 100_000 + b"]" * 100_000

    class DeepTokenize(ScriptedFake):
        async def _route(self, method, path, headers, body, writer) -> bool:
            if method == "POST" and path == server_tokenize.TOKENIZE_PATH:
                self._plain(writer, "200 OK", deep)
                return True
            return await super()._route(method, path, headers, body, writer)

    out = tmp_path / "r.json"
    events = text_events() + closing({"prompt_tokens": 3, "completion_tokens": OUT})
    with DeepTokenize(events) as s:
        res = invoke_app([
            "run", "--endpoint", s.url, "--served-model", MODEL, "--workload", "random",
            "--input-len", "8", "--output-len", str(OUT), "--num-requests", "2",
            "--request-rate", "inf", "--output", str(out), "--quiet",
        ])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["summary"]["http"]["prompt_sizing"] == "approximate"
    assert any("did not size prompts" in n for n in notices)


# ---- 3. a lone surrogate in streamed text, with --tokenizer ---------------------------------
def test_a_lone_surrogate_is_counted_by_the_tokenizer(tmp_path, tiny_tokenizer, notices):
    # " a" is one token of the tiny tokenizer; the lone surrogate one unknown word.
    events = ([tok(" a")] * (OUT - 2) + [b'data: {"choices":[{"index":0,"text":" \\ud800"}]}\n\n',
                                          tok(" a", "length"), b"data: [DONE]\n\n"])
    res, result = scripted_run(tmp_path, events, "--tokenizer", tiny_tokenizer)
    assert res.exit_code == 0, res.output
    assert "Task exception" not in res.output and "TypeError" not in res.output
    assert not [n for n in notices if "exception" in n.lower()]
    for r in result["requests"]:
        assert r["error"] is None
        assert r["output_token_counts"]["tokenizer"] == OUT
        assert r["output_tokens"] == OUT
        assert r["event_tokens"] == [1] * OUT and r["tokens_per_event_method"] == "tokenizer"


def test_a_count_that_raises_fails_its_request_not_the_run(tmp_path, monkeypatch):
    # Whatever else a stream holds that counting cannot take: that request fails, named.
    from cbbench.targets import http

    real = http.count_request

    def count(rec, *args):
        if rec.id == 0:
            raise TypeError("TextInputSequence must be str")
        return real(rec, *args)

    monkeypatch.setattr(http, "count_request", count)
    events = text_events() + closing({"prompt_tokens": 3, "completion_tokens": OUT})
    res, result = scripted_run(tmp_path, events)
    assert res.exit_code == 0, res.output
    by_id = {r["id"]: r for r in result["requests"]}
    assert by_id[0]["error_type"] == "client_error" and "TypeError" in by_id[0]["error"]
    assert all(r["error"] is None and r["output_tokens"] == OUT
               for i, r in by_id.items() if i != 0)
    assert result["summary"]["completed"] == N - 1


# ---- 4. running usage that never grows ------------------------------------------------------
def test_running_usage_that_never_grows_is_not_trusted_for_itl(tmp_path):
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    events = text_events(usage=zero) + closing(
        {"prompt_tokens": 8, "completion_tokens": OUT, "total_tokens": OUT + 8})
    res, result = scripted_run(tmp_path, events, gap_s=GAP_S)
    assert res.exit_code == 0, res.output
    for r in result["requests"]:
        assert r["event_tokens"] == [1] * OUT and r["tokens_per_event_method"] == "one_per_event"
        assert r["output_tokens"] == OUT and r["output_tokens_method"] == "usage"
    s = result["summary"]
    # One token an event: the per-token gaps are the event gaps, whose mean is TPOT's.
    assert s["itl_ms"]["mean"] == pytest.approx(s["tpot_ms"]["mean"], rel=0.05)
    said = [w for w in warnings_of(res) if "running usage" in w]
    assert len(said) == 1 and f"{N} of {N}" in said[0], res.stderr


def test_running_usage_that_goes_down_falls_back_to_the_tokenizer(tmp_path, tiny_tokenizer):
    events = [tok(" a" if i % 2 else " a a", "length" if i == OUT - 1 else None,
                  {"prompt_tokens": 3, "completion_tokens": OUT - i}) for i in range(OUT)]
    res, result = scripted_run(tmp_path, events + [b"data: [DONE]\n\n"],
                               "--tokenizer", tiny_tokenizer)
    assert res.exit_code == 0, res.output
    for r in result["requests"]:
        assert r["tokens_per_event_method"] == "tokenizer"
        assert r["event_tokens"] == [2, 1] * (OUT // 2)
    assert len([w for w in warnings_of(res) if "running usage" in w]) == 1


# ---- 5. usage that contradicts the stream --------------------------------------------------
def test_zero_completion_tokens_over_text_events_is_not_the_count(tmp_path):
    events = text_events() + closing({"prompt_tokens": 3, "completion_tokens": 0,
                                      "total_tokens": 3})
    res, result = scripted_run(tmp_path, events)
    assert res.exit_code == 0, res.output
    for r in result["requests"]:
        assert r["output_tokens"] == OUT and r["output_tokens_method"] == "events"
        assert "usage" not in r["output_token_counts"]
    assert result["summary"]["output_throughput"] > 0
    said = [w for w in warnings_of(res) if "usage" in w and "contradict" in w]
    assert len(said) == 1 and f"{N} of {N}" in said[0], res.stderr


def test_reasoning_tokens_above_completion_tokens_are_not_taken(tmp_path):
    events = text_events() + closing({
        "prompt_tokens": 3, "completion_tokens": OUT,
        "completion_tokens_details": {"reasoning_tokens": OUT * 100}})
    res, result = scripted_run(tmp_path, events)
    assert res.exit_code == 0, res.output
    for r in result["requests"]:
        assert r["output_tokens"] == OUT and r["reasoning_tokens"] in (None, 0)
    assert (result["summary"]["reasoning_tokens"] or {}).get("mean") in (None, 0)
    said = [w for w in warnings_of(res) if "reasoning_tokens" in w]
    assert len(said) == 1 and f"{N} of {N}" in said[0], res.stderr


def test_a_larger_server_count_is_still_trusted(tmp_path):
    # Usage above the events is a server sending several tokens an event: its count stands.
    events = text_events() + closing({"prompt_tokens": 3, "completion_tokens": 3 * OUT})
    res, result = scripted_run(tmp_path, events)
    assert res.exit_code == 0, res.output
    assert {r["output_tokens"] for r in result["requests"]} == {3 * OUT}
    assert not [w for w in warnings_of(res) if "contradict" in w]
