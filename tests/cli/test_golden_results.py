"""Golden results: a fixed-seed run of the simulator (the default fast-forwarding engine, the
engine stepped one iteration at a time, two data-parallel replicas under KV pressure, a
disaggregated pair) and of the torch engine on the CPU (the tiny model) gives today the result
that tests/data/golden_results.json recorded on the code before issue 36's refactors.

What is compared: the simulator's result as written, less what names the moment or the command
(started_at, config.command, cbbench_version); its iteration records as their count and a hash
(they are most of the file). The torch run's clock is the host's, so from it only what the
scheduler decides: every request's token counts and outcome, every iteration's batch shape and
KV use, the config, and the summary's counts.

Regenerate (only when a change of results is intended, and say so in the commit):
``python tests/cli/test_golden_results.py --write``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_results.json"

SIM = ["run", "--engine", "sim", "--gpu", "h100", "--model", "llama-3-8b",
       "--workload", "sharegpt", "--num-requests", "40", "--request-rate", "20", "--seed", "7"]
RUNS = {
    "sim": SIM,
    "sim_no_fast_forward": [*SIM, "--no-fast-forward"],
    # Preemptions and chunked prefills in two replicas behind the router.
    "sim_dp2_kv_pressure": [*SIM, "--data-parallel-size", "2", "--num-kv-blocks", "120",
                            "--max-num-batched-tokens", "512"],
    "sim_disaggregated": [*SIM, "--disaggregate", "1:1"],
    # Every request at t=0, so the batches do not depend on the host's speed.
    "torch_cpu": ["run", "--engine", "torch", "--device", "cpu", "--model", "tiny",
                  "--workload", "random", "--input-len", "40", "--output-len", "6",
                  "--num-requests", "8", "--request-rate", "inf", "--seed", "7",
                  "--max-num-seqs", "4"],
}
VOLATILE = ("started_at", "cbbench_version")
# The torch run's iteration fields that the host's clock sets.
HOST_TIMED = {"start_s", "duration_s", "achieved_bw_gbps"}


def _digest(rows: list) -> dict:
    text = json.dumps(rows, sort_keys=True)
    return {"count": len(rows), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def _counts(tree):
    """A summary's integer leaves (counts of requests, tokens, preemptions): the torch run's
    floats are timings or divide by one."""
    if isinstance(tree, dict):
        kept = {k: _counts(v) for k, v in tree.items()}
        return {k: v for k, v in kept.items() if v is not None and v != {}}
    if isinstance(tree, bool) or (isinstance(tree, int) and not isinstance(tree, float)):
        return tree
    return None


def normalize(name: str, result: dict) -> dict:
    out = {k: v for k, v in result.items() if k not in VOLATILE}
    out["config"] = {k: v for k, v in result["config"].items() if k != "command"}
    if not name.startswith("torch"):
        out["iterations"] = _digest(result["iterations"])
        return out
    out["requests"] = [{k: v for k, v in q.items() if not k.endswith("_ms")}
                       for q in result["requests"]]
    out["iterations"] = [{k: v for k, v in it.items() if k not in HOST_TIMED}
                         for it in result["iterations"]]
    summary = {k: v for k, v in result["summary"].items()
               if k not in ("itl_histogram", "steady_state")}
    out["summary"] = _counts(summary)
    out.pop("telemetry", None)
    return out


def run_one(name: str, out: Path) -> dict:
    r = CliRunner().invoke(app, [*RUNS[name], "--output", str(out)])
    assert r.exit_code == 0, r.output
    return normalize(name, json.loads(out.read_text()))


@pytest.mark.parametrize("name", list(RUNS))
def test_result_matches_the_golden_file(name, tmp_path):
    golden = json.loads(GOLDEN.read_text())[name]
    now = run_one(name, tmp_path / f"{name}.json")
    assert now["requests"], "the run completed no request"
    assert now == golden


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        data = {name: run_one(name, Path(d) / f"{name}.json") for name in RUNS}
    GOLDEN.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}")
