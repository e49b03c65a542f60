"""Reading a server's Prometheus text page defensively, one line at a time.

prometheus_client's parser reads a page as a whole and raises on its first malformed line, so
one bad series (a histogram bucket without `le`, `le="abc"`, a `_count` of +Inf) cost every
other one, and with them a finished run (a traceback, no result file). Here each sample line
is parsed on its own (by the same parser): a line it refuses, or whose value no count or
gauge can hold, is dropped and counted, and the rest stand. What a server sends is input like
any other: a bad series is that series' problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.finite import is_finite

# A series line longer than this is no gauge or counter of a serving engine (a label of
# megabytes); it is dropped unread.
MAX_LINE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Dropped:
    """Series dropped while reading, with the first reason (for one warning line)."""

    count: int = 0
    first: str | None = None
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str, line: str) -> None:
        self.count += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if self.first is None:
            shown = line if len(line) <= 80 else line[:80] + "..."
            self.first = f"{reason}: {shown!r}"


def metric_name(line: str) -> str:
    """The metric name of a sample line or a '# TYPE' line."""
    if line.startswith("# TYPE "):
        return line[7:].split(" ", 1)[0]
    end = len(line)
    for sep in ("{", " "):
        i = line.find(sep)
        if i != -1:
            end = min(end, i)
    return line[:end]


def parse_sample(line: str, dropped: Dropped) -> Sample | None:
    """One sample line as a Sample; None (counted in ``dropped``) when it is malformed or its
    value is not finite (no count, sum or gauge a benchmark reads is NaN or infinite)."""
    from prometheus_client.parser import text_string_to_metric_families

    if len(line) > MAX_LINE_CHARS:
        dropped.add(f"a line longer than {MAX_LINE_CHARS} characters", line)
        return None
    try:
        samples = [s for fam in text_string_to_metric_families(line + "\n") for s in fam.samples]
    except Exception:  # the parser's ValueError, or anything else it raises on garbage
        dropped.add("not a Prometheus sample line", line)
        return None
    if len(samples) != 1:
        dropped.add("not one sample", line)
        return None
    s = samples[0]
    value = s.value
    if not is_finite(value):
        dropped.add("a value that is not a finite number", line)
        return None
    return Sample(s.name, dict(s.labels), float(value))


def family_types(lines) -> dict[str, str]:
    """{family name: type} from the page's '# TYPE NAME TYPE' lines."""
    out: dict[str, str] = {}
    for line in lines:
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                out[parts[2]] = parts[3]
    return out


def family_of(sample_name: str, types: dict[str, str]) -> str | None:
    """The family a sample belongs to: its own name, or the name less a counter's or a
    histogram's suffix, whichever the page typed."""
    if sample_name in types:
        return sample_name
    for suffix in ("_total", "_created", "_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in types:
            return sample_name[: -len(suffix)]
    return None
