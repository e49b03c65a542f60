"""What a server's cumulative histograms observed during a run, its restarts included.

A Prometheus histogram is a set of counters (a count per bucket bound ``le``, the
observations' sum and count) per label set, and a counter starts again from 0 when the server
restarts. The run's increase is the after-run scrape less the before-run one only when no
label set restarted in between: a restarted server whose counts had climbed past the
baseline's gave a difference that was neither the run's nor the new server's (a server E2EL
mean of 29 ms where the restarted server's own was 239 ms).

The scraper (targets/scrape.py) compares every scrape's ``_count`` (and ``_created``, where a
server exposes it) per label set with the scrape before it; a fall (a new birth time) is a
restart of that label set, and it keeps the last scrape before it. The run's increase is then
the sum over the pieces between restarts, label set by label set, each piece a difference of
two scrapes of one server process (so each is a valid histogram, its buckets cumulative; their
sum is one too): a label set that restarted starts its next piece from 0, the others from the
kept scrape. This is Prometheus' increase() applied to the whole label set at once rather than
to each bucket on its own: a bucket-wise reset test mixes, in one label set, buckets that
already climbed past their old count (read as growth) with buckets that did not (read as a
reset), and the sum is no histogram. What the pieces miss is what the server observed between
the last scrape before a restart and the restart itself (its requests then cut short failed
on the client anyway); the caller compares observations with completed requests.

A piece whose bucket or count still falls (a restart no scrape saw: the server came back and
passed its old count within one scrape interval) has no increase to read; its family is left
out, with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from cbbench.analysis.server_side.prom_text import Dropped, family_of, family_types, parse_sample

# A label set of one family, the bucket bound `le` left out: the unit that restarts.
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]

FELL_UNSEEN = ("its counts fell between two scrapes with no restart seen in between (the "
               "server restarted and passed its old count within one scrape interval)")


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

    def add(self, other: Histogram) -> None:
        for le, n in other.buckets.items():
            self.buckets[le] = self.buckets.get(le, 0.0) + n
        self.sum += other.sum
        self.count += other.count

    def fell(self) -> bool:
        """A difference with a negative bucket or count: no increase of one server."""
        return self.count < 0 or any(n < 0 for n in self.buckets.values())


def series_key(family: str, labels: dict[str, str]) -> SeriesKey:
    return family, tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def series_histograms(text: str, dropped: Dropped | None = None) -> dict[SeriesKey, Histogram]:
    """The page's histograms per label set. Read line by line (prom_text.py): a series without
    `le`, with `le="abc"` or a negative one, or a count that is not a finite number >= 0 is
    dropped and counted in ``dropped``, and the page's other series stand."""
    dropped = dropped if dropped is not None else Dropped()
    lines = text.splitlines()
    types = family_types(lines)
    out: dict[SeriesKey, Histogram] = {}
    for line in lines:
        if not line or line[0] == "#":
            continue
        s = parse_sample(line, dropped)
        if s is None:
            continue
        fam = family_of(s.name, types)
        if fam is None or types.get(fam) != "histogram":
            continue
        key = series_key(fam, s.labels)
        if s.name.endswith("_bucket"):
            le = _bound(s.labels.get("le"))
            if le is None:
                dropped.add("a histogram bucket without a valid le", line)
                continue
            if s.value < 0:
                dropped.add("a negative bucket count", line)
                continue
            h = out.setdefault(key, Histogram())
            h.buckets[le] = h.buckets.get(le, 0.0) + s.value
        elif s.name.endswith("_sum"):
            out.setdefault(key, Histogram()).sum += s.value
        elif s.name.endswith("_count"):
            if s.value < 0:
                dropped.add("a negative histogram count", line)
                continue
            out.setdefault(key, Histogram()).count += s.value
    return out


def histograms(text: str, dropped: Dropped | None = None) -> dict[str, Histogram]:
    """The page's histogram families, summed over the label sets (model names, engines) of
    each."""
    out: dict[str, Histogram] = {}
    for (fam, _), h in series_histograms(text, dropped).items():
        out.setdefault(fam, Histogram()).add(h)
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


@dataclass(frozen=True, slots=True)
class Restart:
    """Label sets that started again between two scrapes: ``before`` is the histograms' text
    of the last scrape before it (the restarted sets' final counts), ``series`` the sets."""

    t_s: float
    before: str
    series: frozenset[SeriesKey]

    @classmethod
    def from_result(cls, d: dict) -> Restart:
        """From the result file's form (MetricsScraper.result: series as [family, labels])."""
        return cls(float(d["t_s"]), str(d["before"]),
                   frozenset(series_key(str(f), dict(ls)) for f, ls in d["series"]))


def run_increase(
    before_text: str | None, after_text: str, restarts: Iterable[Restart] = (),
    dropped: Dropped | None = None,
) -> tuple[dict[str, Histogram], dict[str, str]]:
    """({family: what it observed during the run}, {family: why it has no figure}): the sum
    of the pieces between the restarts (module doc)."""
    dropped = dropped if dropped is not None else Dropped()
    start = series_histograms(before_text, dropped) if before_text else {}
    total: dict[str, Histogram] = {}
    left_out: dict[str, str] = {}
    for r in restarts:
        end = series_histograms(r.before, dropped)
        _add_piece(total, left_out, start, end)
        start = {k: h for k, h in end.items() if k not in r.series}  # restarted: from 0
    _add_piece(total, left_out, start, series_histograms(after_text, dropped))
    for fam in left_out:
        total.pop(fam, None)
    return total, left_out


def _add_piece(total: dict[str, Histogram], left_out: dict[str, str],
               start: dict[SeriesKey, Histogram], end: dict[SeriesKey, Histogram]) -> None:
    for key, h in end.items():
        fam = key[0]
        d = h.since(start.get(key))
        if d.fell() or not (math.isfinite(d.sum) and math.isfinite(d.count)):
            left_out.setdefault(fam, FELL_UNSEEN if d.fell() else "its sum or count overflowed")
            continue
        total.setdefault(fam, Histogram()).add(d)
