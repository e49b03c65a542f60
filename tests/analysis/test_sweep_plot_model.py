"""Issue 36: the latency-throughput plot loads sweep.json as its model (schema/sweep.py) and
reads it by attribute; the plot's own rules still hold where the schema lets a value through
(a rate of 0, a NaN figure or SLO limit), each in the line the dict-reading code said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from cbbench.errors import UsageError
from cbbench.report.sweep_plot import is_sweep, latency_throughput, load_sweep
from cbbench.schema import SweepFile

SWEEP = Path(__file__).resolve().parents[1] / "data" / "results" / "sweep.json"


def _write(tmp_path, change) -> Path:
    data = json.loads(SWEEP.read_text())
    change(data)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(data))  # NaN written as NaN: Python's JSON reads it back
    return path


def test_the_sweep_loads_as_its_model_and_plots_its_slo_line():
    sweep = load_sweep(SWEEP)
    assert isinstance(sweep, SweepFile) and is_sweep(json.loads(SWEEP.read_text()))
    fig = latency_throughput([("a", sweep)])
    assert isinstance(fig, Figure)
    lines = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert [line.get_ydata()[0] for line in lines] == [5000.0]  # slo.limits_ms.ttft
    assert not is_sweep([1]) and not is_sweep({"kind": "cbbench-capacity"})


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d["points"][0].update(rate=0), "point 0 has rate 0: cannot plot it"),
    (lambda d: d["points"][0].update(rate=float("nan")), "point 0 has rate nan: cannot plot it"),
    (lambda d: d["points"][1].update(ttft_p99_ms=float("nan")),
     "point 1 has ttft_p99_ms nan: cannot plot it"),
    (lambda d: d["slo"]["limits_ms"].update(ttft=float("nan")),
     "'slo' is {'limits_ms': {'ttft': nan}, 'attainment': 0.99, 'attainment_source': "
     "'suffix'}: cannot plot it"),
])
def test_what_the_schema_lets_through_and_the_plot_cannot_draw_is_one_line(tmp_path, change,
                                                                          said):
    path = _write(tmp_path, change)
    with pytest.raises(UsageError) as e:
        load_sweep(path)
    assert str(e.value) == f"{path}: {said}"
