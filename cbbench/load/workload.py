"""Workloads: lists of requests (prompt tokens, text or length; output length; arrival time),
or of multi-turn sessions (load/sessions.py).

Built-in workloads install with the package (``cbbench.workloads``); user workloads are JSONL
files whose lines carry ``prompt_token_ids``, ``prompt`` or ``prompt_len``, plus ``output_len``
(none for --api embeddings | rerank) and optionally ``arrival_s``, ``priority``,
``reasoning_len``, ``tools``, ``tool_choice`` (load/output_kinds.py) and ``images``
(load/images.py) -- or, one session per line, ``turns``. Public traces (load/traces.py) are recognized by
their header.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from cbbench.errors import UsageError
from cbbench.load import jsonl
from cbbench.load.images import parse_images
from cbbench.load.jsonl import check_int64, json_ids, json_number, jsonl_lines, jsonl_objects
from cbbench.load.output_kinds import OUTPUT_KIND_FIELDS, parse_output_kind
from cbbench.load.sessions import (
    Session,
    check_unicode,
    draw,
    parse_session,
    sharegpt_multiturn,
)
from cbbench.load.traces import detect_format, load_trace
from cbbench.load.workload_types import Workload, WorkloadRequest

# Without a tokenizer, text prompts are counted at ~4 characters per token (the usual figure for
# English with BPE tokenizers); --tokenizer makes the count exact.
APPROX_CHARS_PER_TOKEN = 4
JSONL_FIELDS = {
    "prompt_token_ids", "prompt", "prompt_len", "output_len", "arrival_s", "priority", "images",
    *OUTPUT_KIND_FIELDS,
}
# --api embeddings | rerank: a workload of inputs and their lengths, no output.
POOLING_NO_OUTPUT = ("'output_len' does not fit --api embeddings or rerank: their workload is "
                     "inputs and their lengths, with no output (drop it)")


# ---- built-in workloads ---------------------------------------------------------------------
def _read_length_csv(filename: str) -> np.ndarray:
    data = resources.files("cbbench.workloads").joinpath(filename).read_text()
    return np.loadtxt(data.splitlines(), delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)


def _sharegpt() -> Workload:
    rows = _read_length_csv("sharegpt.csv")
    reqs = [WorkloadRequest(i, int(p), int(o)) for i, (p, o) in enumerate(rows)]
    return Workload(
        "sharegpt",
        reqs,
        "ShareGPT first-turn (prompt, output) token lengths, Llama-3 tokenizer, vLLM's filter",
    )


LONG_PROMPT_SEED = 20240601
LONG_PROMPT_ROWS = 2000


def _long_prompt() -> Workload:
    """Long prompts (2k-6k tokens) with ShareGPT-like outputs: where prefill-decode
    interference shows, and chunked prefill's effect on TPOT tails with it."""
    rng = np.random.default_rng(LONG_PROMPT_SEED)
    prompts = rng.integers(2048, 6144, LONG_PROMPT_ROWS)
    outputs = rng.integers(64, 512, LONG_PROMPT_ROWS)
    reqs = [WorkloadRequest(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]
    return Workload("long-prompt", reqs, "prompts of 2,048-6,143 tokens, outputs of 64-511")


SHARED_PREFIX_SEED = 20240917
SHARED_PREFIX_GROUPS = 20
SHARED_PREFIX_PER_GROUP = 50
SHARED_PREFIX_SYSTEM_LEN = (1000, 2000)  # [low, high] tokens of each group's system prompt
SHARED_PREFIX_SUFFIX_LEN = (50, 300)  # each request's own question
SHARED_PREFIX_OUTPUT_LEN = (50, 300)
# Token ids below 512 are valid for every preset, the tiny test models included.
SHARED_PREFIX_VOCAB = 512


def _shared_prefix() -> Workload:
    """Groups of requests that share a long system prompt, each with its own suffix: where
    prefix caching pays. Explicit token ids (so the simulator can hash them too), in groups
    of consecutive ids; drawn with a fixed seed."""
    rng = np.random.default_rng(SHARED_PREFIX_SEED)
    reqs: list[WorkloadRequest] = []
    for _ in range(SHARED_PREFIX_GROUPS):
        system = rng.integers(
            0, SHARED_PREFIX_VOCAB, rng.integers(*SHARED_PREFIX_SYSTEM_LEN, endpoint=True)
        ).tolist()
        for _ in range(SHARED_PREFIX_PER_GROUP):
            suffix_len = int(rng.integers(*SHARED_PREFIX_SUFFIX_LEN, endpoint=True))
            ids = tuple(system + rng.integers(0, SHARED_PREFIX_VOCAB, suffix_len).tolist())
            out = int(rng.integers(*SHARED_PREFIX_OUTPUT_LEN, endpoint=True))
            reqs.append(WorkloadRequest(len(reqs), len(ids), out, prompt_token_ids=ids))
    return Workload(
        "shared-prefix",
        reqs,
        f"{SHARED_PREFIX_GROUPS} groups x {SHARED_PREFIX_PER_GROUP} requests sharing a "
        "1,000-2,000-token system prompt, 50-300-token suffixes, 50-300-token outputs",
    )


def _sharegpt_multiturn() -> Workload:
    return Workload(
        "sharegpt-multiturn",
        [],
        "whole ShareGPT conversations as sessions: per-turn user and reply lengths, Llama-3 "
        "tokenizer; each turn resends the history",
        sessions=sharegpt_multiturn(),
    )


AGENTIC_CODING_JSONL = "agentic_coding.jsonl"


def _agentic_coding() -> Workload:
    """Coding-agent sessions drawn from TraceLab's published statistics of Claude Code and
    Codex sessions (workloads/build_agentic_coding.py; its meta file says which figures are
    the source's and which are assumed)."""
    with resources.as_file(resources.files("cbbench.workloads").joinpath(AGENTIC_CODING_JSONL)) as p:
        w = load_jsonl(p)
    return Workload(
        "agentic-coding", [],
        "coding-agent sessions (TraceLab's Claude Code/Codex statistics): a task, tool calls "
        "and results with tool latencies, some fanning out to sub-agents",
        sessions=w.sessions,
    )


def _calibration() -> Workload:
    """Waves of growing size over short to 8k prompts, for `cbbench calibrate`
    (workloads/calibration.py)."""
    from cbbench.workloads.calibration import DESCRIPTION, calibration_rows

    reqs = [WorkloadRequest(i, p, o, arrival_s=t)
            for i, (p, o, t) in enumerate(calibration_rows())]
    return Workload("calibration", reqs, DESCRIPTION)


BUILTIN_WORKLOADS: dict[str, Callable[[], Workload]] = {
    "agentic-coding": _agentic_coding,
    "calibration": _calibration,
    "sharegpt": _sharegpt,
    "sharegpt-multiturn": _sharegpt_multiturn,
    "long-prompt": _long_prompt,
    "shared-prefix": _shared_prefix,
}


def builtin_names() -> list[str]:
    return sorted(BUILTIN_WORKLOADS)


# ---- JSONL files ----------------------------------------------------------------------------
def _int_field(obj: dict, key: str, where: str, minimum: int) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise UsageError(f"{where}: {key!r} must be an integer, got {type(v).__name__}")
    if v < minimum:
        raise UsageError(f"{where}: {key!r} must be >= {minimum}, got {v}")
    return check_int64(v, key, where)


def _output_len(obj: dict, where: str, pooling: bool) -> int:
    """A line's output length; 0 for an embeddings/rerank workload, which has none."""
    if pooling:
        if "output_len" in obj:
            raise UsageError(f"{where}: {POOLING_NO_OUTPUT}")
        return 0
    if "output_len" not in obj:
        raise UsageError(f"{where}: missing 'output_len'")
    return _int_field(obj, "output_len", where, 1)


def _parse_line(obj: object, index: int, where: str, count_tokens, base: Path = Path("."),
                pooling: bool = False) -> WorkloadRequest:
    obj = jsonl.json_object(obj, JSONL_FIELDS, where)
    output_len = _output_len(obj, where, pooling)
    ids = None
    text = None
    if "prompt_token_ids" in obj:
        ids = json_ids(obj, "prompt_token_ids", where)
        prompt_len = len(ids)
    elif "prompt" in obj:
        if "prompt_len" in obj:
            raise UsageError(
                f"{where}: give 'prompt' or 'prompt_len', not both (a text prompt's length is "
                "counted from the text: exactly with --tokenizer)"
            )
        text = obj["prompt"]
        if not isinstance(text, str) or not text:
            raise UsageError(f"{where}: 'prompt' must be a non-empty string")
        check_unicode(text, "prompt", where)
        prompt_len = count_tokens(text)
    elif "prompt_len" in obj:
        prompt_len = _int_field(obj, "prompt_len", where, 1)
    else:
        raise UsageError(f"{where}: needs one of 'prompt_token_ids', 'prompt' or 'prompt_len'")
    if "prompt_len" in obj and ids is not None and obj["prompt_len"] != len(ids):
        raise UsageError(f"{where}: 'prompt_len' disagrees with len(prompt_token_ids)")
    arrival = json_number(obj, "arrival_s", where) if "arrival_s" in obj else None
    priority = 0
    if "priority" in obj:
        p = obj["priority"]
        if isinstance(p, bool) or not isinstance(p, int):
            raise UsageError(f"{where}: 'priority' must be an integer")
        priority = check_int64(p, "priority", where)
    kinds = parse_output_kind(obj, output_len, where)
    images = parse_images(obj["images"], base, where) if "images" in obj else None
    return WorkloadRequest(index, prompt_len, output_len, ids, text, arrival, priority, **kinds,
                           images=images)


def approx_token_count(text: str) -> int:
    return max(1, round(len(text) / APPROX_CHARS_PER_TOKEN))


def load_jsonl(path: Path, count_tokens: Callable[[str], int] = approx_token_count,
               pooling: bool = False,
               count_prompt: Callable[[str], int] | None = None) -> Workload:
    """``pooling``: for --api embeddings | rerank (lines carry no output_len). Text is counted
    by ``count_prompt`` where it is a request's whole prompt (special tokens included, as the
    server counts it: load/prompts.py's length rule) and by ``count_tokens`` where it is a
    session message's content (the chat template adds the rest); ``count_prompt`` defaults to
    ``count_tokens``."""
    reqs: list[WorkloadRequest] = []
    sessions: list[Session] = []
    base = path.parent
    count_prompt = count_prompt or count_tokens
    for where, obj in jsonl_objects(path):
        if isinstance(obj, dict) and "turns" in obj:
            sessions.append(parse_session(obj, len(sessions), where, count_tokens))
        else:
            reqs.append(_parse_line(obj, len(reqs), where, count_prompt, base, pooling))
        if reqs and sessions:
            raise UsageError(f"{where}: a file holds either requests or sessions, not both")
    if sessions:
        _check_all_or_none(path, sessions, "session")
        return Workload(path.name, [], f"JSONL sessions {path.name}", sessions=sessions)
    if not reqs:
        raise UsageError(f"workload file {path} holds no requests")
    _check_all_or_none(path, reqs)
    return Workload(path.name, reqs, f"JSONL file {path.name}")


def _check_all_or_none(path: Path, items, noun: str = "request") -> None:
    """Timestamps on some lines only would be dropped (a replay needs them all): refuse."""
    timed = sum(r.arrival_s is not None for r in items)
    if 0 < timed < len(items):
        first = next(i for i, r in enumerate(items) if r.arrival_s is None)
        raise UsageError(
            f"{path}: {timed} of {len(items)} {noun}s have 'arrival_s' ({noun} {first + 1}, "
            f"line {_line_of(path, first)}, has none): give it on every line or on none"
        )


def _line_of(path: Path, index: int) -> int:
    """The line number of the ``index``-th non-blank line."""
    seen = -1
    for lineno, line in jsonl_lines(path):
        if line.strip():
            seen += 1
            if seen == index:
                return lineno
    return 0


def load_workload(name_or_path: str, count_tokens: Callable[[str], int] = approx_token_count,
                  pooling: bool = False,
                  count_prompt: Callable[[str], int] | None = None) -> Workload:
    """A built-in, a trace or a JSONL file; a JSONL file's text counted as load_jsonl says."""
    if name_or_path in BUILTIN_WORKLOADS:
        return BUILTIN_WORKLOADS[name_or_path]()
    path = Path(name_or_path)
    if path.is_file():
        fmt = detect_format(path)
        if fmt is not None:
            return load_trace(path, fmt)
        if path.suffix == ".csv":
            raise UsageError(
                f"{path}: not a known trace: a CSV needs the header of the Azure LLM inference "
                "trace (TIMESTAMP,ContextTokens,GeneratedTokens) or BurstGPT (Timestamp,Model,"
                "Request tokens,Response tokens,Total tokens,Log Type)"
            )
    if path.suffix in (".jsonl", ".json") or path.exists():
        return load_jsonl(path, count_tokens, pooling, count_prompt)
    raise UsageError(
        f"unknown workload {name_or_path!r}: use a built-in ({', '.join(builtin_names())}), "
        "random, a JSONL file or a trace (Azure, BurstGPT, Mooncake)"
    )


# ---- sampling -------------------------------------------------------------------------------
def sample_requests(
    workload: Workload, num_requests: int | None, seed: int
) -> tuple[list[WorkloadRequest], bool]:
    """Draw ``num_requests`` with ``seed`` (sessions.draw): a trace with timestamps is
    replayed in order, its first N requests. Returns (requests, drawn_with_replacement),
    each request with an id of its own (distinct_ids)."""
    drawn, replaced = draw(workload.requests, num_requests, seed, workload.has_arrivals,
                           "the trace", "requests")
    stride = max((w.id for w in workload.requests), default=-1) + 1
    return distinct_ids(drawn, stride), replaced


def distinct_ids(reqs: list[WorkloadRequest], stride: int = 0) -> list[WorkloadRequest]:
    """Give a request drawn again an id of its own: its k-th repeat (k >= 1, in the order
    drawn) gets ``id + k * stride``, stride one past the workload's largest id (its size
    for a file or a built-in; at least one past the largest id drawn). Everything a run decides
    per request is keyed by its id (synthetic prompt text and token ids, cancel, LoRA adapter,
    a Mooncake prompt's own tail), so two draws of one length-only line were one prompt twice,
    and a prefix cache hit the second whole; the result's records repeated the id. A request
    drawn once keeps its workload index (a draw without repeats is as it was), and
    ``id % stride`` still names the line a repeat came from."""
    ids = {w.id for w in reqs}
    if len(ids) == len(reqs):
        return reqs
    stride = max(stride, max(ids) + 1)
    repeats: dict[int, int] = {}
    out = []
    for w in reqs:
        k = repeats.get(w.id, 0)
        repeats[w.id] = k + 1
        out.append(replace(w, id=w.id + k * stride) if k else w)
    return out


def length_stats(workload: Workload) -> dict:
    p = np.array([r.prompt_len for r in workload.requests])
    o = np.array([r.output_len for r in workload.requests])

    def stats(a: np.ndarray) -> dict:
        return {
            "mean": float(a.mean()),
            "min": int(a.min()),
            "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)),
            "max": int(a.max()),
        }

    return {"count": len(workload.requests), "prompt_len": stats(p), "output_len": stats(o)}
