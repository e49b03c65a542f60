"""`cbbench run --replay RESULT.json`: a recorded run's exact requests and arrival times
through the simulator, with the recorded run's scheduling options."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real (torch, CPU) run with Poisson arrivals, 6 sequences at most and one request
    that cannot fit in the context (rejected: it must be rejected again)."""
    d = tmp_path_factory.mktemp("replay")
    rows = [{"prompt_len": 20 + 9 * i, "output_len": 3 + i % 4} for i in range(14)]
    rows.append({"prompt_len": 1000, "output_len": 100})  # > --max-model-len 512
    wl = d / "w.jsonl"
    wl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = d / "real.json"
    r = invoke("run", "--engine", "torch", "--model", "tiny", "--device", "cpu",
               "--workload", str(wl), "--request-rate", "40", "--seed", "3",
               "--max-num-seqs", "6", "--max-model-len", "512", "--max-error-rate", "0.1",
               "--output", str(out))
    assert r.exit_code == 0, r.output
    return out


def request_set(result: dict) -> list[tuple]:
    return [(q["id"], q["prompt_tokens"], q["output_tokens"], q["intended_start_s"], q["error"])
            for q in result["requests"]]


def test_replay_reproduces_the_request_set_and_arrival_times_exactly(real_run, tmp_path):
    out = tmp_path / "replay.json"
    r = invoke("run", "--engine", "sim", "--gpu", "h100", "--replay", str(real_run),
               "--max-error-rate", "0.1", "--output", str(out))
    assert r.exit_code == 0, r.output
    real, sim = json.loads(real_run.read_text()), json.loads(out.read_text())
    assert request_set(sim) == request_set(real)  # ids, lengths, arrivals: exact floats
    assert sum(q["error"] is not None for q in sim["requests"]) == 1  # rejected again
    assert sorted(q["intended_start_s"] for q in real["requests"])[-1] > 0  # not all at t=0
    # The recorded scheduling options, the command line's device.
    cfg = sim["config"]
    assert cfg["engine"] == "sim" and cfg["gpu"] == "h100"
    for key in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "model", "dtype",
                "scheduler", "chunked_prefill", "block_size"):
        assert cfg[key] == real["config"][key], key
    assert cfg["max_num_seqs"] == 6 and cfg["model"] == "tiny"
    for key in ("workload", "seed", "request_rate", "arrival", "num_requests"):
        assert cfg[key] == real["config"][key], key
    assert cfg["replay"] == real_run.name
    # compare puts the two side by side.
    c = invoke("compare", str(real_run), str(out))
    assert c.exit_code == 0, c.output
    assert "TTFT" in c.stdout


def test_replay_rejects_conflicting_and_unusable_input(real_run, tmp_path):
    r = invoke("run", "--engine", "sim", "--replay", str(real_run), "--num-requests", "5",
               "--output", str(tmp_path / "x.json"))
    assert r.exit_code == 2 and "--replay" in r.stderr
    summary_only = tmp_path / "s.json"
    invoke("run", "--engine", "sim", "--num-requests", "5", "--summary-only",
           "--output", str(summary_only))
    r = invoke("run", "--engine", "sim", "--replay", str(summary_only),
               "--output", str(tmp_path / "y.json"))
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "no per-request records" in r.stderr
    interrupted = json.loads(real_run.read_text())
    interrupted["interrupted"] = True
    bad = tmp_path / "i.json"
    bad.write_text(json.dumps(interrupted))
    r = invoke("run", "--engine", "sim", "--replay", str(bad), "--output", str(tmp_path / "z.json"))
    assert r.exit_code == 2 and "interrupted" in r.stderr


def sim_run(tmp_path, *args: str, name: str = "a.json"):
    """A small sim run with --seed 3 (its result's path)."""
    out = tmp_path / name
    r = invoke("run", "--engine", "sim", "--workload", "random", "--input-len", "40",
               "--output-len", "30", "--num-requests", "12", "--request-rate", "50",
               "--seed", "3", *args, "--output", str(out))
    assert r.exit_code == 0, r.output
    return out


def test_replay_runs_on_the_recorded_seed_engine_and_endpoint_alike(tmp_path):
    """The replay's load seed was the recorded one, its engine's and its endpoint's the command
    line's default 0: config engine_seed 0 beside seed 3, and an endpoint replay's synthetic
    prompt text (drawn from the seed and the request id) not the original's."""
    from cbbench.bench.replay import load_replay
    from cbbench.bench.run_spec import RunSpec
    from cbbench.engine.args import EngineArgs
    from cbbench.options import LoadOptions
    from cbbench.targets.options import EndpointOptions

    src = sim_run(tmp_path)
    out = tmp_path / "replay.json"
    assert invoke("run", "--engine", "sim", "--replay", str(src), "--output",
                  str(out)).exit_code == 0
    cfg = json.loads(out.read_text())["config"]
    assert (cfg["seed"], cfg["engine_seed"]) == (3, 3)
    spec = RunSpec.from_options(LoadOptions(replay=src), EngineArgs(engine="sim"))
    spec.endpoint = EndpointOptions("http://127.0.0.1:1")
    replayed = load_replay(str(src), spec.engine).run_spec(spec)
    assert replayed.endpoint is not None and replayed.endpoint.seed == 3
    assert replayed.engine.seed == replayed.load.seed == 3


def test_replay_cancels_what_the_recorded_run_cancelled(tmp_path):
    """A --cancel-rate run replayed: its cancelled requests came back as short requests that
    completed (max_tokens the tokens they had made before their cancel) and none cancelled."""
    src = sim_run(tmp_path, "--cancel-rate", "0.5", "--cancel-after", "20")
    out = tmp_path / "replay.json"
    assert invoke("run", "--engine", "sim", "--replay", str(src), "--output",
                  str(out)).exit_code == 0
    real, again = json.loads(src.read_text()), json.loads(out.read_text())
    keys = ("id", "cancelled", "max_tokens", "output_tokens", "intended_start_s", "e2el_ms")
    assert 0 < real["summary"]["cancelled"] < len(real["requests"])
    assert [[q[k] for k in keys] for q in again["requests"]] == \
        [[q[k] for k in keys] for q in real["requests"]]
    assert again["summary"]["cancelled_work"] == real["summary"]["cancelled_work"]
    assert again["config"]["cancel_after"] == real["config"]["cancel_after"]


def test_a_run_whose_requests_carried_images_is_refused_not_replayed_without_them(tmp_path):
    """A random-mm (or image JSONL) run replayed sent text alone: its records count the
    images, not the images themselves, so the replay silently dropped every one."""
    src = sim_run(tmp_path)
    doc = json.loads(src.read_text())
    doc["requests"][0]["images"] = 1
    src.write_text(json.dumps(doc))
    r = invoke("run", "--engine", "sim", "--replay", str(src), "--output",
               str(tmp_path / "x.json"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "images" in r.stderr, r.output
