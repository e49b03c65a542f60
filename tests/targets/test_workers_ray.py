"""--ray: the same workers as Ray actors, on a local Ray instance (the first test lets cbbench
start and shut down its own; the rest share one started for the module: ray.init takes ~5-10 s
here, the runs ~2 s each). Same result shape and accuracy as --workers
at 200 req/s, clock offsets measured and recorded, and an actor killed mid-run accounted for.

Marked `ray`; skipped where Ray is not installed, except in CI (CI=true), where .ci/run
installs it and a missing Ray is a failure."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from fake_openai import FakeOpenAI
from helpers import invoke_app
from timing_server import fetch_log, timing_server
from worker_runs import (
    ATTEMPTS,
    ITL_MS,
    TTFT_MS,
    TTFT_P50_BOUND_MS,
    accurate_or_flagged,
    assert_accurate_or_flagged,
    assert_exactly_once,
    run_args,
    ttft_check,
    write_workload,
)

from cbbench.cli.run import WORKER_LOST_EXIT
from cbbench.distributed.merge import WORKER_LOST
from cbbench.distributed.ray_pool import NAMESPACE
from cbbench.load.arrivals import arrival_times

pytestmark = pytest.mark.ray

if os.environ.get("CI"):
    import ray  # noqa: F401  (CI installs it: this test must run there)
else:
    ray = pytest.importorskip("ray")

RATE = 200
NUM_REQUESTS = 200  # 1 s
RAY_CPUS = 2
POLL_S = 0.05
KILL_TIMEOUT_S = 60.0
SESSIONS = 4


def test_ray_started_by_cbbench_runs_whole_sessions(tmp_path):
    """No Ray instance yet: cbbench starts a local one (its own ray.init) and shuts it down
    after the run. A multi-turn run, so each actor gets whole sessions."""
    if ray.is_initialized():  # left by another module: this test is about cbbench's own init
        ray.shutdown()
    out = tmp_path / "sessions.json"
    with FakeOpenAI() as fake:
        res = invoke_app([
            "run", "--workload", "sharegpt-multiturn", "--endpoint", fake.url, "--api", "chat",
            "--num-requests", str(SESSIONS), "--request-rate", "20", "--think-time", "exp:10",
            "--workers", "2", "--ray", "--output", str(out),
        ])
    assert res.exit_code == 0, res.output
    assert not ray.is_initialized()  # shut down by the run that started it
    r = json.loads(out.read_text())
    s = r["summary"]
    assert r["config"]["ray"] is True and r["config"]["workers"] == 2
    assert s["completed"] == s["sessions"]["turns_planned"] == len(r["requests"])
    assert s["sessions"]["completed"] == SESSIONS and s["failed"] == 0
    assert sorted(q["id"] for q in r["requests"]) == list(range(len(r["requests"])))
    owners: dict = {}
    for q in r["requests"]:
        owners.setdefault(q["session_id"], set()).add(q["worker"])
    assert owners == {i: {i % 2} for i in range(SESSIONS)}
    assert all(w["node"] and w["same_node_as_driver"] for w in s["workers"])


def test_sweep_with_ray_starts_one_instance_for_every_point(tmp_path, monkeypatch):
    if ray.is_initialized():
        ray.shutdown()
    inits = []
    real_init = ray.init
    monkeypatch.setattr(ray, "init", lambda *a, **kw: inits.append(kw) or real_init(*a, **kw))
    n = 6
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"s{i}", "output_len": 2}) + "\n"
                          for i in range(n)))
    out = tmp_path / "sweep"
    with FakeOpenAI() as fake:
        res = invoke_app([
            "sweep", "--endpoint", fake.url, "--workload", str(wl), "--rates", "20,40",
            "--num-requests", str(n), "--max-requests", str(n), "--min-duration", "0",
            "--workers", "2", "--ray", "--out-dir", str(out),
        ])
    assert res.exit_code == 0, res.output
    assert len(inits) == 1 and not ray.is_initialized()
    points = [json.loads(p.read_text()) for p in out.glob("rate-*.json")]
    assert len(points) == 2
    for p in points:
        assert p["config"]["ray"] is True and p["config"]["workers"] == 2
        assert p["summary"]["completed"] == n
        assert [q["worker"] for q in p["requests"]] == [i % 2 for i in range(n)]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module; runs find it initialized and leave it up."""
    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, namespace=NAMESPACE, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server():
    with timing_server(TTFT_MS, ITL_MS) as url:
        yield url


def test_ray_workers_same_shape_and_accuracy(local_ray, server, tmp_path):
    wl = write_workload(tmp_path / "r.jsonl", "r", NUM_REQUESTS)
    reports = []
    verdicts = []
    for attempt in range(ATTEMPTS):
        out = tmp_path / f"ray-{attempt}.json"
        res = invoke_app(
            run_args(server, wl, out, NUM_REQUESTS, RATE, "--workers", "2", "--ray")
        )
        assert res.exit_code == 0, res.output
        r = json.loads(out.read_text())
        assert_exactly_once(r, NUM_REQUESTS, 2)
        assert r["config"]["ray"] is True and r["config"]["workers"] == 2
        expected = arrival_times([None] * NUM_REQUESTS, RATE, 1.0, "gamma", 3)
        assert [q["intended_start_s"] for q in r["requests"]] == expected.tolist()
        for w in r["summary"]["workers"]:
            # One node: the shared clock is used as is; the round-trip measurement agrees
            # with offset 0 within its own uncertainty.
            assert w["node"] and w["same_node_as_driver"] is True
            assert w["clock_offset_ms"] == 0.0 and w["clock_flagged"] is False
            assert abs(w["clock_measured_offset_ms"]) <= w["clock_measured_uncertainty_ms"] + 0.01
            assert 0 < w["clock_rtt_ms"] < 1000
        client, srv, report = ttft_check(r, fetch_log(server), "r")
        reports.append(report)
        print(report)
        verdicts.append(accurate_or_flagged(r, client, srv))
        if abs(client - srv) < TTFT_P50_BOUND_MS:
            break
    assert_accurate_or_flagged(verdicts, reports)


def _kill_one_actor(url: str, prefix: str, count: int, killed: list) -> None:
    """Once `count` requests of the run reached the server, kill the run's worker 1 actor."""
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while time.monotonic() < deadline:
        if sum(k.startswith(prefix) for k in fetch_log(url)) >= count:
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
            target = [n for n in names if n.startswith("worker-") and n.endswith("-1")]
            if target:
                ray.kill(ray.get_actor(target[0], namespace=NAMESPACE))
                killed.append(target[0])
                return
        time.sleep(POLL_S)


def test_ray_actor_killed_mid_run_is_accounted_for(local_ray, server, tmp_path):
    n = 600  # 3 s at 200 req/s
    wl = write_workload(tmp_path / "rk.jsonl", "rk", n)
    out = tmp_path / "ray-killed.json"
    killed: list[str] = []
    killer = threading.Thread(target=_kill_one_actor, args=(server, "rk", 150, killed))
    killer.start()
    res = invoke_app(run_args(server, wl, out, n, RATE, "--workers", "2", "--ray"))
    killer.join()
    assert killed, "no actor was killed"
    assert res.exit_code == WORKER_LOST_EXIT, res.output
    r = json.loads(out.read_text())
    s = r["summary"]
    dead = [w for w in s["workers"] if w["status"] == "died"]
    assert len(dead) == 1 and dead[0]["worker"] == 1
    assert s["completed"] + s["failed"] + s["not_sent"] == n
    assert dead[0]["sent"] + dead[0]["not_sent"] == n // 2 and dead[0]["not_sent"] > 0
    assert s["workers"][0]["completed"] == n // 2
    lost = [q for q in r["requests"] if q["error_type"] == WORKER_LOST]
    assert len(lost) == dead[0]["lost"]
