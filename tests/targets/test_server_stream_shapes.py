"""`cbbench run --endpoint` against the streams of the OpenAI-compatible servers users point it
at besides vLLM: llama.cpp's llama-server, TGI's Messages API, Ollama's /v1, SGLang, LMDeploy's
api_server and trtllm-serve. Each script is the server's own bytes (read from its source: the
role-only first chunk, a role on every delta, nulls for absent fields, finish_reason on the last
text chunk or on a chunk of its own, usage on every chunk or on a usage-only chunk, `timings`,
`reasoning_content`/`reasoning`, no [DONE]), paced by the fake: TTFT is the first text, never the
role chunk sent a gap before it; one time a text event; output tokens from usage; the
finish_reason kept; no error.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fake_openai import MODEL, _chunk
from helpers import invoke_app
from test_hostile_usage import SSE_HEAD, ScriptedFake

N = 2
OUT = 4  # text events (one token each) per request
GAP_S = 0.05  # the server's pace between events, the role chunk's lead before the first text
USAGE = {"prompt_tokens": 8, "completion_tokens": OUT, "total_tokens": 8 + OUT}


def ev(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chat(delta: dict, finish=None, **extra) -> bytes:
    return ev({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
               "model": MODEL, "choices": [{"index": 0, "delta": delta,
                                            "finish_reason": finish}], **extra})


def cmpl(text: str, finish=None, **extra) -> bytes:
    return ev({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
               "choices": [{"index": 0, "text": text, "logprobs": None,
                            "finish_reason": finish}], **extra})


def usage_only(**extra) -> bytes:
    return ev({"id": "chatcmpl-1", "choices": [], "usage": USAGE, **extra})


def running(k: int) -> dict:
    return {"prompt_tokens": 8, "completion_tokens": k, "total_tokens": 8 + k}


DONE = b"data: [DONE]\n\n"
WORDS = [" a", " b", " c", " d"]
SGLANG_NULLS = {"reasoning_content": None, "tool_calls": None}

# (api, lead: the events sent before the first text, texts, tail: after the last text)
SCRIPTS = {
    # tools/server/server-task.cpp: a role chunk with content null, one chunk per text diff,
    # a finish chunk with an empty delta, the usage-only chunk with `timings`, [DONE].
    "llama.cpp chat": ("chat", [chat({"role": "assistant", "content": None})],
                       [chat({"content": w}) for w in WORDS],
                       [chat({}, "length"), usage_only(timings={"predicted_n": OUT}), DONE]),
    "llama.cpp completions": ("completions", [],
                              [cmpl(w, timings={"predicted_n": 1}) for w in WORDS],
                              [cmpl("", "length", usage=USAGE), DONE]),
    # router/src/chat.rs: role on every delta, usage null, the last text carries finish_reason;
    # the usage-only chunk (id "") then [DONE].
    "TGI chat": ("chat", [],
                 [chat({"role": "assistant", "content": w}, "length" if i == OUT - 1 else None,
                       usage=None, system_fingerprint="3.0.0-native")
                  for i, w in enumerate(WORDS)],
                 [ev({"id": "", "choices": [], "usage": USAGE}), DONE]),
    # openai/openai.go: role on every delta, a closing chunk with content "" and the finish,
    # usage only with stream_options (a usage-only chunk), [DONE].
    "Ollama chat": ("chat", [], [chat({"role": "assistant", "content": w}) for w in WORDS],
                    [chat({"role": "assistant", "content": ""}, "length",
                          system_fingerprint="fp_ollama"), usage_only(), DONE]),
    "Ollama completions": ("completions", [], [cmpl(w) for w in WORDS],
                           [cmpl("", "length"), usage_only(), DONE]),
    # serving_chat.py: pydantic dumps with nulls ("role": null on text chunks), a role chunk
    # with content "", a finish chunk with matched_stop, the usage-only chunk, [DONE].
    "SGLang chat": ("chat", [chat({"role": "assistant", "content": "", **SGLANG_NULLS},
                                  usage=None)],
                    [chat({"role": None, "content": w, **SGLANG_NULLS}, usage=None)
                     for w in WORDS],
                    [ev({"id": "chatcmpl-1", "choices": [{
                        "index": 0, "delta": {"role": None, "content": None, **SGLANG_NULLS},
                        "finish_reason": "length", "matched_stop": None}], "usage": None}),
                     usage_only(), DONE]),
    # api_server.py: role on every delta, running usage on every chunk (include_usage), the
    # finish on the last text chunk, [DONE].
    "LMDeploy chat": ("chat", [],
                      [chat({"role": "assistant", "content": w, **SGLANG_NULLS},
                            "length" if i == OUT - 1 else None, usage=running(i + 1))
                       for i, w in enumerate(WORDS)], [DONE]),
    # trtllm-serve (exclude_none): a role-only chunk with running usage 0, text chunks with
    # running usage, the finish on the last, the usage-only chunk, [DONE].
    "trtllm-serve chat": ("chat", [chat({"role": "assistant"}, usage=running(0))],
                          [chat({"content": w}, "length" if i == OUT - 1 else None,
                                usage=running(i + 1)) for i, w in enumerate(WORDS)],
                          [usage_only(), DONE]),
    # Reasoning deltas are output tokens: llama.cpp's reasoning_content, Ollama's reasoning
    # (beside content "" on every delta).
    "llama.cpp reasoning": ("chat", [chat({"role": "assistant", "content": None})],
                            [chat({"reasoning_content": w}) for w in WORDS[:2]]
                            + [chat({"content": w}) for w in WORDS[2:]],
                            [chat({}, "length"), usage_only(), DONE]),
    "Ollama reasoning": ("chat", [],
                         [chat({"role": "assistant", "content": "", "reasoning": w})
                          for w in WORDS[:2]]
                         + [chat({"role": "assistant", "content": w}) for w in WORDS[2:]],
                         [chat({"role": "assistant", "content": ""}, "length"), usage_only(),
                          DONE]),
    # A server that ends its body without [DONE] (TGI before 2.x): the finish ends the stream.
    "no [DONE]": ("chat", [chat({"role": "assistant", "content": ""})],
                  [chat({"content": w}) for w in WORDS], [chat({}, "length"), usage_only()]),
}


PACED_ROUTES = ("completions", "/v1/messages", "/v1/responses")


class PacedFake(ScriptedFake):
    """The fake answering any streamed POST with `lead`, a gap, then `texts` GAP_S apart, then
    `tail` at once."""

    def __init__(self, lead, texts, tail):
        super().__init__(events=[])
        self.lead, self.texts, self.tail = lead, texts, tail

    async def _route(self, method, path, headers, body, writer) -> bool:
        # The OpenAI routes here; test_api_stream_truths.py paces its Anthropic and Responses
        # streams with this fake too.
        if method != "POST" or not path.endswith(PACED_ROUTES):
            return await super()._route(method, path, headers, body, writer)
        writer.write(SSE_HEAD)
        for e in self.lead:
            writer.write(_chunk(e))
        await writer.drain()
        for e in self.texts:
            await asyncio.sleep(GAP_S)  # the server's own pace: what TTFT and ITL measure
            writer.write(_chunk(e))
            await writer.drain()
        for e in self.tail:
            writer.write(_chunk(e))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


@pytest.mark.parametrize("server", sorted(SCRIPTS))
def test_each_servers_stream_gives_its_true_figures(server, tmp_path):
    api, lead, texts, tail = SCRIPTS[server]
    out = tmp_path / "r.json"
    with PacedFake(lead, texts, tail) as s:
        res = invoke_app([
            "run", "--endpoint", s.url, "--served-model", MODEL, "--api", api,
            "--workload", "random", "--input-len", "8", "--output-len", str(OUT),
            "--num-requests", str(N), "--max-concurrency", "1", "--request-rate", "inf",
            "--output", str(out), "--quiet", "--save-detailed",
        ])
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    for r in result["requests"]:
        assert r["error"] is None, r["error"]
        assert r["finish_reason"] == "length"
        assert r["output_tokens"] == OUT and r["output_tokens_method"] == "usage"
        assert len(r["token_times_s"]) == OUT  # one time a text event: OUT - 1 ITL gaps
        assert r["event_tokens"] == [1] * OUT
        ttft = r["token_times_s"][0] - r["send_s"]
        assert (r["reasoning_tokens"] or 0) == (2 if "reasoning" in server else 0)
        assert ttft >= GAP_S * 0.9  # the first text, not the role chunk sent a gap before it
    itl = result["summary"]["itl_ms"]["mean"]
    assert itl == pytest.approx(GAP_S * 1000, rel=0.5)


def run_paced(tmp_path, lead, texts, tail) -> list[dict]:
    out = tmp_path / "r.json"
    with PacedFake(lead, texts, tail) as s:
        res = invoke_app([
            "run", "--endpoint", s.url, "--served-model", MODEL, "--api", "chat",
            "--workload", "random", "--input-len", "8", "--output-len", str(OUT),
            "--num-requests", str(N), "--max-concurrency", "1", "--request-rate", "inf",
            "--output", str(out), "--quiet", "--save-detailed", "--max-error-rate", "1",
        ])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())["requests"]


def test_a_refusal_is_output(tmp_path):
    """OpenAI's ChoiceDelta.refusal: the model's refusal streams as text does (content null).
    It is generated output: TTFT at its first delta, one time a delta, not a failed request
    "without any output text"."""
    lead = [chat({"role": "assistant", "content": None, "refusal": ""})]
    texts = [chat({"refusal": w}) for w in WORDS]
    for r in run_paced(tmp_path, lead, texts, [chat({}, "stop"), usage_only(), DONE]):
        assert r["error"] is None, r["error"]
        assert r["output_tokens"] == OUT and len(r["token_times_s"]) == OUT
        assert r["token_times_s"][0] - r["send_s"] >= GAP_S * 0.9


@pytest.mark.parametrize("server", ["TGI", "SGLang"])
def test_an_empty_delta_mid_stream_is_a_token(server, tmp_path):
    """TGI sends `{"role": "assistant", "content": ""}` for a special token mid-stream, SGLang
    `"role": null` beside a held-back "": tokens, counted where the server sends no usage
    (as vLLM's bench counts every chunk with choices); only the stream's first chunk is the
    opening role chunk."""
    role = "assistant" if server == "TGI" else None
    texts = [chat({"role": role, "content": w}) for w in WORDS[:-1]]
    texts.insert(2, chat({"role": role, "content": ""}))  # OUT tokens, one of them empty
    lead = [] if server == "TGI" else [chat({"role": "assistant", "content": ""})]
    for r in run_paced(tmp_path, lead, texts, [chat({"role": role, "content": None}, "length"),
                                                DONE]):
        assert r["error"] is None, r["error"]
        assert len(r["token_times_s"]) == OUT - 1
        assert r["output_tokens"] == OUT, r["output_tokens_method"]
