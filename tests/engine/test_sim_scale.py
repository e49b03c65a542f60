"""The simulator's scale paths against its reference paths.

- Fast-forward (Engine.fast_forward over Scheduler.decode_stretch) against --no-fast-forward on 10,000 ShareGPT
  requests: every request's token times, hence TTFT, TPOT and E2EL, identical; every
  iteration record identical.
- The simulator's fast paths through the stepped loop (the counted-token postprocess, the
  replica set's cached next replica) against the general paths they shortcut (the sampled-row
  postprocess the torch engine runs, a fresh scan of every replica before each decision).
- The bounded-error histogram (analysis/summary/histogram.py) against numpy.percentile on the pooled
  ITL of that run: each percentile within the stated relative error.
"""

from __future__ import annotations

import numpy as np
import pytest

from cbbench.analysis.summary.histogram import LogHistogram
from cbbench.analysis.summary.metrics import itl_values_s
from cbbench.engine.args import EngineArgs
from cbbench.load.arrivals import arrival_times
from cbbench.load.workload import load_workload, sample_requests
from cbbench.targets.engine import run_engine


def _run(n: int, ff: bool, **kw):
    wl = load_workload("sharegpt")
    reqs, _ = sample_requests(wl, n, 0)
    arrivals = arrival_times(reqs, 50.0, 1.0, "gamma", 0, None)
    opts = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", fast_forward=ff, **kw)
    return run_engine(opts, reqs, arrivals)


SKIPPED: list[int] = []  # steps each fast-forward call advanced, in the fast-forward run


@pytest.fixture(scope="module")
def runs():
    from cbbench.engine.core.engine import Engine

    real = Engine.fast_forward

    def counting(*args, **kw):
        k = real(*args, **kw)
        SKIPPED.append(k)
        return k

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "fast_forward", counting)
        stepped = _run(10_000, False)
        assert SKIPPED == []  # --no-fast-forward never calls it
        return stepped, _run(10_000, True)


def test_skipped_equals_stepped_on_10k(runs):
    stepped, skipped = runs
    assert len(stepped.records) == len(skipped.records) == 10_000
    for a, b in zip(stepped.records, skipped.records):
        assert a.id == b.id and a.token_times_s == b.token_times_s
        assert (a.ttft_s, a.tpot_s, a.e2el_s) == (b.ttft_s, b.tpot_s, b.e2el_s)
    assert stepped.iterations == skipped.iterations
    assert stepped.duration_s == skipped.duration_s
    # The fast-forward run did advance stretches (not only step): a share of its steps.
    advanced = sum(SKIPPED)
    assert 0.05 * len(skipped.iterations) < advanced < len(skipped.iterations)


def test_data_parallel_skipped_equals_stepped():
    """8 replicas under least-kv (the router reads KV use, which fast-forward changes block by
    block): the same requests on the same replicas at the same times."""
    a = _run(400, False, data_parallel_size=8, router="least-kv")
    b = _run(400, True, data_parallel_size=8, router="least-kv")
    assert [r.token_times_s for r in a.records] == [r.token_times_s for r in b.records]
    assert a.iterations == b.iterations


class _NoDrafts:
    """A drafter that never proposes: the engine takes its general (sampled-row) postprocess,
    with nothing else changed (no drafts are ever scheduled or verified)."""

    def propose(self, req) -> list[int]:
        return []


def test_fast_paths_equal_the_general_paths():
    """8 replicas at 400 req/s (the scale case): every token time and iteration record of the
    default path equals the run with the counted-row postprocess and the cached next replica
    both replaced by their general forms."""
    from cbbench.engine.core.engine import Engine
    from cbbench.engine.sim.replicas import ReplicaSet

    def general(n: int):
        wl = load_workload("sharegpt")
        reqs, _ = sample_requests(wl, n, 0)
        arrivals = arrival_times(reqs, 400.0, 1.0, "gamma", 0, None)
        opts = EngineArgs(engine="sim", gpu="h200", model="llama-3-8b", fast_forward=False,
                          data_parallel_size=8)
        return run_engine(opts, reqs, arrivals)

    fast = general(2_000)
    init, pick = Engine.__init__, ReplicaSet._next_replica
    calls = {"advance_sampled": 0}
    sampled = Engine._advance_sampled

    def init_no_drafts(self, *a, **kw):
        init(self, *a, **kw)
        self.drafter = _NoDrafts()

    def counting_sampled(self, *a, **kw):
        calls["advance_sampled"] += 1
        return sampled(self, *a, **kw)

    def rescan(self):
        self._next_known = False
        return pick(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "__init__", init_no_drafts)
        mp.setattr(Engine, "_advance_sampled", counting_sampled)
        mp.setattr(Engine, "_advance_counted", None)  # would raise if still called
        mp.setattr(ReplicaSet, "_next_replica", rescan)
        ref = general(2_000)
    assert calls["advance_sampled"] == len(ref.iterations) > 2_000
    assert [r.token_times_s for r in fast.records] == [r.token_times_s for r in ref.records]
    assert fast.iterations == ref.iterations
    assert fast.duration_s == ref.duration_s


def test_pooled_itl_percentiles_within_the_stated_error(runs):
    itl_ms = itl_values_s(runs[1].records) * 1e3
    assert itl_ms.size > 1_000_000
    for err in (1e-2, 1e-3):
        h = LogHistogram(err)
        for chunk in np.array_split(itl_ms, 7):  # fed as a stream would feed it
            h.add_many(chunk)
        d = h.distribution((1, 50, 90, 95, 99, 99.9))
        exact = np.percentile(itl_ms, (1, 50, 90, 95, 99, 99.9))
        for p, e in zip((1, 50, 90, 95, 99, 99.9), exact):
            assert abs(d[f"p{p}"] / e - 1) <= err * (1 + 1e-9), (err, p)
        assert d["count"] == itl_ms.size
        assert d["mean"] == pytest.approx(itl_ms.mean(), rel=1e-9)
        assert d["std"] == pytest.approx(itl_ms.std(), rel=1e-6)
        assert len(h.buckets) < 20_000


def test_histogram_error_is_the_bound_not_better_by_luck():
    """A value at a bucket's far edge is off by almost exactly the stated error."""
    h = LogHistogram(0.01)
    edge = h.gamma ** 10  # the top of bucket 10: represented by 2 g^10 / (g + 1)
    h.add_many([edge])
    got = h.percentiles([50])[0]
    assert abs(got / edge - 1) == pytest.approx(0.01, rel=1e-6)


def test_array_path_is_the_stepped_run_on_10k(tmp_path, monkeypatch):
    """Issue 28's scale path end to end: `cbbench run` on 10,000 ShareGPT requests, 8
    replicas at 400 req/s, through the array simulator and its column summary (forced here:
    by default only 50,000+ requests take it) against --no-fast-forward (the object engines,
    every iteration stepped). Every request row (TTFT, TPOT, E2EL, queue time) and every
    iteration record identical (token times: tests/engine/test_array_sim.py); the summary
    identical but for the pooled per-token means and standard deviations, to 1e-9 (their percentiles and counts exact)."""
    import json

    from helpers import assert_same
    from typer.testing import CliRunner

    import cbbench.targets.engine_compact as engine_compact
    from cbbench.cli.app import app

    base = ["run", "--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b", "--workload",
            "sharegpt", "--num-requests", "10000", "--request-rate", "400",
            "--data-parallel-size", "8", "--quiet"]
    took = []
    real = engine_compact.run_engine_compact

    def counted(*a, **kw):
        run = real(*a, **kw)
        took.append(run is not None)
        return run

    monkeypatch.setattr(engine_compact, "run_engine_compact", counted)
    monkeypatch.setattr(engine_compact, "COMPACT_MIN_REQUESTS", 0)
    res = CliRunner().invoke(app, [*base, "--output", str(tmp_path / "array.json")])
    assert res.exit_code == 0, res.output
    assert took == [True]  # the array simulator ran it
    res = CliRunner().invoke(app, [*base, "--no-fast-forward", "--output",
                                   str(tmp_path / "stepped.json")])
    assert res.exit_code == 0, res.output
    assert took == [True]  # --no-fast-forward: the objects, stepped
    fast = json.loads((tmp_path / "array.json").read_text())
    stepped = json.loads((tmp_path / "stepped.json").read_text())
    assert len(fast["requests"]) == 10_000
    assert fast["requests"] == stepped["requests"]
    assert fast["iterations"] == stepped["iterations"]
    assert_same(fast["summary"], stepped["summary"])
