"""A dead worker's lost requests (due before it died, unreported) carry what one process's
record of the same request would: the output length asked for (max_tokens), the model it asked
for (its --lora-modules adapter, drawn per request id), and no endpoint where several URLs
leave it unknown. Before, each read max_tokens null, the served model (by_model counted an
adapter's failures under the base model) and the first URL (by_endpoint charged it every lost
request, whichever endpoint its worker would have chosen)."""

from __future__ import annotations

import time

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.summary.splits import split_by
from cbbench.distributed.merge import WORKER_LOST, Merger
from cbbench.distributed.messages import Done, Ready, RecordBatch
from cbbench.distributed.plan import deal
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.options import EndpointOptions

N = 4
OUTPUT_LEN = 3


def _sent(i: int, endpoint: str) -> RequestRecord:
    t = 0.1 * i
    return RequestRecord(id=i, prompt_tokens=5, output_tokens=1, intended_start_s=t, send_s=t,
                         token_times_s=[t + 0.01], max_tokens=OUTPUT_LEN, model="a",
                         endpoint=endpoint)


def test_lost_requests_keep_their_adapter_and_asked_length_and_no_guessed_endpoint():
    wreqs = [WorkloadRequest(i, 5, OUTPUT_LEN) for i in range(N)]
    shares = deal(N, 2)  # worker 0: 0 and 2; worker 1: 1 and 3
    m = Merger(wreqs, [0.1 * i for i in range(N)], shares)
    m.on_message(Ready(0, 10, "h"))
    m.on_message(Ready(1, 11, "h"))
    m.on_message(RecordBatch(0, [(0, _sent(0, "http://a"), "usage"),
                                 (2, _sent(2, "http://b"), "usage")]))
    m.on_message(Done(0, 1.0, False, {"served_model": "base"}, [0.5]))
    m.died(1, 0.35, "killed by SIGKILL")  # 1 and 3 were due: lost
    opts = EndpointOptions("http://a,http://b", lora_modules={"a": 1.0})  # every request: a
    run = m.result(opts, time.perf_counter(), False, 0.0)
    lost = [r for r in run.records if r.error_type == WORKER_LOST]
    assert [(r.id, r.model, r.endpoint, r.max_tokens) for r in lost] == [
        (1, "a", None, OUTPUT_LEN), (3, "a", None, OUTPUT_LEN)]
    by_model = split_by(run.records, lambda r: r.model, 1.0)
    assert {k: (v["completed"], v["failed"]) for k, v in by_model.items()} == {"a": (2, 2)}
    by_endpoint = split_by(run.records, lambda r: r.endpoint, 1.0)
    assert {k: v["failed"] for k, v in by_endpoint.items()} == {"http://a": 0, "http://b": 0}


def test_with_one_endpoint_and_no_adapter_a_lost_request_is_the_runs():
    wreqs = [WorkloadRequest(i, 5, OUTPUT_LEN) for i in range(2)]
    m = Merger(wreqs, [0.0, 0.1], [[0, 1]])
    m.on_message(Ready(0, 10, "h"))
    m.died(0, 0.5, "killed by SIGKILL")
    run = m.result(EndpointOptions("http://a"), time.perf_counter(), False, 0.0)
    assert {(r.endpoint, r.model) for r in run.records} == {("http://a", None)}
