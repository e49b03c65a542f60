"""The exports of fixed results are the bytes the code wrote before the exporter read the
result's model by attribute (issue 36): llm-d's BR0.2 and the CSV pair of a detailed engine
run, and of variants that hold every optional section the exporter reads (an endpoint run,
turns, failed and cancelled requests, parallel sizes, concurrency, workers, distributions
without requests) and the hostile values it cleans (NaN and infinities, lone surrogates, a
start time without a zone).

Regenerate only when a change of the exports is intended, and say so in the commit:
``python tests/cli/test_export_golden.py --write``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from cbbench.export.files import render
from cbbench.schema import parse_run

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURE = DATA / "results" / "run.json"
GOLDEN = DATA / "export_golden.json"
NAN, INF = float("nan"), float("inf")


def _endpoint(d: dict) -> None:
    c = d["config"]
    c.update(target="http", max_concurrency=4, workers={"count": 2}, label="ep",
             cbbench_version="0.0-config")
    for i, r in enumerate(d["requests"]):
        r.update(session_id=i // 2, turn=i % 2, endpoint="http://x/v1")
    d["requests"][1].update(error="HTTP 500", error_type="http")
    d["requests"][2].update(cancelled=True)


def _hostile(d: dict) -> None:
    c = d["config"]
    c.update(tensor_parallel_size=INF, data_parallel_size=NAN, label="run-\ud800",
             workload="sharegpt", request_rate=12.5, max_concurrency=True, workers=3)
    d["started_at"] = "2026-01-02T03:04:05"
    d["cbbench_version"] = "v\udcff"
    s = d["summary"]
    s["duration_s"] = INF
    s["ttft_ms"]["std"] = NAN
    s["output_throughput"] = NAN
    d["requests"][0]["ttft_ms"] = NAN
    d["requests"][3]["e2el_ms"] = INF
    d["requests"][4]["error"] = "\udcff"


def _summary_only(d: dict) -> None:
    """No requests: every statistic from the summary's distributions."""
    del d["requests"], d["iterations"]
    d["config"].update(workload="", engine="torch", device="cuda", data_parallel_size=2,
                       tensor_parallel_size=2.0)
    d["summary"]["failed"] = None  # unknown: left out
    d["summary"].pop("cancelled")
    d["started_at"] = "not a time"


def _no_start(d: dict) -> None:
    del d["started_at"]
    d["summary"]["duration_s"] = 7
    for r in d["requests"]:
        r.pop("itl_ms", None)


VARIANTS: dict[str, Callable[[dict], None]] = {
    "plain": lambda d: None,
    "endpoint": _endpoint,
    "hostile": _hostile,
    "summary_only": _summary_only,
    "no_start": _no_start,
}
FORMATS = ("br0.2", "csv")


def _exports() -> dict[str, str]:
    base = json.loads(FIXTURE.read_text())
    out: dict[str, str] = {}
    for name, mutate in VARIANTS.items():
        data = copy.deepcopy(base)
        mutate(data)
        parse_run(data, name)  # what `cbbench export` reads: a valid result
        for fmt in FORMATS:
            files = render(copy.deepcopy(data), fmt, Path(f"{name}.{fmt}"))
            for path, raw in sorted(files.items()):
                out[f"{name}/{path.name}"] = hashlib.sha256(raw).hexdigest()
    return out


def test_exports_are_the_bytes_written_before():
    assert _exports() == json.loads(GOLDEN.read_text())


def test_the_variants_reach_what_they_vary():
    """The golden bytes would hide a variant that changes nothing: each one's BR0.2 differs
    from the plain run's."""
    got = _exports()
    plain = got["plain/plain.br0.2"]
    assert all(got[f"{n}/{n}.br0.2"] != plain for n in VARIANTS if n != "plain")


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(json.dumps(_exports(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
