"""An engine run's clock starts after everything that prepares it (seventh review).

run_engine reset the clock and then called the telemetry's start, which imported its module
and, on a GPU, started NVML (initialization, each GPU's probes, GPM) inside the timed window:
requests arriving at t=0 waited for it at an idle engine. A CPU run's first step started
22-39 ms after t=0, its 4 requests queued 39.0 ms each and their TTFT read 60.4 ms (0.06 ms
of gap on a second run in the same process, the import done). Now the preparation
(Telemetry.prepare: imports, NVML's start-up) runs once the engine is built and before the
clock's zero; at the zero only the sampling threads start.

Deterministic, whatever the machine's speed: the preparation blocks on an Event until the
test, having seen it blocked, releases it; the clock's zero must come after that release (it
came before). The NVML start-up is a fake module's here: on a real GPU (untested there) the
same code opens NVML in Telemetry.prepare."""

from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest
from helpers import run_spec, sim_options, start_server

pytest.importorskip("torch")

from cbbench.engine.args import EngineArgs  # noqa: E402
from cbbench.engine.core.clock import WallClock  # noqa: E402

TIMEOUT_S = 120.0  # a stuck run fails the test instead of hanging it
NUM_REQUESTS = 4
ENGINE = EngineArgs(engine="torch", device="cpu", model="tiny", num_kv_blocks=64)


class Gate:
    """A preparation step that blocks until the test releases it; ``released_at``: when the
    test did (perf_counter), so nothing after the release can be before it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_at: float | None = None

    def block(self) -> None:
        self.entered.set()
        assert self.release.wait(TIMEOUT_S), "the test never released the preparation"

    def open_from_test(self) -> None:
        assert self.entered.wait(TIMEOUT_S), "the run never reached its preparation"
        self.released_at = time.perf_counter()
        self.release.set()


@pytest.fixture()
def zeros(monkeypatch) -> list[float]:
    """perf_counter() at each WallClock's zero set by reset() (the run's t=0)."""
    seen: list[float] = []
    real_reset = WallClock.reset

    def reset(self) -> None:
        real_reset(self)
        seen.append(self.origin)

    monkeypatch.setattr(WallClock, "reset", reset)
    return seen


def _in_thread(fn, gate: Gate) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            out["error"] = e
        finally:
            gate.entered.set()  # a run that failed before its preparation: nothing to wait for

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def _finish(t: threading.Thread, out: dict):
    t.join(TIMEOUT_S)
    assert not t.is_alive(), "the run did not end"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_run_engine_prepares_before_the_clocks_zero(zeros):
    """The engine loop's contract: prepare() before the zero, on_start(clock) at it."""
    from cbbench.load.workload_types import WorkloadRequest
    from cbbench.targets.engine import run_engine

    gate = Gate()
    started: list[float] = []
    wreqs = [WorkloadRequest(id=i, prompt_len=8, output_len=2) for i in range(NUM_REQUESTS)]
    t, out = _in_thread(lambda: run_engine(
        ENGINE, wreqs, np.zeros(NUM_REQUESTS), prepare=gate.block,
        on_start=lambda clock: started.append(clock.origin)), gate)
    gate.open_from_test()
    run = _finish(t, out)
    assert gate.released_at is not None and zeros and zeros[-1] >= gate.released_at
    assert started == [zeros[-1]]  # on_start saw the clock at its zero
    assert len(run.records) == NUM_REQUESTS


def _fake_pynvml(gate: Gate) -> types.ModuleType:
    """Just enough NVML for the sampler: one GPU, no GPM; nvmlInit blocks on ``gate``."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    handle = types.SimpleNamespace(index=0)
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 1, 2
    m.nvmlInit = gate.block
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: handle
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1 << 30)
    m.nvmlDeviceGetClockInfo = lambda h, kind: 1980 if kind == m.NVML_CLOCK_SM else 2619
    m.nvmlDeviceGetPowerUsage = lambda h: 300_000
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50, memory=40)
    return m


def test_nvml_starts_before_the_runs_zero(zeros, monkeypatch):
    """The runner's telemetry through a real run: NVML's start-up (a fake's nvmlInit that
    blocks) is over before t=0, and the sampler then reads on the run's clock."""
    import sys

    import cbbench.bench.runner as runner
    from cbbench.bench.runner import execute_run

    gate = Gate()
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(gate))
    monkeypatch.setattr(runner, "_runs_on_cpu", lambda args: False)  # sample "its GPU"
    spec = run_spec(engine=ENGINE, workload="random", input_len=16, output_len=4,
                    num_requests=NUM_REQUESTS, gpu_index=0, telemetry_interval=0.01)
    t, out = _in_thread(lambda: execute_run(spec), gate)
    gate.open_from_test()
    result = _finish(t, out).model_dump()
    assert gate.released_at is not None and zeros and zeros[-1] >= gate.released_at
    tel = result["telemetry"]
    assert tel["available"] is True, tel
    assert tel["samples"] and min(s["t_s"] for s in tel["samples"]) >= 0.0
    assert result["summary"]["completed"] == NUM_REQUESTS


def test_a_sampler_opened_but_never_started_shuts_nvml_down():
    """A run that fails between its preparation and its zero still releases NVML."""
    from cbbench.bench.nvml_sampler import TelemetrySampler

    gate = Gate()
    gate.release.set()
    nvml = _fake_pynvml(gate)
    shut: list[bool] = []
    nvml.nvmlShutdown = lambda: shut.append(True)
    sampler = TelemetrySampler([0], nvml=nvml)
    sampler.open()
    sampler.stop()
    assert shut == [True]
    assert sampler.to_result()["available"] is False


PRE_T0_S = 0.3  # the HTTP client's own set-up before its t0 (tokenizer, model, prompt sizing)


def _endpoint_run_with_telemetry():
    """A small endpoint run against a sim `serve`, sampling (the faked) GPU 0 every 10 ms."""
    from cbbench.bench.runner import execute_run
    from cbbench.cli.serve import build_serving_engine
    from cbbench.targets.http import EndpointOptions

    srv = start_server(lambda: build_serving_engine(sim_options()))
    try:
        return execute_run(run_spec(
            workload="random", input_len=16, output_len=4, num_requests=NUM_REQUESTS,
            endpoint=EndpointOptions(endpoint=srv.url), gpu_index=0, telemetry_interval=0.01))
    finally:
        srv.stop()


def test_http_telemetry_clock_is_the_requests_clock(monkeypatch):
    """An endpoint run's telemetry starts at the client's t0 (ninth review). It started on
    its own WallClock before run_http, whose set-up (the tokenizer, the served model, sizing
    the prompts with the server, the metrics baseline) then ran before the requests' t0: every
    sample was stamped that much late on the requests' axis, so the steady window picked the
    wrong span and the run's figures held the idle set-up. Here the set-up is held PRE_T0_S
    long; the telemetry's zero must not come before its end (it came 0.53 s before)."""
    import sys

    import cbbench.bench.runner as runner
    import cbbench.targets.http as http

    gate = Gate()
    gate.release.set()
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(gate))
    setup_done: list[float] = []
    real_freeze = http.freeze_heap

    def slow_freeze():  # the last step before run_http's t0
        time.sleep(PRE_T0_S)
        setup_done.append(time.perf_counter())
        return real_freeze()

    monkeypatch.setattr(http, "freeze_heap", slow_freeze)
    zeros: list[float] = []
    real_start = runner.Telemetry.start

    def start(self, clock) -> None:
        zeros.append(time.perf_counter() - clock.now())
        real_start(self, clock)

    monkeypatch.setattr(runner.Telemetry, "start", start)
    result = _endpoint_run_with_telemetry()
    assert result.summary.completed == NUM_REQUESTS
    assert setup_done and zeros
    early_s = setup_done[-1] - zeros[-1]
    assert early_s <= 0, f"telemetry's zero {early_s:.3f} s before the requests' t0"
    assert result.telemetry is not None and result.telemetry.available


IDLE_TAIL_S = 0.15  # the runner's post-run work, sampled at the idle GPU's power
BUSY_W, IDLE_W = 300.0, 50.0


def test_run_telemetry_leaves_out_the_samples_after_the_run(monkeypatch):
    """summary.run is over the run's span (ninth review): the sampler runs on after the last
    completion until the runner stops it, and those samples (here IDLE_TAIL_S of an idle
    GPU's power) were averaged into the run's figures, pulling its mean power below BUSY_W.
    They stay in the samples (the plots may show them)."""
    import sys

    import cbbench.bench.runner as runner

    gate = Gate()
    gate.release.set()
    nvml = _fake_pynvml(gate)
    idle: list[bool] = []
    nvml.nvmlDeviceGetPowerUsage = lambda h: (IDLE_W if idle else BUSY_W) * 1000
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    real_run_target = runner._run_target

    def then_idle(*args, **kwargs):
        out = real_run_target(*args, **kwargs)
        idle.append(True)
        time.sleep(IDLE_TAIL_S)
        return out

    monkeypatch.setattr(runner, "_run_target", then_idle)
    result = _endpoint_run_with_telemetry()
    tel = result.model_dump()["telemetry"]
    assert any(s["power_w"] == IDLE_W for s in tel["samples"])  # kept in the file
    assert tel["summary"]["run"]["power_w"]["mean"] == pytest.approx(BUSY_W)
