"""`cbbench serve --enable-per-request-metrics`: vLLM's per-request `metrics` object, its
formulas checked by hand (vLLM's own test case), where it appears on the wire (a non-streamed
body; a stream's final usage chunk, and only there), its values equal to the request log's,
and nothing of it without the flag."""

from __future__ import annotations

import json
import urllib.request

import pytest
from helpers import sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig
from cbbench.server.request_metrics import FIELDS, timing_metrics

MS = 1000.0


def test_fields_by_hand():
    # queued 1.0, scheduled 1.5, first token 2.0, last 3.0, 10 tokens (vLLM's test case).
    m = timing_metrics(1.0, 1.5, 2.0, 3.0, 10)
    assert m["queue_time_ms"] == pytest.approx(500.0)
    assert m["time_to_first_token_ms"] == pytest.approx(500.0)
    assert m["generation_time_ms"] == pytest.approx(1000.0)
    assert m["mean_itl_ms"] == pytest.approx(1000.0 / 9)
    assert m["tokens_per_second"] == pytest.approx(10 / 1.5)
    one = timing_metrics(1.0, 1.5, 2.0, 2.0, 1)
    assert one["mean_itl_ms"] is None and one["tokens_per_second"] == pytest.approx(1 / 0.5)
    assert timing_metrics(None, None, None, None, 0) == dict.fromkeys(FIELDS)


@pytest.fixture(scope="module")
def servers():
    on = start_server(lambda: build_serving_engine(sim_options()),
                      ServeConfig(per_request_metrics=True))
    off = start_server(lambda: build_serving_engine(sim_options()), ServeConfig())
    yield on, off, None
    on.stop()
    off.stop()


def post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def chunks(raw: bytes) -> list[dict]:
    return [json.loads(x[6:]) for x in raw.decode().splitlines() if x.startswith("data: {")]


def log_lines(path) -> dict:
    return {x["id"]: x for x in map(json.loads, path.read_text().splitlines())}


def _matches_log(m: dict, line: dict) -> None:
    assert m["queue_time_ms"] == pytest.approx((line["queue_exit"] - line["admitted"]) * MS,
                                               abs=2e-3)
    assert m["time_to_first_token_ms"] == pytest.approx(
        (line["first_token"] - line["queue_exit"]) * MS, abs=2e-3)
    assert m["generation_time_ms"] == pytest.approx(
        (line["last_token"] - line["first_token"]) * MS, abs=2e-3)


def test_streamed_metrics_ride_on_the_final_usage_chunk(servers):
    on, _, _ = servers
    evs = chunks(post(on.url, {"prompt": "a b c", "max_tokens": 6, "stream": True,
                               "stream_options": {"include_usage": True}}))
    with_metrics = [e for e in evs if "metrics" in e]
    assert with_metrics == [evs[-1]] and evs[-1]["choices"] == []
    m = evs[-1]["metrics"]
    assert set(m) == set(FIELDS)
    assert m["mean_itl_ms"] == pytest.approx(m["generation_time_ms"] / 5)


def test_metrics_equal_the_request_log(tmp_path):
    log = tmp_path / "log.jsonl"
    srv = start_server(lambda: build_serving_engine(sim_options()),
                       ServeConfig(request_log=str(log), per_request_metrics=True))
    try:
        got = {}
        for n in (1, 5, 9):
            evs = chunks(post(srv.url, {"prompt": "a b c " * n, "max_tokens": n, "stream": True,
                                        "stream_options": {"include_usage": True}}))
            got[evs[-1]["id"]] = evs[-1]["metrics"]
        body = json.loads(post(srv.url, {"prompt": "x y", "max_tokens": 4}))
        got[body["id"]] = body["metrics"]
    finally:
        srv.stop()  # closes the log: every line is on disk
    lines = log_lines(log)
    for rid, m in got.items():
        _matches_log(m, lines[rid])


def test_non_streamed_body_carries_metrics(servers):
    on, _, _ = servers
    body = json.loads(post(on.url, {"prompt": "a b", "max_tokens": 4}))
    assert set(body["metrics"]) == set(FIELDS)
    assert body["metrics"]["generation_time_ms"] >= 0


def test_without_the_flag_no_metrics(servers):
    _, off, _ = servers
    evs = chunks(post(off.url, {"prompt": "a b c", "max_tokens": 3, "stream": True,
                                "stream_options": {"include_usage": True}}))
    assert not any("metrics" in e for e in evs)
    assert "metrics" not in json.loads(post(off.url, {"prompt": "a", "max_tokens": 2}))
