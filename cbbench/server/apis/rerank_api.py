"""POST /v1/rerank in the Cohere/Jina shape vLLM serves (vllm/entrypoints/openai/protocol.py:
RerankRequest, RerankResponse): ``query``, ``documents`` (strings, or ``{"text": ...}``),
``top_n`` (0 or absent: all), ``return_documents``; the answer's ``results`` sorted by
``relevance_score``, each ``{"index", "document": {"text"}, "relevance_score"}``, and
``usage`` {prompt_tokens, total_tokens}.

As a cross-encoder reranker does, each (query, document) pair is one prefill of the query's
tokens followed by the document's (vLLM counts usage over those pairs: the query once per
document). The score is the simulator's: the sigmoid of the scaled dot product of the query's
and the document's deterministic vectors (server/apis/pooling.py), a number in (0, 1) that is the
same on every run and means nothing more.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cbbench.server.apis.pooling import (
    PoolingEndpoint,
    PoolingJob,
    check_ids,
    hidden_size,
    unit_vector,
)
from cbbench.server.context import ServeContext, Served
from cbbench.server.protocol import APIError, parse_request

MAX_DOCUMENTS = 1000


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    text: str


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    query: str
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(None, ge=0)
    return_documents: bool = True


def relevance(q: np.ndarray, d: np.ndarray) -> float:
    """sigmoid(sqrt(dim) * q.d): two random unit vectors' dot product is ~N(0, 1/dim)."""
    return 1.0 / (1.0 + math.exp(-float(np.dot(q, d)) * math.sqrt(q.size)))


def parse_rerank(body: bytes, s: Served, ctx: ServeContext) -> PoolingJob:
    req = parse_request(RerankRequest, body)
    ctx.check_model(s, req.model)
    if len(req.documents) > MAX_DOCUMENTS:
        raise APIError(400, f"documents: at most {MAX_DOCUMENTS} per request", param="documents")
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    query = s.codec.encode(req.query)
    check_ids(s, query, "query")
    prompts = []
    docs = []
    for i, t in enumerate(texts):
        doc = s.codec.encode(t, add_special_tokens=False)
        check_ids(s, doc, f"documents.{i}")
        docs.append(doc)
        prompts.append(query + doc)
    dim = hidden_size(ctx)

    def respond(prompt_tokens: int, rid: str, vectors) -> dict:
        qv = unit_vector(query, dim)
        scored = sorted(
            ((relevance(qv, unit_vector(d, dim)), i) for i, d in enumerate(docs)),
            key=lambda x: (-x[0], x[1]),
        )
        if req.top_n:
            scored = scored[: req.top_n]
        results = []
        for score, i in scored:
            r: dict = {"index": i, "relevance_score": score}
            if req.return_documents:
                r["document"] = {"text": texts[i]}
            results.append(r)
        return {"id": rid, "model": s.name, "results": results,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}

    return PoolingJob(prompts, respond)


def rerank_endpoint(ctx: ServeContext) -> PoolingEndpoint:
    return PoolingEndpoint(ctx, "rerank", "rerank", parse_rerank)
