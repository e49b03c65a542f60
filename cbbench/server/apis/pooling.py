"""What /v1/embeddings and /v1/rerank share: a request of N inputs is N prefills in the engine
(each a request of max_tokens 1: its prefill, then one sampled row that nobody reads, the
step's lm_head row), answered with one JSON body once every prefill finished.

The vectors: on the torch engine, the model's own -- its final (normed) hidden state at the
input's last token, L2-normalized (vLLM's LAST pooling with normalize, the default of its
decoder-only embedding models), kept by the model runner from the row it samples anyway. On the
sim engine, deterministic stand-ins: a unit vector per input drawn from a seed that is a hash
of its token ids (the same input gives the same vector on every run and server), of the model's
hidden size; the timing is the engine's (its prefills), the numbers mean nothing. Rerank needs
a classifier head the torch engine's models do not have: it is a 400 there.

Each request keeps the server's contract: one request-log line (api embeddings | rerank,
``inputs``, ``prompt_tokens``; first/last token = the first and last prefill's end), the
engine's /metrics (each input is an engine request), the API key and body limits (ServeApp),
and a client that goes away aborts every input still in the engine.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cbbench.engine.core.request import SamplingParams
from cbbench.server.async_engine import RequestStream
from cbbench.server.chunks import request_id
from cbbench.server.context import ServeContext, Served
from cbbench.server.engine_events import Admitted, Failed, TokenEvent
from cbbench.server.generate import (
    CLIENT_CLOSED_STATUS,
    CLIENT_GONE,
    read_body,
    watch_disconnect,
)
from cbbench.server.protocol import APIError, check_vocab, send_json
from cbbench.server.request_log import RequestTrace
from cbbench.server.sent_stamp import send_json_stamped

DEFAULT_DIM = 1024  # when the engine's model reports no hidden size
POOLED = SamplingParams()  # greedy, one row: the sampled token is thrown away


@dataclass
class PoolingJob:
    """A parsed pooling request: the prompt ids of each engine request, and the function that
    makes the response body from the vectors of those prompts."""

    prompts: list[list[int]]
    # (prompt tokens, response id, each prompt's vector or None) -> the response body
    respond: Callable[[int, str, list[np.ndarray] | None], dict]
    vectors: bool = False  # the body needs each prompt's vector (embeddings)


def hidden_size(ctx: ServeContext) -> int:
    info = ctx.bridge.info or {}
    return int((info.get("model_config") or {}).get("hidden_size") or DEFAULT_DIM)


def unit_vector(ids: list[int], dim: int) -> np.ndarray:
    """The simulator's vector for a prompt: seeded by a hash of its ids, unit length."""
    seed = zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes())
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.float32(np.linalg.norm(v))


def check_ids(s: Served, ids: list[int], param: str) -> None:
    if not ids:
        raise APIError(400, f"{param}: an input may not be empty", param=param)
    check_vocab(ids, s.vocab_size, param)


class PoolingEndpoint:
    """The plain-ASGI handler of one pooling API: ``parse`` turns the body into a PoolingJob."""

    def __init__(self, ctx: ServeContext, api: str, prefix: str,
                 parse: Callable[[bytes, Served, ServeContext], PoolingJob]) -> None:
        self.ctx = ctx
        self.api = api
        self.prefix = prefix
        self.parse = parse

    async def __call__(self, scope, receive, send, arrival: float) -> None:
        try:
            body = await read_body(receive)
            if body is None:
                return
            s = self.ctx.ready()
            info = self.ctx.bridge.info or {}
            if info.get("engine") != "sim" and self.api != "embeddings":
                raise APIError(400, f"/v1/{self.api} is simulated (--engine sim): the torch "
                               "engine's models have no classifier head to score pairs")
            job = self.parse(body, s, self.ctx)
            await self._run(receive, send, job, arrival)
        except APIError as e:  # raised only before a response started
            await send_json(send, e.status, e.body())

    async def _run(self, receive, send, job: PoolingJob, arrival: float) -> None:
        ctx = self.ctx
        trace = RequestTrace(request_id(self.prefix, None), self.api, False, arrival)
        trace.prompt_tokens = sum(len(p) for p in job.prompts)
        trace.inputs = len(job.prompts)
        real = (ctx.bridge.info or {}).get("engine") != "sim"  # torch: the model's vectors
        streams = [ctx.bridge.submit(p, 1, POOLED, pooling=real and job.vectors)
                   for p in job.prompts]
        trace.submitted = streams[0].submitted_s
        trace.engine_id = streams[0].req.request_id
        watcher = asyncio.ensure_future(watch_disconnect(receive, streams))
        try:
            times = await self._prefills(streams, trace)
            if times is None:
                return
            body = job.respond(trace.prompt_tokens, trace.id,
                               self._vectors(job, streams, real) if job.vectors else None)
            trace.first_token, trace.last_token = min(times), max(times)
            trace.finish, trace.status = "stop", 200
            trace.first_token_sent = trace.last_token_sent = await send_json_stamped(
                send, 200, body)
        finally:
            watcher.cancel()
            for st in streams:
                st.close()
            if trace.finish is None:  # cancelled: the server is shutting down
                trace.finish, trace.status = "abort", CLIENT_CLOSED_STATUS
            ctx.log(trace)

    def _vectors(self, job: PoolingJob, streams: list[RequestStream], real: bool) -> list:
        if not real:
            dim = hidden_size(self.ctx)
            return [unit_vector(p, dim) for p in job.prompts]
        out = []
        for st in streams:
            h = st.req.pooled_hidden
            if h is None:  # the runner did not keep it: an engine that cannot pool
                raise APIError(500, "the engine kept no hidden state for this input",
                               type="server_error")
            v = h.numpy().astype(np.float32)
            out.append(v / np.float32(np.linalg.norm(v)))
        return out

    async def _prefills(self, streams: list[RequestStream], trace: RequestTrace) -> list[float] | None:
        """Each input's prefill end (its one token's time); None when the client went away.
        APIError when the engine refused or failed one (the rest are aborted)."""
        times = []
        for st in streams:
            ev = await st.next()
            if isinstance(ev, Admitted):
                if trace.admitted is None:
                    trace.admitted = ev.time_s
                if ev.error is not None:
                    trace.finish, trace.status, trace.error = "rejected", 400, ev.error
                    raise APIError(400, ev.error, code="request_rejected")
                ev = await st.next()
            if ev is CLIENT_GONE:
                trace.finish, trace.status = "abort", CLIENT_CLOSED_STATUS
                return None
            if isinstance(ev, Failed):
                trace.finish, trace.status, trace.error = "error", ev.status, ev.message
                raise APIError(ev.status, ev.message, type="server_error")
            assert isinstance(ev, TokenEvent)
            if trace.queue_exit is None and st.req.first_scheduled_time is not None:
                trace.queue_exit = st.req.first_scheduled_time + (
                    st.submitted_s - st.req.arrival_time)
            times.append(ev.time_s)
        trace.preemptions = sum(st.req.num_preemptions for st in streams)
        return times
