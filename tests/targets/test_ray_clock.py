"""--ray's clock handling on a worker on another node, without a cluster: the driver loop
(ray_pool._drive) runs against stand-in actors, one on the driver's node and one whose clock
is 1000 s behind the driver's and whose clock reads take 3 ms (so the offset is known only to
±1.5 ms or worse). That worker is flagged in summary.workers with one stderr line, and its
request times land on the driver's clock: it was started at the shared instant on its own
clock, t0 - offset."""

from __future__ import annotations

import threading
import time

import pytest

from cbbench.analysis.records import RequestRecord
from cbbench.clock_offset import UNCERTAINTY_FLAG_MS
from cbbench.distributed import ray_pool
from cbbench.distributed.local import plan_workers
from cbbench.distributed.messages import Done, Ready, RecordBatch
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.options import EndpointOptions

DRIVER_NODE = "node-driver"
OFFSET_S = 1000.0  # driver clock - remote worker clock
REMOTE_READ_S = 0.003  # a slow round trip: uncertainty >= 1.5 ms
SEND_AFTER_S = 0.05  # when the stand-in actor "sends" its request, after its t0
WAIT_S = 10.0
MS = 1000.0


class _Method:
    def __init__(self, fn):
        self.remote = fn


class _FakeRay:
    """What _drive uses of Ray: get (object refs are the values themselves here), the node id
    of the driver, and the timeout exception."""

    class exceptions:
        GetTimeoutError = TimeoutError

    def get(self, ref, timeout=None):
        return ref

    def get_runtime_context(self):
        class Ctx:
            def get_node_id(self):
                return DRIVER_NODE

        return Ctx()


class _Actor:
    """One worker: Ready, then (once started) one request at t0 + SEND_AFTER_S on its own clock,
    then Done. `offset_s`: the driver's clock minus this actor's."""

    def __init__(self, k: int, node: str, offset_s: float, read_s: float, positions):
        self.k, self.node, self.offset_s, self.read_s = k, node, offset_s, read_s
        self.positions = positions
        self.started = threading.Event()
        self.t0_own: float | None = None
        self.sent_on_driver_clock: float | None = None
        self.where = _Method(lambda: (node, f"host-{k}", 1000 + k))
        self.now = _Method(self._now)
        self.start = _Method(self._start)
        self.stop = _Method(lambda: None)
        self.run = _Method(self._run)

    def _clock(self) -> float:
        return time.perf_counter() - self.offset_s

    def _now(self) -> float:
        time.sleep(self.read_s / 2)
        t = self._clock()
        time.sleep(self.read_s / 2)
        return t

    def _start(self, t0_own: float) -> None:
        self.t0_own = t0_own
        self.started.set()

    def _run(self):
        yield [Ready(self.k, 1000 + self.k, f"host-{self.k}")]
        assert self.started.wait(WAIT_S)
        while self._clock() < self.t0_own + SEND_AFTER_S:
            time.sleep(0.001)
        send = self._clock() - self.t0_own  # the record's times: relative to its own t0
        self.sent_on_driver_clock = time.perf_counter()
        pos = self.positions[0]
        rec = RequestRecord(pos, 5, 2, 0.0, send_s=send, token_times_s=[send + 0.01, send + 0.02])
        yield [RecordBatch(self.k, [(pos, rec, "usage")])]
        yield [Done(self.k, send + 0.02, False, {"client_cpu_s": 0.01}, [0.1])]


def test_a_remote_worker_with_an_uncertain_offset_is_flagged_and_put_on_the_driver_clock(notices):
    wreqs = [WorkloadRequest(i, 5, 2) for i in range(2)]
    opts = EndpointOptions("http://127.0.0.1:1", served_model="m")
    _, merger = plan_workers(opts, wreqs, [0.0, 0.0], 2, 0.0)
    actors = [
        _Actor(0, DRIVER_NODE, 0.0, 0.0, merger.workers[0].positions),
        _Actor(1, "node-far", OFFSET_S, REMOTE_READ_S, merger.workers[1].positions),
    ]
    notes = notices  # the logged notices (conftest)
    t0s: list[float] = []
    run = ray_pool._drive(_FakeRay(), actors, opts, merger, None, None, t0s.append)
    (t0,) = t0s
    near, far = run.info["workers"]

    assert near["same_node_as_driver"] is True and near["clock_offset_ms"] == 0.0
    assert near["clock_flagged"] is False and near["clock_uncertainty_ms"] == 0.0
    assert far["same_node_as_driver"] is False and far["node"] == "node-far"
    assert far["clock_uncertainty_ms"] >= REMOTE_READ_S / 2 * MS > UNCERTAINTY_FLAG_MS
    assert far["clock_flagged"] is True
    assert abs(far["clock_offset_ms"] - OFFSET_S * MS) <= far["clock_uncertainty_ms"]
    flagged = [n for n in notes if "clock offset" in n]
    assert len(flagged) == 1 and flagged[0].startswith("warning: worker 1 on host-1:")

    # The far actor was started at the shared instant on its own clock ...
    assert actors[0].t0_own == t0
    assert abs((t0 - actors[1].t0_own) - OFFSET_S) <= far["clock_uncertainty_ms"] / MS
    # ... so its record's times, relative to that start, are times on the driver's clock.
    far_rec = next(r for r in run.records if r.worker == 1)
    on_driver = actors[1].sent_on_driver_clock - t0
    assert far_rec.send_s == pytest.approx(on_driver, abs=far["clock_uncertainty_ms"] / MS + 0.01)
    assert far_rec.send_s >= SEND_AFTER_S - far["clock_uncertainty_ms"] / MS
    assert run.info["workers"][1]["completed"] == 1 and len(run.records) == 2
