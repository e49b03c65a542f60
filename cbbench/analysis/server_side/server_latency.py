"""The server's own latency next to the client's, from vLLM's Prometheus histograms.

vLLM exposes TTFT, inter-token latency, per-request TPOT and end-to-end latency as cumulative
histograms. The difference between a scrape just before the run and one at its end covers the
requests the server finished during the run; its p50 is interpolated within buckets as
Prometheus' histogram_quantile does (linear within the bucket holding the rank; resolution is
the bucket width) and its mean is exact (_sum / _count). Beside each, the client's p50 for the
same quantity, from the send (the server cannot see the client's slot wait or send lag): the
difference is the network and HTTP share (plus the client's own event-loop delays). The
difference of the means (diff_mean) is exact on the server's side, so it resolves a share far
below a bucket's width, where diff_p50 compares with an interpolated figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.histogram_window import (  # noqa: F401 - histograms: re-exported
    Restart,
    histograms,
    run_increase,
)
from cbbench.analysis.server_side.prom_text import Dropped
from cbbench.analysis.summary.metrics import itl_values_s

# What the summary calls each quantity -> the histogram families that hold it, newest name
# first (vLLM renamed time_per_output_token_seconds, a per-token gap, to inter_token_latency).
SERVER_HISTOGRAM_NAMES = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2el": ("vllm:e2e_request_latency_seconds",),
}
# Every family to keep from a scrape.
SERVER_HISTOGRAMS = tuple(name for names in SERVER_HISTOGRAM_NAMES.values() for name in names)
MS = 1000.0
# Prometheus' bucketQuantile answers NaN below this many buckets.
MIN_BUCKETS = 2
# The quantities of which the server makes one observation per request: their counts are
# compared with the run's completed requests.
PER_REQUEST = ("ttft", "e2el")
NOTE = (
    "server: vLLM's histograms, the difference between a scrape before the run and one at its "
    "end, summed over the pieces between the server's restarts (every request the server "
    "finished meanwhile, other clients' too); p50 interpolated "
    "within buckets (server_p50_bucket: its resolution). client: from the send. diff = client - "
    "server: network, HTTP and client, when the client's p50 lies outside that bucket; diff_mean: "
    "of the means (the server's is exact: _sum / _count), whatever the buckets."
)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts {le: count}. None (its
    NaN) without a +Inf bucket or with fewer than two buckets: a lone +Inf bucket says nothing
    of where the observations lie (this gave 0 ms)."""
    les = sorted(buckets)
    if len(les) < MIN_BUCKETS or not math.isinf(les[-1]):
        return None
    total = buckets[les[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_n = 0.0, 0.0
    for le in les:
        n = buckets[le]
        if n >= rank:
            if math.isinf(le):  # in the open-ended bucket: the largest finite bound
                return prev_le
            if n == prev_n:
                return le
            return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
        prev_le, prev_n = le, n
    return prev_le


def quantile_bucket(q: float, buckets: dict[float, float]) -> tuple[float, float] | None:
    """(lower, upper) bounds of the bucket that holds the q-quantile: the resolution of the
    interpolated figure (upper is inf for the open-ended bucket)."""
    les = sorted(buckets)
    if len(les) < MIN_BUCKETS or buckets[les[-1]] <= 0:
        return None
    rank = q * buckets[les[-1]]
    lower = 0.0
    for le in les:
        if buckets[le] >= rank:
            return lower, le
        lower = le
    return lower, math.inf


def _client_values_ms(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    done = [r for r in records if r.ok]
    return {
        "ttft": np.array([r.ttft_from_send_s for r in done if r.send_s is not None]) * MS,
        "itl": itl_values_s(done) * MS,
        "tpot": np.array([r.tpot_s for r in done if r.tpot_s is not None]) * MS,
        "e2el": np.array([r.e2el_from_send_s for r in done if r.send_s is not None]) * MS,
    }


def server_vs_client(
    before_text: str | None, after_text: str, records: Sequence[RequestRecord],
    dropped: Dropped | None = None, restarts: Sequence[Restart] = (),
) -> dict | None:
    """Server p50/mean beside the client's p50, per quantity vLLM's histograms hold; None when
    the server exposes none of them. ``restarts``: where label sets started again between the
    scrapes (histogram_window.py); a family whose counts fell where no restart was seen is
    reported missing, with the reason."""
    dropped = dropped if dropped is not None else Dropped()
    run, left_out = run_increase(before_text, after_text, restarts, dropped)
    client = _client_values_ms(records)
    completed = sum(1 for r in records if r.ok and r.send_s is not None)
    out: dict = {}
    short: list[str] = []
    for key, names in SERVER_HISTOGRAM_NAMES.items():
        name = next((n for n in names if n in run or n in left_out), None)
        if name is None:
            continue
        c = client[key]
        client_p50 = float(np.percentile(c, 50)) if c.size else None
        client_mean = float(c.mean()) if c.size else None
        if name in left_out:
            out[f"{key}_ms"] = {"histogram": name, "missing": left_out[name],
                                "client_p50": client_p50, "client_mean": client_mean}
            continue
        d = run[name]
        p50 = histogram_quantile(0.5, d.buckets)
        server_mean = d.sum / d.count * MS if d.count > 0 else None
        server_p50 = p50 * MS if p50 is not None else None
        bucket = quantile_bucket(0.5, d.buckets)
        lo, hi = (bucket[0] * MS, bucket[1] * MS) if bucket else (None, None)
        entry = {
            "histogram": name,
            "observations": int(d.count),
            "server_p50": server_p50,
            # The bucket the server's p50 lies in: a client p50 inside it differs from the
            # server's by less than the histogram can tell.
            "server_p50_bucket": [lo, hi if hi is None or math.isfinite(hi) else None],
            "client_within_bucket": (
                client_p50 is not None and lo is not None and hi is not None
                and lo <= client_p50 <= hi
            ),
            "server_mean": server_mean,
            "client_p50": client_p50,
            "diff_p50": (
                client_p50 - server_p50 if client_p50 is not None and server_p50 is not None
                else None
            ),
            "client_mean": client_mean,
            "diff_mean": (
                client_mean - server_mean
                if client_mean is not None and server_mean is not None else None
            ),
        }
        if key in PER_REQUEST:
            # One observation per request: fewer than the run completed means the server's
            # window is not the run's (part of it unread, or another server behind the URL).
            entry["client_requests"] = completed
            if d.count < completed:
                short.append(f"{key.upper()} {int(d.count)} < {completed}")
        if server_mean is None:
            entry["missing"] = "the server observed none during the run"
        out[f"{key}_ms"] = entry
    if not out:
        return None
    said = []
    if restarts:  # (their times and label sets: the result's server_histograms.restarts)
        said.append("the server restarted during the run (seen at t="
                    + ", ".join(f"{r.t_s:.1f}" for r in restarts) + " s): its histograms are "
                    "summed over the pieces between")
    if short:
        said.append(
            "the server's histograms hold fewer observations than the run completed requests ("
            + ", ".join(short) + "): they miss part of the run (a scrape missed, a restart, or "
            "not every server behind the URL), so client - server compares different requests"
        )
    if said:
        out["warning"] = "; ".join(said)
    out["note"] = NOTE
    return out


def run_server_latency(
    hist: dict | None, scrapes: dict, records: Sequence[RequestRecord], dropped: Dropped,
) -> dict | None:
    """summary.http.server_latency of a run from its scraper's result (targets/scrape.py):
    server_vs_client over the run's scrapes, or {"missing": why, "note"} when the histograms'
    last scrape was not taken after the run (the figures would be some earlier window's: a
    scrape that failed at the end silently served as "after", a p50 of 19 ms beside the
    client's 542 from 25 of 60 requests); None when nothing was read."""
    if not hist:
        return None
    if not hist.get("complete", True):  # results written before the key: complete
        last = hist.get("after_t_s")
        why = ("the scrape after the run failed" if not scrapes.get("gave_up")
               else "the scraper gave up after repeated failures")
        at = f" (the last good one at t={last:.1f} s)" if isinstance(last, (int, float)) else ""
        return {"missing": f"{why}{at}: the server's histograms miss the requests that "
                           "finished after it", "note": NOTE}
    if hist.get("restarts_beyond_cap"):
        return {"missing": f"the server restarted more than {len(hist.get('restarts') or [])} "
                           "times during the run", "note": NOTE}
    restarts = [Restart.from_result(r) for r in hist.get("restarts") or []]
    return server_vs_client(hist["before"], hist["after"], records, dropped, restarts)
