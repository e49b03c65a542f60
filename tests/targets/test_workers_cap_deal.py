"""--max-concurrency with --workers: one global cap, split into each worker's slots, and the
requests dealt in proportion to those slots, so every slot stays busy to the end as under one
process's cap. Dealt evenly (request i to worker i mod N), `--max-concurrency 3 --workers 2`
gave worker 0 two slots and worker 1 one, each 20 of 40 requests: worker 1 ran alone at
concurrency 1 for the last 2.7 s, 5.27 s and 7.59 req/s where one process took 3.47 s,
11.54 req/s."""

from __future__ import annotations

import json

import pytest
from helpers import invoke_app
from timing_server import timing_server

from cbbench.distributed.local import plan_workers
from cbbench.distributed.plan import deal, slot_owners
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.options import EndpointOptions

TTFT_MS, ITL_MS = 20.0, 5.0
N, CAP = 24, 3
# Output lengths 2-18: one process's cap keeps its 3 slots busy to ~0.50 s; dealt evenly the
# worker with one slot took ~0.75 s, dealt by count alone (2:1) ~0.58 s.
OUTPUT_LENS = [2 + (i * i) % 17 for i in range(N)]
WITHIN = 1.1  # the two-worker duration against one process's


def test_requests_are_dealt_in_proportion_to_each_workers_slots():
    assert slot_owners(2, 3) == [0, 1, 0] and slot_owners(3) == [0, 1, 2]
    shares = deal(40, 2, max_concurrency=3)
    assert [len(s) for s in shares] == [27, 13]  # 2 slots : 1 slot
    assert sorted(i for s in shares for i in s) == list(range(40))
    assert deal(7, 3) == deal(7, 3, max_concurrency=3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert [len(s) for s in deal(100, 4, max_concurrency=10)] == [30, 30, 20, 20]
    # With output lengths: each request to the slot with the least work dealt so far
    # (output tokens plus one), as a global cap gives it the first slot to free. Slots 0 and 2
    # are worker 0's: the long request 0 fills slot 0 while slots 1 and 2 take the rest.
    assert deal(6, 2, max_concurrency=3, output_lens=[10, 1, 1, 1, 1, 1]) == [[0, 2, 4], [1, 3, 5]]
    # Sessions: whole sessions, in proportion to the slots too.
    keys = [f"s{i % 6}" for i in range(18)]  # 6 sessions of 3 turns
    sessions = deal(18, 2, keys, max_concurrency=3)
    assert [len(s) for s in sessions] == [12, 6]


def test_each_worker_gets_its_slots_and_the_requests_that_fill_them():
    wreqs = [WorkloadRequest(i, 5, 2) for i in range(40)]
    opts = EndpointOptions("http://127.0.0.1:1", max_concurrency=3)
    tasks, merger = plan_workers(opts, wreqs, [0.0] * 40, 2, 1.0)
    assert [t.opts.max_concurrency for t in tasks] == [2, 1]
    assert [len(t.positions) for t in tasks] == [27, 13]
    # The schedule is the run's: each request keeps its id and intended start.
    assert sorted(w.id for t in tasks for w in t.wreqs) == list(range(40))


@pytest.fixture(scope="module")
def server():
    with timing_server(TTFT_MS, ITL_MS) as url:
        yield url


def _run(server: str, tmp_path, workers: int) -> dict:
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"cap{i} go", "output_len": n}) + "\n"
                          for i, n in enumerate(OUTPUT_LENS)))
    out = tmp_path / f"w{workers}.json"
    res = invoke_app(["run", "--endpoint", server, "--workload", str(wl), "--num-requests",
                      str(N), "--max-concurrency", str(CAP), "--workers", str(workers),
                      "--output", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())["summary"]


def test_two_workers_hold_the_one_process_figures_under_a_cap(server, tmp_path):
    one = _run(server, tmp_path, 1)
    two = _run(server, tmp_path, 2)
    assert one["completed"] == two["completed"] == N
    ideal_s = sum(TTFT_MS + (n - 1) * ITL_MS for n in OUTPUT_LENS) / CAP / 1000
    assert one["duration_s"] >= ideal_s  # busy slots cannot beat their work
    report = (f"one process {one['duration_s']:.3f} s, {one['request_throughput']:.2f} req/s; "
              f"two workers {two['duration_s']:.3f} s, {two['request_throughput']:.2f} req/s; "
              f"ideal {ideal_s:.3f} s")
    print(report)
    assert two["duration_s"] < WITHIN * one["duration_s"], report
    assert sum(w["sent"] for w in two["workers"]) == N
