"""A device profile is checked before it is used (issue 25, rule 4).

Rates that overflow the clock gave a silent "completed, duration 0.000 s, TTFT nan" in the
simulator and killed `serve`'s engine on its first request (/health 503 for good);
`"rates": {}` was accepted and every step took 0 s; an unknown dtype was a KeyError. Each field
is checked for its kind, range and finiteness, and the predicted time of a reference step
(llama-3-8b, a 1024-token context) must be a time a step can take: one line, exit 2.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app

GOOD_RATES = {"memory_bandwidth": 4.0e12, "flop_rate": 7.0e14, "iteration_overhead_s": 1e-4}


def profile(tmp_path, **changes):
    p = {"kind": "cbbench-device-profile", "version": 1, "device": "h200",
         "device_name": "NVIDIA H200", "dtype": "bf16", "models": ["llama-3-8b"],
         "rates": dict(GOOD_RATES)}
    rates = changes.pop("rates", None)
    if rates is not None:
        p["rates"] = rates
    p.update(changes)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(p))
    return path


BAD = {
    "bandwidth-overflows-the-clock": dict(rates={**GOOD_RATES, "memory_bandwidth": 1e-300,
                                                 "flop_rate": 1e-300}),
    "overhead-overflows-the-clock": dict(rates={**GOOD_RATES, "iteration_overhead_s": 1e300}),
    "empty-rates": dict(rates={}),
    "cpu-empty-rates": dict(device="cpu", rates={}),
    "unknown-dtype": dict(dtype="int3"),
    # beyond the list: a host factor that makes every step take 0 s, a device_name
    # that is not text, rates so high that a step of 16 GB of weights takes no time
    "host-factor-tiny": dict(rates={**GOOD_RATES, "host_factor": 1e-300}),
    "device-name-list": dict(device_name=["x"]),
    "rates-beyond-physics": dict(rates={"memory_bandwidth": 1e300, "flop_rate": 1e300}),
}
MESSAGES = {
    "unknown-dtype": "unknown dtype 'int3'",
    "device-name-list": "'device_name' must be a string",
}


def one_line(res, text: str) -> None:
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: --gpu-profile: "), res.stderr
    assert text in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_profile_is_one_line_before_the_run(tmp_path, case):
    p = profile(tmp_path, **BAD[case])
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu-profile", str(p),
                                   "--num-requests", "3", "--output", str(out)])
    one_line(res, MESSAGES.get(case, "a device's step takes between"))
    assert not out.exists()


@pytest.mark.parametrize("case", ["overhead-overflows-the-clock", "empty-rates"])
def test_serve_refuses_it_at_start_instead_of_dying_on_the_first_request(tmp_path, case):
    p = profile(tmp_path, **BAD[case])
    res = CliRunner().invoke(app, ["serve", "--engine", "sim", "--gpu-profile", str(p),
                                   "--port", "0"])
    one_line(res, "a device's step takes between")


def test_a_good_profile_still_runs(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["run", "--engine", "sim", "--gpu-profile",
                                   str(profile(tmp_path)), "--num-requests", "3",
                                   "--output", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())["summary"]
    assert s["completed"] == 3 and s["duration_s"] > 0 and s["ttft_ms"]["p50"] > 0
