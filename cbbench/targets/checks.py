"""After an HTTP run: each request's token counts from what its stream carried, and what the run
says about itself (send lag, prompt and output counts, short outputs), with the console
warnings a user comparing two servers needs. The counting rules are in
analysis/summary/token_counts.py; this module feeds them the streams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeGuard

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.prom_text import Dropped
from cbbench.analysis.server_side.server_latency import run_server_latency
from cbbench.analysis.summary.token_counts import (
    COUNT_METHODS,
    choose_output_count,
    one_token_per_event,
    output_count_summary,
    short_output_figures,
    short_output_warning,
)
from cbbench.load.prompts import count_tokens
from cbbench.targets.event_counts import (
    EVENT_COUNT_METHODS,
    ONE_PER_EVENT,
    REASONING_ABOVE_COMPLETION,
    RUNNING_NOT_RISING,
    count_events,
    encode_texts,
    utf8_safe,
)
from cbbench.targets.options import EndpointOptions, redact_url
from cbbench.targets.scrape import warning as scrape_warning
from cbbench.targets.sse import SseStream

log = logging.getLogger(__name__)

TOKEN_COUNT_METHODS = COUNT_METHODS

# The client fell behind when its send lag passes either limit (then TTFT/E2EL include
# client-side delay, and the figures describe the load generator as much as the server).
LAG_P50_LIMIT_MS = 10.0
LAG_P99_LIMIT_MS = 100.0
# Warn when the server's prompt counts differ from the workload's by more than this (mean).
MISMATCH_WARN_TOKENS = 2.0
MISMATCH_WARN_FRACTION = 0.02
MS = 1000.0


# No model's context holds more tokens: a usage count beyond it (or below 0, or a bool) is not
# a count. A server's `completion_tokens: -5` gave a negative throughput, 10**30 one of 7e31
# tok/s and `true` was stored as the count; such a usage is ignored like a missing one.
MAX_USAGE_TOKENS = 2**31 - 1


def _is_count(v: object) -> TypeGuard[int]:
    return type(v) is int and 0 <= v <= MAX_USAGE_TOKENS


# vLLM's --enable-per-request-metrics block, as the record keeps it (schema/run.py
# ServerTiming): a field is kept when it is a number a timing or a rate can be, 0 up to this
# (a NaN compares False, an inf is above it). A text, a list or -5 there lost the whole run:
# the result refused it after every request had completed.
MAX_SERVER_TIMING = 1e12
# count_request's notes (StreamNotes kinds) besides count_events' own.
METRICS_DROPPED = "metrics_dropped"
USAGE_ZERO = "usage_zero"
EMPTY_PAST_MAX = "empty_past_max_tokens"
NOTE_EXAMPLE_CHARS = 60  # of a dropped value, in its warning


def server_timing(metrics: dict | None) -> tuple[dict | None, list[str]]:
    """The metrics fields a record keeps (None: none), and the names of those dropped."""
    if metrics is None:
        return None, []
    kept, dropped = {}, []
    for k, v in metrics.items():
        if type(v) in (int, float) and 0 <= v <= MAX_SERVER_TIMING:
            kept[k] = v
        else:
            dropped.append(k)
    return kept or None, dropped


class StreamNotes:
    """What the requests of one run set aside of what their streams said (a malformed metrics
    block, running usage that is not counts, usage that contradicts the stream): a warning
    line a kind for the run at its end, not one per request."""

    __slots__ = ("counted", "seen")

    def __init__(self) -> None:
        self.counted = 0  # requests counted
        self.seen: dict[str, list] = {}  # kind -> [requests, the first one's detail]

    def add(self, kind: str, detail: Callable[[], str]) -> None:
        """One more request of `kind`; `detail` says what it sent (asked of the first only)."""
        if kind in self.seen:
            self.seen[kind][0] += 1
        else:
            self.seen[kind] = [1, detail()]

    def absorb(self, other: StreamNotes) -> None:
        """Another process's notes of the same run (a worker's): counts summed, the first
        detail of each kind kept, so the parent says one line a kind over every request."""
        self.counted += other.counted
        for kind, (n, detail) in other.seen.items():
            if kind in self.seen:
                self.seen[kind][0] += n
            else:
                self.seen[kind] = [n, detail]

    def warnings(self) -> list[str]:
        out = []
        for kind, (n, detail) in self.seen.items():
            share = f"{n} of {self.counted} requests"
            out.append(NOTE_LINES[kind].format(share=share, detail=detail))
        return out


NOTE_LINES = {
    METRICS_DROPPED: (
        "{share} carried a per-request metrics block (--enable-per-request-metrics) with "
        "fields that are not timings ({detail}): left out of their server_timing"
    ),
    RUNNING_NOT_RISING: (
        "output token counts disagree: {share} carried running usage "
        "(continuous_usage_stats) that did not rise with their text events ({detail}): not "
        "counts, so their tokens per event were counted by --tokenizer, else one per event"
    ),
    EMPTY_PAST_MAX: (
        "output token counts disagree: {share} sent empty-text events that would count more "
        "tokens than the max_tokens they asked for ({detail}): not the pieces of split "
        "characters but padding, so not counted as tokens (with no usage, their output is "
        "their text events; --tokenizer counts the text itself)"
    ),
    USAGE_ZERO: (
        "output token counts disagree: {share} carried usage that contradicts their stream "
        "({detail}): ignored, their output counted by the stream events or --tokenizer"
    ),
    REASONING_ABOVE_COMPLETION: (
        "output token counts disagree: {share} carried usage with more reasoning_tokens than "
        "completion_tokens ({detail}): ignored, their reasoning tokens counted from the stream"
    ),
}


def _shown(v: object) -> str:
    text = ascii(v)
    return text if len(text) <= NOTE_EXAMPLE_CHARS else text[:NOTE_EXAMPLE_CHARS] + "..."


def _count_text(tokenizer, text: str) -> int:
    try:
        return count_tokens(tokenizer, text)
    except TypeError:  # a lone surrogate the tokenizer refuses (event_counts.utf8_safe)
        return count_tokens(tokenizer, utf8_safe(text))


def count_request(rec: RequestRecord, st: SseStream, tokenizer, sample: bool,
                  notes: StreamNotes | None = None) -> str:
    """Put the stream's counts on its record (output_token_counts, server_prompt_tokens,
    finish_reason, server_request_id) the moment the request ends, with a provisional output count (usage, else
    tokenizer, else events; the run-level choice in finish_http_run replaces it). `sample`:
    also tokenize each event alone (`one_token_events`: how many were one token). `notes`:
    the run's, for what the stream said that was set aside. Returns the provisional method."""
    notes = StreamNotes() if notes is None else notes
    notes.counted += 1
    counts = {"events": event_count(rec, st)}
    usage = st.usage or {}
    sp, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if _is_count(sp):
        rec.server_prompt_tokens = sp
    if not _is_count(ct):
        ct = None
    elif ct == 0 and rec.token_times_s:  # a text event carries a token: 0 cannot be right
        notes.add(USAGE_ZERO, lambda: f"completion_tokens 0 over {len(rec.token_times_s)} "
                                      "text events")
        ct = None
    else:
        counts["usage"] = ct
    if "usage" not in counts and counts["events"] < len(rec.token_times_s) + st.empty_events:
        empty = st.empty_events  # what event_count left out, said where it is the count
        notes.add(EMPTY_PAST_MAX, lambda: f"{len(rec.token_times_s)} text and {empty} empty "
                                          f"events for max_tokens {rec.max_tokens}")
    if tokenizer is not None and st.pieces:
        counts["tokenizer"] = _count_text(tokenizer, "".join(st.pieces))
        if sample and rec.ok:
            encoded = encode_texts(tokenizer, st.pieces)
            counts["one_token_events"] = sum(len(e.ids) == 1 for e in encoded)
    rec.output_token_counts = counts
    rec.finish_reason = st.finish_reason
    rec.server_request_id = st.response_id
    rec.server_timing, dropped = server_timing(st.server_metrics)
    if dropped:
        metrics = st.server_metrics or {}
        notes.add(METRICS_DROPPED,
                  lambda: ", ".join(f"{k}={_shown(metrics[k])}" for k in dropped))
    for kind in count_events(rec, st, tokenizer, ct):
        notes.add(kind, partial(_note_detail, kind, st, usage, ct))
    if rec.images:  # a cbbench serve extension: the prompt tokens the images cost
        details = usage.get("prompt_tokens_details")
        n = details.get("image_tokens") if isinstance(details, dict) else None
        rec.image_tokens = n if _is_count(n) else None
    choose_output_count(rec, per_event=None)
    method = rec.output_tokens_method
    assert method is not None  # choose_output_count always sets one
    return method


def event_count(rec: RequestRecord, st: SseStream) -> int:
    """The stream's token events: its text events and its empty-text ones (a token that ends
    inside a multi-byte character: llama.cpp and vLLM send it with text ""). Where the empty
    ones would carry the count past the max_tokens the request sent, they cannot all be
    tokens (a server that pads its stream with empty chunks: 12 text events and 11 empty ones
    read as 23 tokens for max_tokens 12, throughput twice and TPOT half the truth), and none
    is counted (count_request warns once a run where no usage gave the count instead)."""
    text, empty = len(rec.token_times_s), st.empty_events
    if not empty or rec.max_tokens is None or text + empty <= rec.max_tokens:
        return text + empty
    return text


def _note_detail(kind: str, st: SseStream, usage: dict, completion: int | None) -> str:
    """What the first request of a count_events note sent."""
    if kind == RUNNING_NOT_RISING:
        return f"completion_tokens {_shown(st.running)} over {len(st.running)} text events"
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return f"reasoning_tokens {reasoning}, completion_tokens {completion}"


def count_outputs(records: Sequence[RequestRecord]) -> tuple[dict, list[str]]:
    """Choose each request's output count for the run; the summary block and its warnings."""
    sampled = [
        r.output_token_counts for r in records
        if r.output_token_counts and "one_token_events" in r.output_token_counts
    ]
    events_alone = (
        (sum(c["events"] for c in sampled), sum(c["one_token_events"] for c in sampled))
        if sampled else None
    )
    detection = one_token_per_event(records, events_alone)
    for rec in records:
        if rec.output_token_counts is not None:
            choose_output_count(rec, detection["detected"])
    return output_count_summary(records, detection)


def event_count_methods(records: Sequence[RequestRecord]) -> tuple[dict, str | None]:
    """How the completed requests' tokens per event were counted, and a warning when some were
    taken as one per event although usage shows more tokens than events."""
    done = [r for r in records if r.ok and r.event_tokens_method is not None]
    methods = {m: sum(r.event_tokens_method == m for r in done) for m in EVENT_COUNT_METHODS}
    under = [
        r for r in done if r.event_tokens_method == ONE_PER_EVENT
        and (r.output_token_counts or {}).get("usage", 0) > len(r.token_times_s)
    ]
    warning = None
    if under:
        warning = (
            f"{len(under)} of {len(done)} requests had more tokens (usage) than stream events, "
            "and the server sent no running usage (stream_options.continuous_usage_stats): "
            "tokens per event were taken as 1, so per-token ITL (itl_ms) is an event gap "
            "there; give --tokenizer to count each event's tokens"
        )
    return {m: v for m, v in methods.items() if v}, warning


def send_lag_check(lags_ms: Sequence[float]) -> dict:
    """p50/p99 of the send lag, and whether the client fell behind its schedule."""
    if not len(lags_ms):
        return {"send_lag_p50_ms": None, "send_lag_p99_ms": None, "client_fell_behind": False}
    p50, p99 = (float(v) for v in np.percentile(np.asarray(lags_ms, dtype=np.float64), [50, 99]))
    out: dict[str, float | bool | str] = {
        "send_lag_p50_ms": p50,
        "send_lag_p99_ms": p99,
        "client_fell_behind": p50 > LAG_P50_LIMIT_MS or p99 > LAG_P99_LIMIT_MS,
    }
    if out["client_fell_behind"]:
        out["client_fell_behind_message"] = (
            f"the client fell behind its arrival schedule: send lag p50 {p50:.1f} ms, p99 "
            f"{p99:.1f} ms (limits {LAG_P50_LIMIT_MS:g} / {LAG_P99_LIMIT_MS:g} ms). Latencies count "
            "from the intended start and include this lag; lower --request-rate or run the "
            "client on a less loaded machine."
        )
    return out


def prompt_mismatch(records: Sequence[RequestRecord]) -> dict | None:
    """Workload prompt length vs the server's usage.prompt_tokens."""
    pairs = [
        (r.prompt_tokens, r.server_prompt_tokens)
        for r in records
        if r.server_prompt_tokens is not None
    ]
    if not pairs:
        return None
    d = np.array([s - p for p, s in pairs], dtype=np.float64)
    return {
        "requests": len(pairs),
        "mean_diff": float(d.mean()),
        "mean_abs_diff": float(np.abs(d).mean()),
        "max_abs_diff": float(np.abs(d).max()),
    }


def _large_mismatch(mismatch: dict, records: Sequence[RequestRecord]) -> bool:
    mean_prompt = sum(r.prompt_tokens for r in records) / max(1, len(records))
    return mismatch["mean_abs_diff"] > max(
        MISMATCH_WARN_TOKENS, MISMATCH_WARN_FRACTION * mean_prompt
    )


def prompt_counts(records: Sequence[RequestRecord], opts: EndpointOptions) -> tuple[dict, list[str]]:
    """How prompt tokens were counted, per completed request: the server's usage, else (chat)
    the tokenizer's chat template around the prompt, else the workload's count; and warnings.
    The summary's input tokens stay the workload's, the same for every server (embeddings
    and rerank: the server's usage, analysis/summary/inputs.py pooling_figures)."""
    done = [r for r in records if r.ok]
    methods = {"usage": 0, "chat_template": 0, "workload": 0}
    added = []
    for r in done:
        templated = (r.prompt_token_counts or {}).get("chat_template")
        if r.server_prompt_tokens is not None:
            methods["usage"] += 1
        elif templated is not None:
            methods["chat_template"] += 1
        else:
            methods["workload"] += 1
        if templated is not None:
            added.append(templated - r.prompt_tokens)
    info: dict = {
        "prompt_method": {k: v for k, v in methods.items() if v},
        "workload_counted_by": "tokenizer" if opts.tokenizer else "approximate (no --tokenizer)",
    }
    if added:
        info["chat_template_tokens_added_mean"] = sum(added) / len(added)
    warnings = []
    mismatch = prompt_mismatch(records)
    if mismatch is not None:
        info["prompt_tokens_mismatch"] = mismatch
        if opts.api == "completions" and _large_mismatch(mismatch, records):
            warnings.append(
                f"the server counted prompts differently from the workload (mean "
                f"|diff| {mismatch['mean_abs_diff']:.1f} tokens); give --tokenizer with the "
                "served model's tokenizer.json for exact prompt lengths"
            )
    if opts.api == "chat" and methods["workload"]:
        warnings.append(
            f"the server sent no usage: prompt token counts of {methods['workload']} requests "
            "are the workload's and leave out what the server's chat template adds (9 tokens "
            "per request on Llama-3); --tokenizer with a tokenizer_config.json beside it counts "
            "them with its chat template"
        )
    return info, warnings


def error_rate(records: Sequence[RequestRecord]) -> float:
    """Failed / sent, for --max-error-rate (0.0 when nothing was sent)."""
    return sum(r.error is not None for r in records) / len(records) if records else 0.0


def finish_http_run(
    opts: EndpointOptions,
    records: list[RequestRecord],
    methods: dict[str, int],
    prompt_kinds: dict[str, int],
    total: int,
    info: dict,
) -> dict:
    """The run-level figures (into `info`) and warnings, from the records of the requests that
    were sent out of `total`: one process's run, or several workers' merged
    (cbbench/distributed), so both report the same way. `methods`: the provisional count
    methods the requests reported; the run's own choice (output_method, over the records'
    counts) replaces them wherever the records carry their counts."""
    counts, warnings = count_outputs(records)
    if not counts["output_method"]:  # records made elsewhere, without their counts
        counts["output_method"] = {k: v for k, v in methods.items() if v}
    counts["tokens_per_event_method"], event_warning = event_count_methods(records)
    if event_warning:
        warnings.append(event_warning)
    prompt, prompt_warnings = prompt_counts(records, opts)
    for key in ("prompt_method", "workload_counted_by", "chat_template_tokens_added_mean"):
        if key in prompt:
            counts[key] = prompt.pop(key)
    if prompt_kinds.get("synthetic_server") and not opts.tokenizer:
        counts["workload_counted_by"] = "server /tokenize"
    info.update(
        target="http",
        endpoint=",".join(redact_url(u) for u in opts.endpoint.split(",")),
        api=opts.api,
        prompt_kinds=prompt_kinds,
        token_count_method=counts["output_method"],  # the older field: completed, by method
        token_counts=counts,
        not_sent=total - len(records),
        # The client's own lag: from when it was ready (a freed slot under a cap).
        **send_lag_check([(r.send_s - r.ready_s) * MS for r in records if r.send_s is not None]),
        **prompt,
    )
    if info["client_fell_behind"]:
        log.info("warning: " + info["client_fell_behind_message"])
    if info.get("client_bound"):
        log.info("warning: " + info["client_bound_message"])
    short = short_output_warning(short_output_figures(records), opts.ignore_eos_field)
    for line in ([short] if short else []) + warnings + prompt_warnings:
        log.info("warning: " + line)
    if "server_metrics_scrapes" in info:
        _server_metrics(info, records)
    return info


def _server_metrics(info: dict, records: Sequence[RequestRecord]) -> None:
    """One warning line for a scrape that failed or kept nothing; the server's own latency
    beside the client's when it exposes vLLM's histograms."""
    line = scrape_warning(info["server_metrics_scrapes"], info.get("server_metrics") or [])
    if line:
        log.info("warning: " + line)
    hist = info.get("server_histograms")
    scrapes = info["server_metrics_scrapes"]
    dropped = Dropped(scrapes.get("dropped_series", 0), scrapes.get("dropped_first"))
    latency = None
    try:
        latency = run_server_latency(hist, scrapes, records, dropped)
    except Exception as e:  # noqa: BLE001 - what a server sent never costs the run
        log.info(f"warning: --scrape-metrics: the server's latency histograms could not be "
                 f"read ({type(e).__name__}: {e}); server_latency left out")
    if latency is not None:
        info["server_latency"] = latency
        if latency.get("warning"):  # a window short of the run: said, not only stored
            log.info("warning: --scrape-metrics: " + latency["warning"])
    scrapes["dropped_series"] = dropped.count
    scrapes["dropped_first"] = dropped.first
    if dropped.count:  # one line for every malformed series of the run
        log.info(f"warning: --scrape-metrics: dropped {dropped.count} malformed /metrics "
               f"series (first: {dropped.first}); the others are kept")
