"""A fake OpenAI-compatible streaming server for the HTTP target's tests (raw asyncio HTTP/1.1
in a background thread, 127.0.0.1 only), and the helpers those tests share. A request steers
the fake with words in its prompt: `fault:NAME` picks a behaviour (see FakeOpenAI._stream),
`delay:S` the seconds between tokens."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from pathlib import Path

from cbbench.analysis.summary.metrics import summarize
from cbbench.load.prompts import WORD_POOL
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.options import EndpointOptions

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
        self.models: list[dict] = [{"id": MODEL}]  # what GET /v1/models lists (cards)
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
        self.models = [{"id": MODEL}]

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
            self._plain(writer, "200 OK", json.dumps({"data": self.models}).encode())
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
            if fault == "emptypad" and i < n - 1:
                # emptypad: every token followed by a chunk of empty text that is no token (a
                # server padding its stream), and no usage: 2n - 1 events for max_tokens n.
                pad = ({"index": 0, "delta": {"content": ""}, "finish_reason": None} if chat
                       else {"index": 0, "text": "", "finish_reason": None})
                writer.write(_event({"choices": [pad]}))
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
        if fault not in ("nousage", "pairs", "glued", "emptytok", "emptypad"):
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


def prompt_requests(prompts, output_len=4) -> list[WorkloadRequest]:
    return [
        WorkloadRequest(i, len(p.split()) + 1, output_len, prompt=p) for i, p in enumerate(prompts)
    ]


def endpoint_options(url: str, **kw) -> EndpointOptions:
    kw.setdefault("served_model", MODEL)
    return EndpointOptions(endpoint=url, **kw)


def assert_accounted(run, n: int) -> None:
    sent = len(run.records)
    assert sent + run.not_sent == n
    ok = sum(r.ok for r in run.records)
    failed = sum(r.error is not None for r in run.records)
    assert ok + failed == sent
    summary = summarize(run.records, run.duration_s)
    assert summary["completed"] == ok and summary["failed"] == failed


def make_tiny_tokenizer(path: Path) -> str:
    """A word-level tokenizer over the prompt pool that adds a BOS, like Llama-3's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORD_POOL)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(path))
    return str(path)


HIST_BUCKETS = (0.025, 0.05, 0.5, 1.0)


def histogram_page(name: str, values: list[float]) -> str:
    lines = [f"# TYPE {name} histogram"]
    for le in (*HIST_BUCKETS, float("inf")):
        n = sum(v <= le for v in values)
        lines.append(f'{name}_bucket{{le="{"+Inf" if le == float("inf") else le}",model_name="m"}} {n}')
    lines.append(f'{name}_sum{{model_name="m"}} {sum(values)}')
    lines.append(f'{name}_count{{model_name="m"}} {len(values)}')
    return "\n".join(lines) + "\n"


def vllm_histograms_page(fake: FakeOpenAI) -> str:
    """vLLM's TTFT and (older name) per-token latency histograms, from what the fake saw."""
    return histogram_page("vllm:time_to_first_token_seconds", fake.ttft_s) + histogram_page(
        "vllm:time_per_output_token_seconds", fake.gaps_s
    )


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
