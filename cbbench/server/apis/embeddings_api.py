"""POST /v1/embeddings in OpenAI's shape: ``input`` a string, a list of strings, a list of
token ids or a list of such lists; ``encoding_format`` float (default) or base64 (the float32
little-endian bytes, as the openai SDK asks for by default); the answer (vLLM's
EmbeddingResponse: ``id``, ``created``, ``model``) has ``data`` one
``{"object": "embedding", "embedding", "index"}`` per input, ``usage`` {prompt_tokens,
total_tokens}. Each input is one prefill in the engine; the vectors are the torch engine's
last-token hidden states, or the simulator's stand-ins (server/apis/pooling.py)."""

from __future__ import annotations

import base64
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cbbench.server.apis.pooling import PoolingEndpoint, PoolingJob, check_ids
from cbbench.server.context import ServeContext, Served
from cbbench.server.protocol import APIError, parse_request

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


def _inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    x = req.input
    if isinstance(x, str):
        return [x]
    if not x:
        raise APIError(400, "input: give at least one input", param="input")
    if isinstance(x[0], int):  # one prompt of token ids
        return [list(x)]
    return list(x)


def parse_embeddings(body: bytes, s: Served, ctx: ServeContext) -> PoolingJob:
    req = parse_request(EmbeddingRequest, body)
    ctx.check_model(s, req.model)
    if req.dimensions is not None:
        raise APIError(400, "dimensions is not supported (the vectors have the model's hidden "
                       "size)", param="dimensions")
    inputs = _inputs(req)
    if len(inputs) > MAX_INPUTS:
        raise APIError(400, f"input: at most {MAX_INPUTS} inputs per request", param="input")
    prompts = []
    for i, x in enumerate(inputs):
        ids = s.codec.encode(x) if isinstance(x, str) else x
        check_ids(s, ids, f"input.{i}")
        prompts.append(ids)
    b64 = req.encoding_format == "base64"

    def respond(prompt_tokens: int, rid: str, vectors) -> dict:
        data = [
            {"object": "embedding", "index": i,
             "embedding": (base64.b64encode(v.astype("<f4").tobytes()).decode() if b64
                           else v.tolist())}
            for i, v in enumerate(vectors)
        ]
        return {"id": rid, "object": "list", "created": int(time.time()), "data": data,
                "model": s.name,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}

    return PoolingJob(prompts, respond, vectors=True)


def embeddings_endpoint(ctx: ServeContext) -> PoolingEndpoint:
    return PoolingEndpoint(ctx, "embeddings", "embd", parse_embeddings)
