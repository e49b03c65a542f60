"""`cbbench report` on results that hold fields of the wrong kind (issue 19): one line naming
the file, the record and the field, exit 2; before, each plot crashed its own way
(AttributeError, ValueError, TypeError tracebacks). The schema (cbbench/schema/) refuses most
of them as the file is read, naming the field's path; the report's own checks remain for what
the schema allows (a null requests list)."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.schema.base import to_dict


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    spec = run_spec(workload="sharegpt", num_requests=4, save_detailed=True,
                   engine=EngineArgs(engine="sim"))
    return to_dict(execute_run(spec))


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
    "requests-a-string": ("requests", "oops", "requests: Input should be a valid list"),
    "requests-of-strings": ("requests", ["a", "b"], "requests.0: Input should be"),
    "requests-null": ("requests", None, "'requests' is null"),
    "requests-absent": ("requests", KeyError, None),  # a summary-only result: fine
    "request-without-id": ("requests.0.id", KeyError, "requests.0.id: Field required"),
    "request-ttft-text": ("requests.1.ttft_ms", "x", "requests.1.ttft_ms:"),
    "request-token-times-text": ("requests.0.token_times_s", "y", "requests.0.token_times_s:"),
    "iterations-a-string": ("iterations", "oops", "iterations: Input should be a valid list"),
    "iteration-empty": ("iterations", [{}], "iterations.0.index: Field required"),
    "iteration-start-text": ("iterations.0.start_s", "x", "iterations.0.start_s:"),
    "iteration-kv-total-nan": ("iterations.0.kv_blocks_total", float("nan"), "iterations.0.kv_blocks_total:"),
    "config-scheduler-list": ("config.scheduler", ["x"], "config.scheduler:"),
    "telemetry-a-string": ("telemetry", "x", "telemetry: Input should be"),
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
    "points-a-string": ("points", "x", "points: Input should be a valid list"),
    "points-null": ("points", None, "points: Input should be a valid list"),
    "point-an-int": ("points.0", 1, "points.0: Input should be"),
    "point-rate-text": ("points.0.rate", "x", "points.0.rate"),
    "point-rate-absent": ("points.1.rate", KeyError, "points.1.rate: Field required"),
    "point-throughput-text": ("points.0.output_throughput", "x", "points.0.output_throughput:"),
    "point-ttft-bool": ("points.0.ttft_p99_ms", True, "points.0.ttft_p99_ms:"),
    "slo-a-string": ("slo", "x", "slo: Input should be"),
    "slo-limit-text": ("slo", {"limits_ms": {"ttft_p99": "x"}}, "slo."),
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
