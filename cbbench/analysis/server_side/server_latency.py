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
from dataclasses import dataclass, field

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.prom_text import Dropped, family_of, family_types, parse_sample
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
NOTE = (
    "server: vLLM's histograms, the difference between a scrape before the run and one at its "
    "end (every request the server finished meanwhile, other clients' too); p50 interpolated "
    "within buckets (server_p50_bucket: its resolution). client: from the send. diff = client - "
    "server: network, HTTP and client, when the client's p50 lies outside that bucket; diff_mean: "
    "of the means (the server's is exact: _sum / _count), whatever the buckets."
)


@dataclass(slots=True)
class Histogram:
    """One histogram family of a scrape: cumulative count per upper bound ``le`` (s), and the
    observations' sum and count, each summed over the family's label sets."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def since(self, before: Histogram | None) -> Histogram:
        """What was observed between ``before`` (an earlier scrape) and this one."""
        before = before or Histogram()
        return Histogram(
            buckets={le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            sum=self.sum - before.sum,
            count=self.count - before.count,
        )


def histograms(text: str, dropped: Dropped | None = None) -> dict[str, Histogram]:
    """The page's histogram families, summed over the label sets (model names, engines) of
    each. Read line by line (prom_text.py): a series without `le`, with `le="abc"` or a
    negative one, or a count that is not a finite number >= 0 is dropped and counted in
    ``dropped``, and the page's other series stand."""
    dropped = dropped if dropped is not None else Dropped()
    lines = text.splitlines()
    types = family_types(lines)
    out: dict[str, Histogram] = {}
    for line in lines:
        if not line or line[0] == "#":
            continue
        s = parse_sample(line, dropped)
        if s is None:
            continue
        fam = family_of(s.name, types)
        if fam is None or types.get(fam) != "histogram":
            continue
        if s.name.endswith("_bucket"):
            le = _bound(s.labels.get("le"))
            if le is None:
                dropped.add("a histogram bucket without a valid le", line)
                continue
            if s.value < 0:
                dropped.add("a negative bucket count", line)
                continue
            h = out.setdefault(fam, Histogram())
            h.buckets[le] = h.buckets.get(le, 0.0) + s.value
        elif s.name.endswith("_sum"):
            out.setdefault(fam, Histogram()).sum += s.value
        elif s.name.endswith("_count"):
            if s.value < 0:
                dropped.add("a negative histogram count", line)
                continue
            out.setdefault(fam, Histogram()).count += s.value
    return out


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound: a number >= 0 or +Inf; None for anything else."""
    if le is None:
        return None
    try:
        v = float(le)
    except ValueError:
        return None
    return v if v >= 0 and not math.isnan(v) and v != -math.inf else None


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts {le: count}."""
    les = sorted(buckets)
    if not les or not math.isinf(les[-1]):
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
    if not les or buckets[les[-1]] <= 0:
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
    dropped: Dropped | None = None,
) -> dict | None:
    """Server p50/mean beside the client's p50, per quantity vLLM's histograms hold; None when
    the server exposes none of them."""
    dropped = dropped if dropped is not None else Dropped()
    before = histograms(before_text, dropped) if before_text else {}
    after = histograms(after_text, dropped)
    client = _client_values_ms(records)
    out: dict = {}
    for key, names in SERVER_HISTOGRAM_NAMES.items():
        name = next((n for n in names if n in after), None)
        if name is None:
            continue
        d = after[name].since(before.get(name))
        if not (math.isfinite(d.sum) and 0 <= d.count < math.inf):
            # A server restarted between the scrapes (its counts fell), or sums that overflow:
            # no difference to read; the family is left out, not a traceback.
            dropped.add("a histogram whose counts fell or overflowed during the run", name)
            continue
        p50 = histogram_quantile(0.5, d.buckets)
        c = client[key]
        client_p50 = float(np.percentile(c, 50)) if c.size else None
        client_mean = float(c.mean()) if c.size else None
        server_mean = d.sum / d.count * MS if d.count > 0 else None
        server_p50 = p50 * MS if p50 is not None else None
        bucket = quantile_bucket(0.5, d.buckets)
        lo, hi = (bucket[0] * MS, bucket[1] * MS) if bucket else (None, None)
        out[f"{key}_ms"] = {
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
    if not out:
        return None
    out["note"] = NOTE
    return out
