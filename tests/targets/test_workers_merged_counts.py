"""A multi-worker run's counts are the run's, not worker 0's: summary.http.sent_by_endpoint
(several --endpoint URLs) summed over the workers, as the records' summary.by_endpoint counts
them. The merge copied the first finished worker's info: {A: 10, B: 10} of 40 requests sent
20 and 20. prompt_sizing likewise: one worker's failed /tokenize left its prompts approximate."""

from __future__ import annotations

import json
import time

from fake_openai import FakeOpenAI
from helpers import invoke_app

from cbbench.analysis.records import RequestRecord
from cbbench.distributed.merge import Merger
from cbbench.distributed.messages import Done, Ready, RecordBatch
from cbbench.distributed.plan import deal
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.options import EndpointOptions

N = 40


def test_sent_by_endpoint_counts_every_workers_sends(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"p{i}", "output_len": 2}) + "\n"
                          for i in range(N)))
    out = tmp_path / "r.json"
    with FakeOpenAI() as a, FakeOpenAI() as b:
        res = invoke_app(["run", "--endpoint", f"{a.url},{b.url}", "--workload", str(wl),
                          "--num-requests", str(N), "--request-rate", "200", "--workers", "2",
                          "--output", str(out), "--save-detailed"])
        assert res.exit_code == 0, res.output
        served = {a.url: len(a.requests), b.url: len(b.requests)}
    s = json.loads(out.read_text())["summary"]
    assert s["completed"] == N
    by_endpoint = {url: e["completed"] for url, e in s["by_endpoint"].items()}
    assert s["http"]["sent_by_endpoint"] == by_endpoint == served == {a.url: 20, b.url: 20}


def _done(worker: int, info: dict) -> Done:
    return Done(worker, 1.0, False, info, [0.5])


def test_counts_and_prompt_sizing_merged_over_workers():
    wreqs = [WorkloadRequest(i, 5, 2) for i in range(4)]
    shares = deal(4, 2)
    m = Merger(wreqs, [0.0, 0.1, 0.2, 0.3], shares)
    for w in (0, 1):
        m.on_message(Ready(w, 10 + w, "h"))
        recs = [(p, _rec(p, 0.1 * p), "usage") for p in shares[w]]
        m.on_message(RecordBatch(w, recs))
    m.on_message(_done(0, {"sent_by_endpoint": {"A": 2, "B": 0}, "prompt_sizing":
                           "server_tokenize"}))
    m.on_message(_done(1, {"sent_by_endpoint": {"A": 1, "B": 1}, "prompt_sizing":
                           "approximate"}))
    info = m.result(EndpointOptions("http://A,http://B"), time.perf_counter(), False, 0.0).info
    assert info["sent_by_endpoint"] == {"A": 3, "B": 1}
    assert info["prompt_sizing"] == "approximate"  # not every prompt was sized by /tokenize


def _rec(i: int, t: float) -> RequestRecord:
    return RequestRecord(i, 5, 2, t, send_s=t, token_times_s=[t + 0.02, t + 0.03])
