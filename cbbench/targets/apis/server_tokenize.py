"""Synthetic prompts sized exactly with the server's own tokenizer (issue 27, Build 7): without
--tokenizer, a length-only request's word prompt is an approximation (one word = one token, one
BOS assumed: load/prompts.py). A server with vLLM's POST /tokenize (vLLM, `cbbench serve`)
counts a text as it will count the prompt, so before the run's clock starts each such prompt
is counted there and words are dropped or added until it is exactly the workload's prompt_len
(special tokens included, as vLLM bench measures it). A server without /tokenize (404, 405,
an error) leaves the prompts as they were; the result says which sizing was used
(summary.http.prompt_sizing: tokenizer | server_tokenize | approximate).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

from cbbench.load.prompts import WORD_POOL, approx_words, prompt_rng
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.options import redact_url
from cbbench.targets.transport import read_body, within

log = logging.getLogger(__name__)

TOKENIZE_PATH = "/tokenize"
TOKENIZE_TIMEOUT_S = 30.0
TOKENIZE_MAX_BYTES = 8 << 20  # the ids of a long prompt
PARALLEL_TOKENIZE = 16  # counts in flight at once (before the run: no load is measured yet)
MAX_FIT_ROUNDS = 6


class NoTokenize(Exception):
    """The server has no usable /tokenize."""


class ModelRefused(NoTokenize):
    """/tokenize answered, but 404 for the model named (vLLM's and `cbbench serve`'s
    "The model `x` does not exist"): the requests will be refused alike."""


HTTP_NOT_FOUND = 404
MODEL_NOT_FOUND_CODE = "model_not_found"  # cbbench serve's error code; vLLM's message says it


def _model_refused(raw: bytes) -> str | None:
    """A 404 body's message where it says the model does not exist; None for any other 404."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError, RecursionError):
        return None
    msg = err.get("message") if isinstance(err, dict) else None
    if not isinstance(msg, str):
        return None
    if err.get("code") == MODEL_NOT_FOUND_CODE or "does not exist" in msg:
        return msg
    return None


async def _count(session, url: str, model: str | None, text: str) -> int:
    body = {"prompt": text, "add_special_tokens": True, **({"model": model} if model else {})}

    async def go() -> tuple[int, bytes]:
        async with session.post(url, data=json.dumps(body).encode()) as resp:
            return resp.status, await read_body(resp, TOKENIZE_MAX_BYTES)

    try:
        status, raw = await within(go(), TOKENIZE_TIMEOUT_S)
    except Exception as e:  # no server, no route, a timeout: the prompts stay approximate
        raise NoTokenize(f"{type(e).__name__}: {e}") from None
    if status != 200:
        said = _model_refused(raw) if status == HTTP_NOT_FOUND else None
        if said is not None:
            raise ModelRefused(said)
        raise NoTokenize(f"HTTP {status}")
    try:
        count = json.loads(raw)["count"]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested too deep
        raise NoTokenize("no count in its answer") from None
    if type(count) is not int or count < 0:
        raise NoTokenize(f"count {count!r}")
    return count


async def _fit(session, url: str, model: str | None, w: WorkloadRequest, seed: int) -> str:
    rng = prompt_rng(w.id, seed)
    words = approx_words(w.prompt_len, rng)  # the same start as the approximate prompt
    text = " ".join(words)
    for _ in range(MAX_FIT_ROUNDS):
        n = await _count(session, url, model, text)
        if n == w.prompt_len:
            break
        if n > w.prompt_len:  # a pool word is >= 1 token: one word per excess token
            words = words[: max(1, len(words) - (n - w.prompt_len))]
        else:
            words += [WORD_POOL[i] for i in rng.integers(0, len(WORD_POOL), w.prompt_len - n)]
        text = " ".join(words)
    return text  # the run's prompt-token mismatch shows any residue


async def size_with_server(session, base: str, model: str | None,
                           wreqs: Sequence[WorkloadRequest], prompts: list, kinds: dict,
                           seed: int) -> str:
    """Refit the synthetic prompts of ``wreqs`` in ``prompts`` (in place) with the server's
    counts and move them from synthetic_approx to synthetic_server in ``kinds``. Returns the
    sizing used: server_tokenize, or approximate when the server has no /tokenize."""
    synthetic = [i for i, w in enumerate(wreqs) if w.prompt is None and w.token_ids() is None]
    if not synthetic:
        return "approximate"
    url = base + TOKENIZE_PATH
    try:
        await _count(session, url, model, "the")  # a probe: does it answer at all?
    except ModelRefused as e:
        log.info(f"notice: {redact_url(url)} answered that the model {model!r} does not exist "
                 f"({e}): check --served-model; synthetic prompts are approximate")
        return "approximate"
    except NoTokenize as e:
        log.info(f"notice: {redact_url(url)} did not size prompts ({e}): synthetic prompts "
                 "are approximate (one word a token); --tokenizer sizes them exactly")
        return "approximate"
    sem = asyncio.Semaphore(PARALLEL_TOKENIZE)
    fitted = [0]

    async def one(i: int) -> None:
        async with sem:
            prompts[i] = await _fit(session, url, model, wreqs[i], seed)
            fitted[0] += 1

    sizing = "server_tokenize"
    # Every count runs to its end (no task is left writing prompts after this returns).
    failures = [e for e in await asyncio.gather(*(one(i) for i in synthetic),
                                                return_exceptions=True) if e is not None]
    if failures:  # it answered the probe, then stopped: keep what was refitted
        if not all(isinstance(e, NoTokenize) for e in failures):
            raise next(e for e in failures if not isinstance(e, NoTokenize))
        log.info(f"warning: {redact_url(url)} stopped answering while sizing prompts "
                 f"({failures[0]}): {len(failures)} prompts stay approximate")
        sizing = "approximate"
    left = kinds.get("synthetic_approx", 0) - fitted[0]
    kinds.pop("synthetic_approx", None)
    if left > 0:
        kinds["synthetic_approx"] = left
    if fitted[0]:
        kinds["synthetic_server"] = fitted[0]
    return sizing
