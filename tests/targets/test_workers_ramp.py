"""--workers 2 with --ramp: the ramp's schedule is computed once, in the parent, and dealt; the
merged schedule is the one-process ramp schedule, request for request."""

from __future__ import annotations

import json
import math

from fake_openai import FakeOpenAI
from helpers import invoke_app

from cbbench.load.arrivals import arrival_times, count_within, parse_ramp

RAMP = "10:50:1"  # 10 -> 50 req/s over 1 s: ~30 requests
SEED = 7
FILE_REQUESTS = 100


def _run(url: str, wl, out, *extra: str) -> dict:
    res = invoke_app([
        "run", "--endpoint", url, "--workload", str(wl), "--ramp", RAMP, "--seed", str(SEED),
        "--output", str(out), *extra,
    ])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_two_workers_send_the_one_process_ramp_schedule(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"r{i}", "output_len": 2}) + "\n"
                          for i in range(FILE_REQUESTS)))
    with FakeOpenAI() as fake:
        one = _run(fake.url, wl, tmp_path / "one.json")
        two = _run(fake.url, wl, tmp_path / "two.json", "--workers", "2")
    assert two["config"]["workers"] == 2 and two["config"]["ramp"] == one["config"]["ramp"]
    sched = [(r["id"], r["intended_start_s"]) for r in two["requests"]]
    assert sched == [(r["id"], r["intended_start_s"]) for r in one["requests"]]
    # ... and that schedule is the ramp's own: the arrivals before its end, drawn at this seed.
    ramp, process = parse_ramp(RAMP), one["config"]["arrival"]
    n = count_within(ramp.seconds, math.inf, 1.0, process, SEED, ramp)
    assert len(sched) == n > 10
    expected = arrival_times([None] * n, math.inf, 1.0, process, SEED, ramp)
    assert [t for _, t in sched] == expected.tolist()
    assert [r["worker"] for r in two["requests"]] == [i % 2 for i in range(n)]
    assert two["summary"]["completed"] == n == sum(w["sent"] for w in two["summary"]["workers"])
