"""The short views of a run (the slice and by-turn tables, the steady-state and KV transfer
lines, the report's time-slice plot) show one tail percentile: p99, or the highest of the
run's --percentiles where they leave 99 out. With `--percentiles 50,99.9` they printed
"p99 -" and drew an empty p99 line where the result held p99.9; the run table's reasoning
rows were shown only when reasoning_tokens had a p99. Expected values are read from the
result file."""

from __future__ import annotations

import json

import pytest
from helpers import cli_in_process

from cbbench.analysis.comparison.compare import Labeled
from cbbench.analysis.table import latency_table
from cbbench.report.interactive import time_slices
from cbbench.schema import parse_run

SIM = ["run", "--engine", "sim", "--quiet", "--gpu", "h200", "--model", "llama-3-8b"]


def _run(tmp_path, *args: str) -> tuple[str, dict]:
    path = tmp_path / "r.json"
    out = cli_in_process([*SIM, *args, "--output", str(path)])
    assert out.returncode == 0, out.stderr
    return out.stdout, json.loads(path.read_text())


def _f(v: float) -> str:
    return f"{v:,.2f}"


@pytest.mark.parametrize("asked,tail", [
    (None, "p99"), ([50, 90, 95, 99], "p99"), ([50, 99, 99.9], "p99"), ([50, 99.9], "p99.9"),
    ([50, 90], "p90"), ([99.99, 50], "p99.99"),
])
def test_the_tail_is_p99_when_asked_else_the_highest(asked, tail):
    from cbbench.analysis.table_views import tail_of

    assert tail_of({"percentiles": asked}) == tail
    assert tail_of(None) == "p99"


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tail")
    return _run(tmp, "--num-requests", "150", "--request-rate", "20", "--percentiles",
                "50,99.9", "--slice", "2s")


def test_slices_and_steady_line_show_the_asked_tail(sliced):
    text, res = sliced
    s = res["summary"]
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("slice (s)"))
    assert "TTFT p99.9" in lines[head] and "TTFT p99 " not in lines[head]
    first = lines[head + 2].split()  # slice, done, failed, req/s, tok/s, p50, tail, ...
    assert first[5:7] == [_f(s["slices"][0]["ttft_ms"]["p50"]),
                          _f(s["slices"][0]["ttft_ms"]["p99.9"])]
    ss = s["steady_state"]
    assert (f"TTFT p50 {_f(ss['ttft_ms']['p50'])} / p99.9 {_f(ss['ttft_ms']['p99.9'])} ms, "
            f"TPOT p50 {_f(ss['tpot_ms']['p50'])} / p99.9 {_f(ss['tpot_ms']['p99.9'])} ms"
            ) in text
    assert "p99 -" not in text


def test_the_report_draws_and_names_the_asked_tail(sliced):
    _, res = sliced
    plot = time_slices([Labeled("a", parse_run(res, "the result"))])
    tails = [t for t in plot.figure["data"] if t.get("line", {}).get("dash") == "dot"]
    assert [t["name"] for t in tails] == ["a TTFT p99.9"]
    assert tails[0]["y"] == [x["ttft_ms"]["p99.9"] for x in res["summary"]["slices"]]
    assert all(v is not None for v in tails[0]["y"])
    assert "p99.9 (dotted)" in plot.caption


def test_the_report_caption_is_unchanged_for_the_default_percentiles(tmp_path):
    _, res = _run(tmp_path, "--num-requests", "20", "--request-rate", "20", "--slice", "0.5s")
    plot = time_slices([Labeled("a", parse_run(res, "the result"))])
    assert plot.caption.startswith("Per --slice slice: output tokens per second, TTFT p50 "
                                   "(solid) and p99 (dotted) of the requests")


def test_by_turn_table_shows_the_asked_tail(tmp_path):
    text, res = _run(tmp_path, "--workload", "sharegpt-multiturn", "--num-requests", "40",
                     "--request-rate", "10", "--percentiles", "50,99.9")
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("turn "))
    assert lines[head].split()[3:] == ["TTFT", "p50", "TTFT", "p99.9", "TPOT", "p50", "TPOT",
                                       "p99.9"]
    t = res["summary"]["by_turn"][0]
    assert lines[head + 2].split()[3:] == [_f(t["ttft_ms"]["p50"]), _f(t["ttft_ms"]["p99.9"]),
                                           _f(t["tpot_ms"]["p50"]), _f(t["tpot_ms"]["p99.9"])]


def test_kv_transfer_line_shows_the_asked_tail(tmp_path):
    text, res = _run(tmp_path, "--disaggregate", "1:1", "--workload", "long-prompt",
                     "--request-rate", "4", "--num-requests", "40", "--percentiles", "50,99.9")
    kv = res["summary"]["kv_transfer_ms"]
    assert (f"mean {_f(kv['mean'])}, p50 {_f(kv['p50'])}, p99.9 {_f(kv['p99.9'])} "
            f"({kv['count']} requests)") in text


def test_reasoning_rows_show_without_a_p99(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"prompt_len": 16, "output_len": 10, "reasoning_len": 4}) + "\n"
                  + json.dumps({"prompt_len": 16, "output_len": 6}) + "\n")
    text, res = _run(tmp_path, "--workload", str(wl), "--num-requests", "2", "--percentiles",
                     "50,99.9")
    r = res["summary"]["reasoning_tokens"]
    assert "p99" not in r and r["count"] == 1 and r["mean"] == 4
    row = next(line for line in text.splitlines() if line.startswith("reasoning tokens"))
    assert row.split()[2:] == ["4.00", "4.00", "4.00"]  # mean, p50, p99.9
    assert "TTFOT (ms)" in text


def test_reasoning_rows_follow_the_mean_not_a_percentile():
    reasoned = {"mean": 0.04, "p50": 0, "p99.9": 4, "count": 100}  # 1 request in 100
    assert "TTFOT (ms)" in latency_table({"reasoning_tokens": reasoned}, ("mean", "p50", "p99.9"))
    for none in ({"mean": 0.0, "p50": 0, "p99": 0, "count": 5}, {"mean": None, "count": 0}):
        assert "TTFOT" not in latency_table({"reasoning_tokens": none})
