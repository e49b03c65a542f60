"""Sweep hygiene (issue 40): each point draws fresh prompts, and `--reset-prefix-cache` calls
the server's `POST /reset_prefix_cache` before each point, against `cbbench serve` with prefix
caching on, read through the server's own counter (usage.prompt_tokens_details.cached_tokens).
"""

from __future__ import annotations

import json

import pytest
from helpers import SERVE_MODEL, free_port, serve_process
from typer.testing import CliRunner

from cbbench.bench.point_prep import PointPrep, point_seed
from cbbench.cli.app import app
from cbbench.errors import UsageError

NUM_REQUESTS = 6
RATES = "20,40"


@pytest.fixture(scope="module")
def caching_server():
    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200",
                       "--enable-prefix-caching") as run:
        yield run


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "w.jsonl"
    # Prompts of several 16-token blocks, short outputs: a point takes a second or so.
    path.write_text("".join(json.dumps({"prompt_len": 96 + 8 * i, "output_len": 4}) + "\n"
                            for i in range(NUM_REQUESTS)))
    return path


def sweep(server, workload, out, *flags: str) -> dict:
    r = CliRunner().invoke(app, [
        "sweep", "--endpoint", server.url, "--workload", str(workload), "--rates", RATES,
        "--num-requests", str(NUM_REQUESTS), "--min-duration", "0", "--out-dir", str(out),
        *flags,
    ])
    assert r.exit_code == 0, r.output
    return json.loads((out / "sweep.json").read_text())


def cached(out, rate: str) -> tuple[int, int]:
    """(the point's first request's cached tokens, the point's total), as the server said."""
    reqs = json.loads((out / f"rate-{rate}.json").read_text())["requests"]
    assert all(r["cached_tokens"] is not None for r in reqs)  # the server reports them
    first = min(reqs, key=lambda r: r["intended_start_s"])
    return first["cached_tokens"], sum(r["cached_tokens"] for r in reqs)


def test_reset_prefix_cache_starts_each_point_from_zero(caching_server, workload, tmp_path):
    # The same prompts at both points, so only the reset keeps point 2 cold.
    reset = sweep(caching_server, workload, tmp_path / "reset", "--reuse-prompts",
                  "--reset-prefix-cache")
    assert reset["points_prep"] == {"fresh_prompts": False, "reset_prefix_cache": True,
                                    "warmup": "sized to each point's concurrency"}
    for p in reset["points"]:
        assert [a["ok"] for a in p["prefix_cache_reset"]] == [True]
        assert p["prefix_cache_reset"][0]["status"] == 200
    first1, total1 = cached(tmp_path / "reset", "20")
    first2, total2 = cached(tmp_path / "reset", "40")
    assert first1 == 0 and first2 == 0
    assert total2 == total1  # the same requests into an empty cache: the same hits
    # Without the reset the second point meets the first one's prompts in the cache.
    warm = sweep(caching_server, workload, tmp_path / "warm", "--reuse-prompts")
    assert "prefix_cache_reset" not in warm["points"][0]
    first2, total2 = cached(tmp_path / "warm", "40")
    assert first2 > 0 and total2 > total1


def test_the_warmup_is_sized_to_the_points_concurrency(caching_server, workload, tmp_path):
    import math

    out = tmp_path / "warmup"
    result = sweep(caching_server, workload, out, "--seed", "777")
    first, second = result["points"]
    # The first point has no latency to size by: one request; the second, Little's law on
    # the first point's median E2EL at its own rate (within its request count).
    assert first["warmup_requests"]["requests"] == 1
    assert first["warmup_requests"]["completed"] == 1
    e2el_s = json.loads((out / "rate-20.json").read_text())["summary"]["e2el_ms"]["p50"] / 1000
    want = max(1, min(math.ceil(40 * e2el_s), NUM_REQUESTS))
    assert second["warmup_requests"]["requests"] == want
    assert second["warmup_requests"]["completed"] == want
    assert "Little's law" in second["warmup_requests"]["basis"]
    # Not in the point's own figures.
    assert second["num_requests"] == NUM_REQUESTS and second["completed"] == NUM_REQUESTS
    skipped = sweep(caching_server, workload, tmp_path / "skip", "--seed", "778",
                    "--skip-warmup")
    assert all("warmup_requests" not in p for p in skipped["points"])
    assert skipped["points_prep"]["warmup"] is None


def test_fresh_prompts_per_point_by_default(caching_server, workload, tmp_path):
    # A seed no other test used: the first point's prompts are new to the server too.
    fresh = sweep(caching_server, workload, tmp_path / "fresh", "--seed", "12345")
    assert fresh["points_prep"]["fresh_prompts"] is True
    seeds = [p["seed"] for p in fresh["points"]]
    assert seeds[0] == 12345 and len(set(seeds)) == 2
    for rate in ("20", "40"):
        assert cached(tmp_path / "fresh", rate) == (0, 0)


def test_point_seeds_are_distinct_and_repeatable():
    seeds = [point_seed(0, i) for i in range(50)]
    assert len(set(seeds)) == 50 and seeds == [point_seed(0, i) for i in range(50)]
    assert all(0 <= s < 2**31 for s in seeds)


def test_a_server_without_the_route_stops_the_sweep_before_it_measures(tmp_path):
    from dataclasses import dataclass

    from cbbench.targets.options import EndpointOptions

    @dataclass
    class Spec:
        endpoint: EndpointOptions
        seed: int = 0

    prep = PointPrep(reset_prefix_cache=True)
    spec = Spec(EndpointOptions(endpoint=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(UsageError, match="reset_prefix_cache failed"):
        prep.before(spec)


def test_reset_prefix_cache_needs_an_endpoint(tmp_path):
    r = CliRunner().invoke(app, ["sweep", "--engine", "sim", "--rates", "1",
                                 "--reset-prefix-cache", "--out-dir", str(tmp_path / "s")])
    assert r.exit_code == 2 and "--reset-prefix-cache" in r.output
