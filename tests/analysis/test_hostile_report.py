"""`cbbench report` on results that pass the loader but hold fields of the wrong kind
(issue 19): one line naming the file, the record and the field, exit 2; before, each plot
crashed its own way (AttributeError, ValueError, TypeError tracebacks)."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    from cbbench.bench.runner import RunSpec, execute_run
    from cbbench.engine.args import EngineArgs

    spec = RunSpec(workload="sharegpt", num_requests=4, save_detailed=True,
                   engine=EngineArgs(engine="sim"))
    return json.loads(json.dumps(execute_run(spec)))


def _mutate(result: dict, path: str, value):
    r = copy.deepcopy(result)
    keys = path.split(".")
    obj = r
    for k in keys[:-1]:
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    last = keys[-1]
    if value is KeyError:
        del obj[last]
    elif isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value
    return r


CASES = {
    "requests-a-string": ("requests", "oops", "'requests' is a str"),
    "requests-of-strings": ("requests", ["a", "b"], "'requests'[0] is a str"),
    "requests-null": ("requests", None, "'requests' is null"),
    "requests-absent": ("requests", KeyError, None),  # a summary-only result: fine
    "request-without-id": ("requests.0.id", KeyError, "request 0 has no 'id'"),
    "request-ttft-text": ("requests.1.ttft_ms", "x", "request 1 has 'ttft_ms' = 'x'"),
    "request-token-times-text": ("requests.0.token_times_s", "y", "'token_times_s'"),
    "iterations-a-string": ("iterations", "oops", "'iterations' is a str"),
    "iteration-empty": ("iterations", [{}], "iteration 0 has no 'index'"),
    "iteration-start-text": ("iterations.0.start_s", "x", "iteration 0 has 'start_s' = 'x'"),
    "iteration-kv-total-nan": ("iterations.0.kv_blocks_total", float("nan"), "'kv_blocks_total'"),
    "config-scheduler-list": ("config.scheduler", ["x"], "config has 'scheduler'"),
    "telemetry-a-string": ("telemetry", "x", "'telemetry' is a str"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_checks_the_fields_it_plots(tmp_path, good, case):
    field, value, text = CASES[case]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(_mutate(good, field, value)))
    res = CliRunner().invoke(app, ["report", str(p), "--out", str(tmp_path / "out")],
                             env={"COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    if text is None:
        assert res.exit_code == 0, res.stderr
        return
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(err) == 1, res.stderr
    assert err[0].startswith(f"cbbench: error: {p}: ") and text in err[0], err[0]
    assert not list((tmp_path / "out").glob("*.png")), "plots drawn before the check"


# ---- sweep.json -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_sweep(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sweep")
    res = CliRunner().invoke(app, ["sweep", "--engine", "sim", "--num-requests", "3", "--rates",
                                   "1,inf", "--min-duration", "0", "--out-dir", str(out)])
    assert res.exit_code == 0, res.stderr
    return json.loads((out / "sweep.json").read_text())


SWEEP_CASES = {
    "points-a-string": ("points", "x", "'points' is a str"),
    "points-null": ("points", None, "'points' is a NoneType"),
    "point-an-int": ("points.0", 1, "point 0 is a int"),
    "point-rate-text": ("points.0.rate", "x", "point 0 has rate 'x'"),
    "point-rate-absent": ("points.1.rate", KeyError, "point 1 has rate None"),
    "point-throughput-text": ("points.0.output_throughput", "x", "output_throughput 'x'"),
    "point-ttft-bool": ("points.0.ttft_p99_ms", True, "ttft_p99_ms True"),
    "slo-a-string": ("slo", "x", "'slo' is 'x'"),
    "slo-limit-text": ("slo", {"limits_ms": {"ttft_p99": "x"}}, "'slo' is"),
    "ttft-null": ("points.0.ttft_p99_ms", None, None),  # a figure a point lacks: fine
}


@pytest.mark.parametrize("case", sorted(SWEEP_CASES))
def test_report_checks_the_sweep_fields_it_plots(tmp_path, good_sweep, case):
    """A sweep.json whose points were text, null or held a text rate: TypeError / ValueError /
    AttributeError tracebacks from the latency-throughput plot."""
    field, value, text = SWEEP_CASES[case]
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps(_mutate(good_sweep, field, value)))
    res = CliRunner().invoke(app, ["report", str(p), "--out", str(tmp_path / "out")],
                             env={"COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    if text is None:
        assert res.exit_code == 0, res.stderr
        return
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(err) == 1, res.stderr
    assert err[0].startswith(f"cbbench: error: {p}: ") and text in err[0], err[0]
