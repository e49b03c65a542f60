"""What an endpoint run sent beside its prompts' text (issue 26): the embeddings and rerank
APIs' inputs and input throughput, the images of chat requests and the prompt tokens they cost,
and the request payload's bytes.

- ``--api embeddings | rerank``: one JSON answer per request, so a request has a latency
  (``e2el_ms``: intended start to the answer's last byte) and no stream: its one "token" time
  is the answer's end, so TTFT equals E2EL and TPOT/ITL are empty (kept, so every reader of a
  result finds its keys; ``e2el_ms`` is the figure). ``input_throughput``: prompt tokens per second of the run,
  counted by the server's usage when every completed request carried one, else the workload's
  count for all; ``total_input_tokens`` and ``total_token_throughput`` on the same basis;
  ``usage``: the server's own totals; ``inputs``: the inputs (rerank: documents) sent.
- ``images`` (requests that carried images): images, their encoded bytes, and the prompt
  tokens split into image and text where the server's usage tells the image share
  (``prompt_tokens_details.image_tokens``, cbbench serve's extension); null where it does not.
- ``request_bytes``: the request bodies' sizes, total and per request (base64 images make them
  large: a client cost the send lag shows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.metrics import distribution


def pooling_figures(summary: dict, records: Sequence[RequestRecord], duration_s: float) -> None:
    """input_throughput, inputs and usage; and the run's input tokens on the same basis as
    input_throughput: the server's usage where every completed request carried one (what the
    server embedded or scored; vLLM's benchmark takes usage.prompt_tokens as an embeddings
    request's prompt length), else the workload's count for all. The totals were the
    workload's beside a usage-based input_throughput: two input rates in one table (4,384.0
    and 4,315.5 tok/s) of a run with no output."""
    done = [r for r in records if r.ok]
    dur = duration_s if duration_s > 0 else float("inf")
    server = [r.server_prompt_tokens for r in done if r.server_prompt_tokens is not None]
    if done and len(server) == len(done):
        summary["total_input_tokens"] = sum(server)
        summary["total_token_throughput"] = (
            summary["total_input_tokens"] + summary["total_output_tokens"]) / dur
    summary["input_throughput"] = summary["total_input_tokens"] / dur
    summary["inputs"] = sum(r.inputs or 0 for r in done)
    summary["usage"] = {
        "prompt_tokens": sum(server),
        "requests_with_usage": len(server),
        "requests": len(done),
    }


def image_figures(records: Sequence[RequestRecord]) -> dict | None:
    with_images = [r for r in records if r.images]
    if not with_images:
        return None
    done = [r for r in with_images if r.ok]
    known = [r for r in done if r.image_tokens is not None and r.server_prompt_tokens is not None]
    sizes = [r.image_bytes for r in with_images if r.image_bytes is not None]
    out: dict = {
        "requests": len(with_images),
        "images": sum(r.images or 0 for r in with_images),
        "image_bytes": sum(sizes) if len(sizes) == len(with_images) else None,
        # The server's split of the prompt tokens (completed requests whose usage told it).
        "requests_with_image_tokens": len(known),
        "image_tokens": sum(r.image_tokens or 0 for r in known) if known else None,
        "text_tokens": sum((r.server_prompt_tokens or 0) - (r.image_tokens or 0)
                           for r in known) if known else None,
    }
    if known:
        out["image_tokens_per_request"] = distribution([r.image_tokens or 0 for r in known])
    return out


def request_bytes(records: Sequence[RequestRecord]) -> dict | None:
    sizes = [r.request_bytes for r in records if r.request_bytes is not None]
    if not sizes:
        return None
    a = np.asarray(sizes, dtype=np.float64)
    return {"total": int(a.sum()), **distribution(a)}


def add_input_figures(summary: dict, records: Sequence[RequestRecord], duration_s: float,
                      pooling: bool) -> None:
    if pooling:
        pooling_figures(summary, records, duration_s)
    images = image_figures(records)
    if images is not None:
        summary["images"] = images
    payload = request_bytes(records)
    if payload is not None:
        summary["request_bytes"] = payload
