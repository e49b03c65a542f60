"""A workload line drawn more than once (--num-requests beyond the workload's size draws with
replacement) is a request of its own: its own id in the result, its own synthetic prompt (text
for an endpoint, token ids for the engine) and its own cancel decision, so a prefix cache finds
nothing to share between two draws of one length-only line (sixth review).

The figures: five length-only lines (300-304 prompt tokens) drawn 20 times share no block, so
the prefix cache hit rate is 0 on the engine and every endpoint answer's cached_tokens is 0
(before: a hit rate of 0.667 on the engine, 15 of 20 answers with 288 of ~300 tokens cached,
the ids [4, 3, 2, 1, 1, 0, 0, 0, 0, 4, ...])."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import sim_options, start_server
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.load.cancel import cancel_plan
from cbbench.load.prompts import build_prompts
from cbbench.load.workload import Workload, WorkloadRequest, load_workload, sample_requests

LINES = 5
DRAWS = 20
FIRST_LEN = 300
OUTPUT_LEN = 10


def _workload_file(tmp_path: Path, lines: int = LINES, output_len: int = OUTPUT_LEN) -> Path:
    p = tmp_path / "small.jsonl"
    p.write_text("".join(json.dumps({"prompt_len": FIRST_LEN + i, "output_len": output_len}) + "\n"
                         for i in range(lines)))
    return p


def _run(*args: str) -> None:
    r = CliRunner().invoke(app, ["run", *args])
    assert r.exit_code == 0, r.output


def test_a_line_drawn_again_gets_an_id_of_its_own(tmp_path):
    w = load_workload(str(_workload_file(tmp_path)))
    reqs, replaced = sample_requests(w, DRAWS, seed=0)
    assert replaced
    ids = [r.id for r in reqs]
    assert len(set(ids)) == DRAWS  # unique in the run
    # The first draw of a line keeps its index; its k-th repeat is index + k * 5, so id % 5
    # names the line (its prompt_len says which).
    first = {}
    for r in reqs:
        first.setdefault(r.id % LINES, r.id)
        assert r.prompt_len == FIRST_LEN + r.id % LINES
    assert sorted(first.values()) == list(range(LINES))
    # The same seed, the same requests (every target, worker, sweep point draws this way).
    assert sample_requests(w, DRAWS, seed=0) == (reqs, True)


def test_a_draw_without_repeats_keeps_the_workload_ids():
    w = Workload("small", [WorkloadRequest(i, 10, 5) for i in range(LINES)])
    reqs, replaced = sample_requests(w, LINES, seed=0)
    assert not replaced and sorted(r.id for r in reqs) == list(range(LINES))
    assert all(r is w.requests[r.id] for r in reqs)  # the very objects: nothing changed


def test_repeats_send_prompts_of_their_own(tmp_path):
    w = load_workload(str(_workload_file(tmp_path)))
    reqs, _ = sample_requests(w, DRAWS, seed=0)
    prompts, kinds = build_prompts(reqs, "completions", seed=0)
    assert kinds == {"synthetic_approx": DRAWS}
    assert len(set(prompts)) == DRAWS
    # Random words per request: two prompts share a block's worth of leading words by chance
    # with probability ~ (1/100)**16, so none do.
    words = [str(p).split() for p in prompts]
    for i in range(DRAWS):
        for j in range(i):
            assert words[i][:16] != words[j][:16]


def test_repeats_hit_nothing_in_the_engines_prefix_cache(tmp_path):
    out = tmp_path / "r.json"
    _run("--engine", "sim", "--workload", str(_workload_file(tmp_path)), "--num-requests",
         str(DRAWS), "--request-rate", "200", "--enable-prefix-caching", "--output", str(out))
    d = json.loads(out.read_text())
    assert d["summary"]["engine"]["prefix_cache_hit_rate"] == 0.0  # was 0.667
    assert d["summary"]["engine"]["prefix_cache_hit_tokens"] == 0
    ids = [q["id"] for q in d["requests"]]
    assert len(set(ids)) == DRAWS


def test_repeats_are_cancelled_each_by_its_own_draw(tmp_path):
    """One line drawn 20 times: ids 0..19 (stride 1), each with its own cancel decision
    (before: one id, so all 20 were cancelled or none were)."""
    out = tmp_path / "c.json"
    _run("--engine", "sim", "--workload", str(_workload_file(tmp_path, 1, 400)), "--num-requests",
         str(DRAWS), "--request-rate", "inf", "--cancel-rate", "0.5", "--cancel-after", "1",
         "--seed", "3", "--output", str(out))
    d = json.loads(out.read_text())
    assert sorted(q["id"] for q in d["requests"]) == list(range(DRAWS))
    plan = cancel_plan(0.5, "1", 3)
    assert plan is not None
    expected = {i for i in range(DRAWS) if plan.cancel_after_s(i) is not None}
    assert 0 < len(expected) < DRAWS
    assert {q["id"] for q in d["requests"] if q.get("cancelled")} == expected


def test_repeats_hit_nothing_in_a_servers_prefix_cache(tmp_path):
    from cbbench.cli.serve import build_serving_engine
    from cbbench.server.app import ServeConfig

    server = start_server(lambda: build_serving_engine(sim_options(enable_prefix_caching=True)),
                          ServeConfig(report_cached_tokens=True))
    try:
        out = tmp_path / "e.json"
        _run("--endpoint", server.url, "--workload", str(_workload_file(tmp_path)),
             "--num-requests", str(DRAWS), "--request-rate", "inf", "--max-concurrency", "1",
             "--save-detailed", "--output", str(out))
    finally:
        server.stop()
    d = json.loads(out.read_text())
    reqs = d["requests"]
    assert len({q["id"] for q in reqs}) == DRAWS
    assert [q["cached_tokens"] for q in reqs] == [0] * DRAWS  # was 288 on 15 of them

