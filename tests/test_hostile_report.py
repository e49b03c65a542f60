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
    return json.loads(json.dumps(execute_run(spec, lambda m: None)))


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
