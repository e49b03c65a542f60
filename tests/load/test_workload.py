"""Workloads (built-ins, JSONL files, seeded sampling) and open-loop arrival schedules."""

from __future__ import annotations

import csv
import json
import math
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from cbbench.errors import UsageError
from cbbench.load.arrivals import arrival_times, parse_rate, resolve_process
from cbbench.load.workload import (
    Workload,
    WorkloadRequest,
    approx_token_count,
    builtin_names,
    length_stats,
    load_jsonl,
    load_workload,
    sample_requests,
)


# ---- built-ins ------------------------------------------------------------------------------
def test_builtin_names():
    assert builtin_names() == [
        "agentic-coding", "calibration", "long-prompt", "shared-prefix", "sharegpt",
        "sharegpt-multiturn"]


def test_every_builtin_has_a_builder_and_every_builder_a_name():
    """The help's list (load/builtin_names.py) and the loader's builders name the same six."""
    from cbbench.load.builtin_names import BUILTIN_NAMES
    from cbbench.load.workload import BUILTIN_WORKLOADS

    assert list(BUILTIN_NAMES) == builtin_names() == sorted(BUILTIN_WORKLOADS)


def test_sharegpt_loads_every_csv_row():
    text = resources.files("cbbench.workloads").joinpath("sharegpt.csv").read_text()
    rows = list(csv.reader(text.splitlines()))
    assert rows[0] == ["prompt_len", "output_len"]
    body = rows[1:]
    w = load_workload("sharegpt")
    assert w.name == "sharegpt"
    assert len(w.requests) == len(body) > 1000
    assert [r.id for r in w.requests] == list(range(len(body)))
    assert [(r.prompt_len, r.output_len) for r in w.requests[:50]] == [
        (int(p), int(o)) for p, o in body[:50]
    ]
    assert (w.requests[-1].prompt_len, w.requests[-1].output_len) == tuple(map(int, body[-1]))
    assert not w.has_arrivals
    # vLLM's filter holds for every row.
    assert all(
        r.prompt_len >= 4 and r.output_len >= 4 and r.prompt_len <= 1024
        and r.prompt_len + r.output_len <= 2048
        for r in w.requests
    )


def test_long_prompt_builtin():
    w = load_workload("long-prompt")
    assert len(w.requests) == 2000
    assert all(2048 <= r.prompt_len < 6144 and 64 <= r.output_len < 512 for r in w.requests)
    assert w.requests == load_workload("long-prompt").requests  # fixed seed
    st = length_stats(w)
    assert st["count"] == 2000 and st["prompt_len"]["min"] >= 2048


# ---- sampling -------------------------------------------------------------------------------
def test_sampling_is_deterministic_per_seed_and_differs_across_seeds():
    w = load_workload("sharegpt")
    a, ra = sample_requests(w, 200, seed=1)
    b, rb = sample_requests(w, 200, seed=1)
    c, _ = sample_requests(w, 200, seed=2)
    assert a == b and not ra and not rb
    assert [r.id for r in a] != [r.id for r in c]
    assert len({r.id for r in a}) == 200  # without replacement: no repeats


def test_sampling_more_than_exist_uses_replacement():
    w = Workload("small", [WorkloadRequest(i, 10 + i, 5) for i in range(5)])
    reqs, replaced = sample_requests(w, 12, seed=0)
    assert replaced and len(reqs) == 12
    # A line drawn again is a request of its own (id + k * 5 for its k-th repeat): the
    # workload's line is id % 5.
    assert len({r.id for r in reqs}) == 12
    assert all(r.prompt_len == 10 + r.id % 5 for r in reqs)
    again, _ = sample_requests(w, 12, seed=0)
    assert again == reqs
    exact, replaced = sample_requests(w, 5, seed=0)
    assert not replaced and sorted(r.id for r in exact) == list(range(5))


def test_sampling_none_keeps_order_and_bad_counts_are_usage_errors():
    w = Workload("small", [WorkloadRequest(i, 10, 5) for i in range(5)])
    reqs, replaced = sample_requests(w, None, seed=3)
    assert reqs == w.requests and not replaced
    for n in (0, -1):
        with pytest.raises(UsageError, match="--num-requests"):
            sample_requests(w, n, seed=0)


def test_a_timed_trace_is_replayed_in_order():
    w = Workload("trace", [WorkloadRequest(i, 10, 5, arrival_s=float(i)) for i in range(5)])
    assert w.has_arrivals
    reqs, replaced = sample_requests(w, 3, seed=9)
    assert [r.id for r in reqs] == [0, 1, 2] and not replaced
    with pytest.raises(UsageError, match="5 timed requests"):
        sample_requests(w, 6, seed=0)


# ---- JSONL ----------------------------------------------------------------------------------
def _write(tmp_path: Path, lines: list[str], name: str = "w.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_jsonl_with_each_prompt_form(tmp_path):
    p = _write(
        tmp_path,
        [
            json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 4}),
            "",  # blank lines are skipped
            json.dumps({"prompt": "abcdefghijklmnop", "output_len": 2, "priority": -1}),
            json.dumps({"prompt_len": 7, "output_len": 1}),
            json.dumps({"prompt_token_ids": [5, 6], "prompt_len": 2, "output_len": 3}),
        ],
    )
    w = load_workload(str(p))
    assert w.name == "w.jsonl"
    r0, r1, r2, r3 = w.requests
    assert (r0.id, r0.prompt_len, r0.output_len, r0.prompt_token_ids) == (0, 3, 4, (1, 2, 3))
    assert (r1.id, r1.prompt_len, r1.prompt, r1.priority) == (1, 4, "abcdefghijklmnop", -1)
    assert (r2.id, r2.prompt_len, r2.arrival_s) == (2, 7, None)
    assert r3.prompt_len == 2
    assert not w.has_arrivals  # arrival_s on only some lines is refused: test_hostile_input.py


def test_jsonl_text_prompts_use_the_given_counter(tmp_path):
    p = _write(tmp_path, [json.dumps({"prompt": "one two three", "output_len": 2})])
    assert load_jsonl(p, count_tokens=lambda s: len(s.split())).requests[0].prompt_len == 3
    assert approx_token_count("x") == 1 and approx_token_count("a" * 40) == 10


def test_jsonl_trace_with_arrivals(tmp_path):
    p = _write(
        tmp_path,
        [json.dumps({"prompt_len": 4, "output_len": 2, "arrival_s": t}) for t in (1.0, 1.5, 3)],
    )
    w = load_workload(str(p))
    assert w.has_arrivals
    assert [r.arrival_s for r in w.requests] == [1.0, 1.5, 3.0]


GOOD = json.dumps({"prompt_len": 4, "output_len": 2})


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"prompt_len": 4, "output_len": 2', "malformed JSON"),
        ("not json", "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt_len": 4, "output_len": 2, "temperature": 1}', "unknown field"),
        ('{"prompt_len": "4", "output_len": 2}', "'prompt_len' must be an integer, got str"),
        ('{"prompt_len": 4.0, "output_len": 2}', "'prompt_len' must be an integer, got float"),
        ('{"prompt_len": true, "output_len": 2}', "'prompt_len' must be an integer, got bool"),
        ('{"prompt_len": 4, "output_len": "2"}', "'output_len' must be an integer"),
        ('{"prompt_len": 0, "output_len": 2}', "'prompt_len' must be >= 1, got 0"),
        ('{"prompt_len": -3, "output_len": 2}', "'prompt_len' must be >= 1, got -3"),
        ('{"prompt_len": 4, "output_len": 0}', "'output_len' must be >= 1, got 0"),
        ('{"prompt_len": 4, "output_len": -1}', "'output_len' must be >= 1, got -1"),
        ('{"prompt_len": 4}', "missing 'output_len'"),
        ('{"output_len": 4}', "needs one of"),
        ('{"prompt_token_ids": [], "output_len": 2}', "non-empty list"),
        ('{"prompt_token_ids": [1, -2], "output_len": 2}', "non-empty list"),
        ('{"prompt_token_ids": [1, 2.5], "output_len": 2}', "non-empty list"),
        ('{"prompt_token_ids": "123", "output_len": 2}', "non-empty list"),
        ('{"prompt": "", "output_len": 2}', "non-empty string"),
        ('{"prompt": 5, "output_len": 2}', "non-empty string"),
        ('{"prompt_token_ids": [1, 2], "prompt_len": 3, "output_len": 2}', "disagrees"),
        ('{"prompt_len": 4, "output_len": 2, "arrival_s": -1}', "'arrival_s' must be"),
        ('{"prompt_len": 4, "output_len": 2, "arrival_s": "0"}', "'arrival_s' must be"),
        ('{"prompt_len": 4, "output_len": 2, "arrival_s": NaN}', "'arrival_s' must be"),
        ('{"prompt_len": 4, "output_len": 2, "priority": 1.5}', "'priority' must be"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, bad, message):
    # The bad line is line 4 (a blank line in between still counts).
    p = _write(tmp_path, [GOOD, GOOD, "", bad, GOOD])
    with pytest.raises(UsageError) as exc:
        load_workload(str(p))
    text = str(exc.value)
    assert f"{p}:4:" in text, text
    assert message in text, text


def test_jsonl_empty_or_missing_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UsageError, match="holds no requests"):
        load_workload(str(empty))
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n")
    with pytest.raises(UsageError, match="holds no requests"):
        load_workload(str(blank))
    with pytest.raises(UsageError, match="workload file not found"):
        load_workload(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UsageError, match="unknown workload 'nope'"):
        load_workload("nope")
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="cannot read"):
        load_workload(str(binary))


# ---- arrivals -------------------------------------------------------------------------------
def _reqs(n: int, arrivals: list[float] | None = None) -> list[WorkloadRequest]:
    return [
        WorkloadRequest(i, 10, 5, arrival_s=None if arrivals is None else arrivals[i])
        for i in range(n)
    ]


def test_rate_inf_sends_everything_at_zero():
    for process in ("gamma", "constant"):
        t = arrival_times(_reqs(7), math.inf, 1.0, process, seed=0)
        assert t.tolist() == [0.0] * 7


def test_constant_rate_spacing():
    t = arrival_times(_reqs(5), 4.0, 1.0, "constant", seed=0)
    assert t == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_mean_interval_is_one_over_rate(burstiness):
    rate = 5.0
    n = 40_000
    t = arrival_times(_reqs(n), rate, burstiness, "gamma", seed=1)
    assert t[0] == 0.0
    gaps = np.diff(t)
    assert np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    # Gamma with shape k: coefficient of variation 1/sqrt(k) (1 for Poisson).
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


@pytest.mark.parametrize("burstiness", [1e307, 1e308, sys.float_info.max])
def test_a_huge_burstiness_is_the_constant_process(burstiness):
    """rate x burstiness overflowed to inf, the gamma scale became 0 and every request arrived
    at t=0 while the header said 10 req/s. As burstiness grows the gaps tend to 1/rate."""
    t = arrival_times(_reqs(5), 10.0, burstiness, "gamma", seed=0)
    assert t == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4], rel=1e-9)


def test_same_seed_same_schedule():
    a = arrival_times(_reqs(100), 3.0, 1.0, "gamma", seed=5)
    b = arrival_times(_reqs(100), 3.0, 1.0, "gamma", seed=5)
    c = arrival_times(_reqs(100), 3.0, 1.0, "gamma", seed=6)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_trace_uses_the_workloads_own_times():
    t = arrival_times(_reqs(4, [0.0, 0.5, 0.5, 2.25]), math.inf, 1.0, "trace", seed=0)
    assert t.tolist() == [0.0, 0.5, 0.5, 2.25]
    # A trace that starts later is shifted so the first request arrives at t = 0.
    t = arrival_times(_reqs(3, [10.0, 11.0, 13.5]), 2.0, 1.0, "trace", seed=0)
    assert t.tolist() == [0.0, 1.0, 3.5]


def test_gamma_rejects_bad_burstiness():
    with pytest.raises(UsageError, match="burstiness"):
        arrival_times(_reqs(3), 1.0, 0.0, "gamma", seed=0)


@pytest.mark.parametrize(("text", "rate"), [("inf", math.inf), ("2.5", 2.5), ("10", 10.0)])
def test_parse_rate_accepts(text, rate):
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["0", "-1", "abc", "nan", "", "-inf"])
def test_parse_rate_rejects(text):
    with pytest.raises(UsageError, match="invalid request rate"):
        parse_rate(text)


def test_resolve_process():
    assert resolve_process("auto", math.inf, has_trace=True, rate_given=False) == "trace"
    assert resolve_process("auto", 5.0, has_trace=True, rate_given=True) == "gamma"
    assert resolve_process("auto", math.inf, has_trace=False, rate_given=False) == "gamma"
    assert resolve_process("constant", 5.0, has_trace=False, rate_given=True) == "constant"
    assert resolve_process("trace", 5.0, has_trace=True, rate_given=True) == "trace"
    with pytest.raises(UsageError, match="needs a workload"):
        resolve_process("trace", math.inf, has_trace=False, rate_given=False)
    with pytest.raises(UsageError, match="unknown arrival process"):
        resolve_process("poisson", 1.0, has_trace=False, rate_given=True)
