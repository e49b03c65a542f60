"""Token counts of HTTP requests, each with its source, and whether the server generated what
was asked.

An HTTP server's output length can be known three ways: its `usage` block (exact, when sent),
the number of streamed token events (exact when the server sends one token per event), or the
client re-tokenizing the streamed text (`--tokenizer`; can differ from what the model generated,
because a generated sequence need not be the tokenizer's own encoding of its text). Per
request the count is taken from usage, else from the events when the server was seen to send
one token per event, else from the tokenizer, else from the events unverified. Every count
available is kept beside the one used, and the run says how often they disagree.

One token per event is a property of the server, detected over the run: against usage where
some requests carry it (events == usage), else by tokenizing each event's text on its own
(one token each), on a sample of requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import combinations

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.columns import NOT_ASKED, RequestColumns, as_columns

COUNT_METHODS = ("usage", "events", "tokenizer")
# One token per event when at least this share of the evidence (requests with usage, or events
# tokenized alone) says so: a server that merges a multi-byte character's tokens into one event
# now and then still counts as one-per-event.
ONE_TOKEN_PER_EVENT_SHARE = 0.95
DETECT_SAMPLE_REQUESTS = 64  # requests whose events are tokenized one by one
# Warn when more than this share of requests have counts that disagree between two methods.
DISAGREE_WARN_SHARE = 0.05
# Warn when more than this share of completed requests returned fewer tokens than max_tokens.
SHORT_OUTPUT_WARN_SHARE = 0.05


def one_token_per_event(
    records: Sequence[RequestRecord], events_alone: tuple[int, int] | None = None
) -> dict:
    """Whether the server streams one token per event. `events_alone`: (events tokenized on
    their own, how many of them were exactly one token), when a tokenizer was given."""
    with_usage = [
        counts for r in records
        if r.ok and (counts := r.output_token_counts) and "usage" in counts
    ]
    if with_usage:
        same = sum(counts["usage"] == counts["events"] for counts in with_usage)
        share = same / len(with_usage)
        return {"detected": share >= ONE_TOKEN_PER_EVENT_SHARE, "basis": "usage",
                "share": share, "checked": len(with_usage)}
    if events_alone and events_alone[0]:
        n, single = events_alone
        share = single / n
        return {"detected": share >= ONE_TOKEN_PER_EVENT_SHARE, "basis": "tokenizer",
                "share": share, "checked": n}
    return {"detected": None, "basis": None, "share": None, "checked": 0}


def choose_output_count(rec: RequestRecord, per_event: bool | None) -> None:
    """Set rec.output_tokens (and its method) from rec.output_token_counts."""
    counts = rec.output_token_counts or {}
    if "usage" in counts:
        method = "usage"
    elif per_event or "tokenizer" not in counts:  # None (unknown): see the warnings
        method = "events"
    else:
        method = "tokenizer"
    rec.output_tokens_method = method
    rec.output_tokens = counts.get(method, len(rec.token_times_s))


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Two counting methods over the completed requests that have both (summary.http.
    token_counts.disagreement["B_vs_A"]): how many differ, the mean and largest difference
    (B - A)."""

    requests: int
    disagree: int
    share: float
    mean_diff: float
    max_abs_diff: int


def disagreements(records: Sequence[RequestRecord]) -> dict[str, Disagreement]:
    """For each pair of methods both available on a completed request: how many requests had
    both, how many differ, and the mean and largest difference (second - first)."""
    out: dict[str, Disagreement] = {}
    for a, b in combinations(COUNT_METHODS, 2):
        diffs = [
            r.output_token_counts[b] - r.output_token_counts[a]
            for r in records
            if r.ok and r.output_token_counts and a in r.output_token_counts
            and b in r.output_token_counts
        ]
        if not diffs:
            continue
        differ = sum(d != 0 for d in diffs)
        out[f"{b}_vs_{a}"] = Disagreement(
            requests=len(diffs),
            disagree=differ,
            share=differ / len(diffs),
            mean_diff=sum(diffs) / len(diffs),
            max_abs_diff=max(abs(d) for d in diffs),
        )
    return out


def output_count_summary(records: Sequence[RequestRecord], detection: dict) -> tuple[dict, list[str]]:
    """The summary's token_counts block and the warnings it calls for."""
    done = [r for r in records if r.ok]
    methods: dict[str, int] = {}
    for r in done:
        if r.output_tokens_method is not None:
            methods[r.output_tokens_method] = methods.get(r.output_tokens_method, 0) + 1
    pairs = disagreements(done)
    summary = {
        "output_method": methods,
        "one_token_per_event": detection,
        "disagreement": {name: asdict(d) for name, d in pairs.items()},
        "disagree_warn_share": DISAGREE_WARN_SHARE,
    }
    warnings = []
    for name, d in pairs.items():
        b, a = name.split("_vs_")
        # A server seen to send several tokens per event: its event count is not a token
        # count, and differing from usage or the tokenizer is what the detection found, not a
        # disagreement (24 of 24 requests "disagreed" under --stream-interval 4, counted right).
        events_not_tokens = detection["detected"] is False and "events" in (a, b)
        if d.share > DISAGREE_WARN_SHARE and not events_not_tokens:
            warnings.append(
                f"output token counts disagree: {b} vs {a} differ on {d.disagree} of "
                f"{d.requests} requests (mean {d.mean_diff:+.1f}, max |diff| "
                f"{d.max_abs_diff}); the run counted by "
                + ", ".join(f"{k} ({v})" for k, v in methods.items())
                + " (usage > one-token events > tokenizer)"
            )
    if methods.get("events") and detection["detected"] is None:
        warnings.append(
            f"output tokens of {methods['events']} requests are the number of stream events: "
            "the server sent no usage and nothing shows it sends one token per event; give "
            "--tokenizer with the served model's tokenizer.json to check"
        )
    if detection["detected"] is False and methods.get("events"):
        warnings.append(
            f"the server sends several tokens per stream event ({detection['share']:.0%} of "
            f"events were one token) and no usage: give --tokenizer for output token counts"
        )
    return summary, warnings


@dataclass(frozen=True, slots=True)
class ShortOutputs:
    """summary.short_outputs (as its dict): completed requests that returned fewer output tokens than
    max_tokens asked for, of those that asked (``checked``)."""

    count: int
    share: float
    mean_shortfall: float
    checked: int
    finish_reason_stop: int
    # finish_reason 'length': the server says it stopped at max_tokens, so the shortfall is
    # in the count (events or tokenizer), not in the generation.
    finish_reason_length: int
    warn_share: float = SHORT_OUTPUT_WARN_SHARE

    def to_dict(self) -> dict:
        return asdict(self)


def short_output_figures(run: RequestColumns | Sequence[RequestRecord]) -> ShortOutputs:
    """Completed requests that returned fewer output tokens than max_tokens asked for."""
    cols = as_columns(run)
    checked = cols.ok & (cols.max_tokens != NOT_ASKED)
    short = checked & (cols.output_tokens < cols.max_tokens)
    count, n_checked = int(short.sum()), int(checked.sum())
    shortfall = int((cols.max_tokens[short] - cols.output_tokens[short]).sum())
    return ShortOutputs(
        count=count,
        share=count / n_checked if n_checked else 0.0,
        mean_shortfall=shortfall / count if count else 0.0,
        checked=n_checked,
        finish_reason_stop=int((short & cols.finish_stop).sum()),
        finish_reason_length=int((short & cols.finish_length).sum()),
    )


def short_output_warning(so: ShortOutputs, ignore_eos_sent: bool) -> str | None:
    """The warning ``so`` calls for."""
    if so.share <= SHORT_OUTPUT_WARN_SHARE or not so.checked:
        return None
    early = so.count - so.finish_reason_length
    if early / so.checked <= SHORT_OUTPUT_WARN_SHARE:
        return (
            f"{so.finish_reason_length} of {so.checked} completed requests ended at "
            "max_tokens (finish_reason 'length') but were counted shorter: their output count "
            "is low (see summary.http.token_counts for the methods and how they disagree)"
        )
    head = (
        f"{so.count} of {so.checked} completed requests ({so.share:.0%}) returned "
        f"fewer output tokens than max_tokens (mean shortfall {so.mean_shortfall:.1f} "
        f"tokens; {so.finish_reason_stop} ended with finish_reason 'stop'): "
    )
    if ignore_eos_sent:
        return head + (
            "the server may be ignoring ignore_eos (llama.cpp servers do). Output throughput "
            "and TPOT then cover shorter outputs than the workload asked for. To tell: rerun "
            "with --no-ignore-eos-field (the same shortfall: the field is ignored), and use the "
            "server's own option (llama-server --ignore-eos; see the README's server notes)"
        )
    return head + (
        "ignore_eos was not sent (--no-ignore-eos-field), so requests stop at the end-of-"
        "sequence token; start the server so that it ignores EOS for a fixed-length benchmark"
    )
