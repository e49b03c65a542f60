"""`--api embeddings` and `--api rerank`: the non-streaming request path, chosen once per run
(run_pooling) so the streaming APIs' hot path carries none of it.

A request carries ``--batch-size`` inputs (default 1): the workload request's prompt, then
synthetic texts of the same length (seeded by the request and the input's place, identical on
every target). Embeddings send them as ``input`` (strings, or token-id lists for a token-id
workload); rerank sends the prompt as ``query`` and ``--batch-size`` documents of the prompt's
length (Cohere/Jina shape, vLLM's /v1/rerank). The answer is one JSON body: the request's
latency is from its intended start to the last byte of that body (``e2el_ms``; it has no
first token, so TTFT, TPOT and ITL are left out of the summary); its prompt tokens are the
server's ``usage.prompt_tokens`` (else ``total_tokens``), checked to cover every input
(embeddings: one vector per input; rerank: results with index and relevance_score).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cbbench.analysis.records import RequestRecord
from cbbench.load.interrupts import DEFAULT_GRACE_S
from cbbench.load.prompts import build_prompts, load_tokenizer, synthetic_prompt
from cbbench.load.workload import WorkloadRequest
from cbbench.targets.checks import _is_count, finish_http_run
from cbbench.targets.hooks import RunHooks
from cbbench.targets.http import HttpRun, _Runner
from cbbench.targets.options import EndpointOptions
from cbbench.targets.request import ERROR_MESSAGE_CHARS, RequestContext
from cbbench.targets.transport import HttpFailure, body_text, classify, post

# A response body may be this large (2048 inputs of 4096 floats as JSON text is ~170 MB).
MAX_RESPONSE_BYTES = 512 << 20
# The synthetic inputs after a request's first: request ids far from any workload's.
EXTRA_INPUT_ID = 1 << 40
MAX_ID_CHARS = 200


@dataclass(slots=True)
class PoolingAnswer:
    """What one answer said: its usage and id (the record's counts come from it)."""

    api: str
    expected: int  # inputs (documents) sent
    usage: dict | None = None
    response_id: str | None = None

    def parse(self, data: bytes) -> None:
        try:
            obj = json.loads(data)
        except ValueError:
            raise HttpFailure("bad_event", f"malformed JSON answer: {body_text(data)!r}") from None
        if type(obj) is not dict:
            raise HttpFailure("bad_event", f"unexpected answer: {body_text(data)!r}")
        if self.api == "embeddings":
            rows = obj.get("data")
            if not isinstance(rows, list) or len(rows) != self.expected or not all(
                isinstance(r, dict) and "embedding" in r for r in rows
            ):
                got = len(rows) if isinstance(rows, list) else "no"
                raise HttpFailure("bad_event", f"expected {self.expected} embeddings, got {got}")
        else:
            results = obj.get("results")
            if not isinstance(results, list) or not results or not all(
                isinstance(r, dict) and "index" in r and "relevance_score" in r for r in results
            ):
                raise HttpFailure("bad_event", "the rerank answer has no results with index "
                                  "and relevance_score")
        usage = obj.get("usage")
        self.usage = usage if isinstance(usage, dict) else None
        rid = obj.get("id")
        if isinstance(rid, str) and rid:
            self.response_id = rid[:MAX_ID_CHARS]

    def prompt_tokens(self) -> int | None:
        """The server's count of every input's tokens: usage.prompt_tokens, else total_tokens
        (vLLM's rerank usage carries total_tokens alone)."""
        u = self.usage or {}
        for key in ("prompt_tokens", "total_tokens"):
            if _is_count(u.get(key)):
                return u[key]
        return None


async def _exchange(ctx: RequestContext, body: bytes, answer: PoolingAnswer) -> float:
    """POST, read the whole answer, parse it; the run-clock time its last byte arrived."""
    async with await post(ctx.session, ctx.url, body) as resp:
        data = bytearray()
        while chunk := await resp.content.readany():
            data += chunk
            if len(data) > MAX_RESPONSE_BYTES:
                raise HttpFailure("bad_event",
                                  f"the answer is longer than {MAX_RESPONSE_BYTES} bytes")
        t = time.perf_counter() - ctx.t0
        if not 200 <= resp.status < 300:
            raise HttpFailure("http_status", f"HTTP {resp.status}: {body_text(bytes(data))}")
        answer.parse(bytes(data))
        return t


async def send_pooling(ctx: RequestContext, rec: RequestRecord, body: bytes,
                       answer: PoolingAnswer) -> None:
    """Send now, read the answer into `rec`: its one time (the answer's end) in token_times_s.
    Failures are recorded on the request, never raised; only cancellation propagates."""
    rec.send_s = time.perf_counter() - ctx.t0
    try:
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(ctx.timeout_s):
                t = await _exchange(ctx, body, answer)
        else:  # Python 3.10
            t = await asyncio.wait_for(_exchange(ctx, body, answer), ctx.timeout_s)
        rec.token_times_s.append(t)
    except asyncio.TimeoutError:
        rec.error_type = "timeout"
        rec.error = f"no complete answer within --request-timeout {ctx.timeout_s:g} s"
    except Exception as e:  # recorded on the request, never raised
        rec.error_type, rec.error = classify(e)
        rec.error = rec.error[:ERROR_MESSAGE_CHARS]


def pooling_inputs(prompt: str | list[int], w: WorkloadRequest, batch: int, seed: int,
                   fitter=None) -> list:
    """The request's inputs: its own prompt, then batch - 1 synthetic texts of its length."""
    extra = [synthetic_prompt(w.prompt_len, EXTRA_INPUT_ID + w.id * batch + k, seed, fitter)
             for k in range(1, batch)]
    return [prompt, *extra]


def pooling_body(payload: dict, api: str, query: str | list[int], docs: list) -> bytes:
    body = dict(payload)
    if api == "embeddings":
        body["input"] = [query, *docs]
    else:
        body["query"] = query
        body["documents"] = docs
    return json.dumps(body, separators=(",", ":")).encode()


class PoolingRunner(_Runner):
    """The HTTP runner for embeddings and rerank: its slots, schedule, clock and records, with
    a JSON request and answer instead of a stream."""

    # _Runner (targets/http.py) types the reader it hands _send and _exchange as SseStream;
    # this runner hands them a PoolingAnswer. Both ignores go once _Runner is generic over
    # its reader (http.py is not this module's to change).
    _send = staticmethod(send_pooling)  # type: ignore[assignment]

    def __init__(self, *args, batch: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.batch = batch
        self.inputs: list[tuple[str | list[int], list]] = []  # (query or first input, rest)

    def _payload(self, model: str) -> dict:
        return {"model": model}

    def _one(self, pos: int, at: float):
        w = self.wreqs[pos]
        api = self.opts.api
        first, rest = self.inputs[pos]
        n = len(rest) + (1 if api == "embeddings" else 0)
        # The workload's count: every input's (rerank: each pair holds the query and a document).
        per = w.prompt_len * (2 if api == "rerank" else 1)
        rec = RequestRecord(id=w.id, prompt_tokens=per * n, output_tokens=0,
                            intended_start_s=self.arrivals[pos], priority=w.priority)
        rec.inputs = n
        answer = PoolingAnswer(api, n)

        def body() -> bytes:
            assert self.ctx is not None  # set when the run starts; a body is made at its send
            return pooling_body(self.ctx.payload, api, first, rest)

        return self._exchange(pos, rec, answer, body, at)  # type: ignore[arg-type]

    def _ended(self, pos: int, rec: RequestRecord, st) -> None:
        answer: PoolingAnswer = st
        rec.server_prompt_tokens = answer.prompt_tokens()
        rec.server_request_id = answer.response_id
        self.streams[pos] = None  # its counts are on the record (as _Runner._ended)
        self.finished += 1
        if self.hooks.on_record is not None:
            self.hooks.on_record(pos, rec, "usage")
            if not self.hooks.keep_records:
                self.records[pos] = None
        self._progress()


def run_pooling(
    opts: EndpointOptions,
    wreqs: list[WorkloadRequest],
    arrivals: Sequence[float],
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    keep_token_ids: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    hooks: RunHooks | None = None,
    sessions=None,
    cancel=None,
) -> HttpRun:
    """run_http's counterpart for --api embeddings | rerank (the same arguments)."""
    from cbbench.errors import UsageError
    from cbbench.load.prompts import _ExactFitter

    opts.validate()
    if sessions is not None:
        raise UsageError(f"--api {opts.api} sends single requests: a multi-turn workload needs "
                         "--api chat")
    if len(arrivals) != len(wreqs):
        raise ValueError(f"{len(wreqs)} requests but {len(arrivals)} arrival times")
    tokenizer = load_tokenizer(opts.tokenizer) if opts.tokenizer else None
    # Rerank's query and documents are text (token ids need --tokenizer to decode, as chat).
    prompts, kinds = build_prompts(wreqs, "completions" if opts.api == "embeddings" else "chat",
                                   opts.seed, tokenizer)
    batch = opts.batch_size or 1
    fitter = _ExactFitter.for_tokenizer(tokenizer) if tokenizer is not None and batch > 1 else None
    runner = PoolingRunner(opts, wreqs, arrivals, prompts, tokenizer, should_stop, on_progress,
                           grace_s, hooks, cancel, batch=batch)
    for p, w in zip(prompts, wreqs):
        if opts.api == "embeddings":
            first, *rest = pooling_inputs(p, w, batch, opts.seed, fitter)
        else:
            first, rest = p, pooling_inputs(p, w, batch + 1, opts.seed, fitter)[1:]
        runner.inputs.append((first, rest))
    duration, info = asyncio.run(runner.run())
    records = [rec for rec in runner.records if rec is not None]
    finish_http_run(opts, records, {}, kinds, len(wreqs), info)
    return HttpRun(records, duration, runner.stopped, info, len(wreqs) - len(records),
                   runner.monitor.lag_ms if runner.monitor is not None else [])
