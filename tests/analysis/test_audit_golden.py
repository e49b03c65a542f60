"""`cbbench audit`'s report on hand-made results and logs that reach every branch the audit
reads (reasoning, tool calls, cached tokens, the server's own timings, failed and cancelled
requests, a request not in the log, a line that is not a finished stream, an id the server made
the tail of its own, a join by send order, each side on its own clock, a failure with and
without the client's recorded lag) is the report the code gave before the audit read typed log
lines and figures (issue 36), to the byte of its JSON.

Regenerate only when a change of the reports is intended, and say so in the commit:
``python tests/analysis/test_audit_golden.py --write``.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from cbbench.analysis.server_side import audit as A
from cbbench.errors import UsageError

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "audit_golden.json"
T0 = 1000.0  # the run clock's zero on the epoch


def _request(i: int, **kw) -> dict:
    """Request i: sent at 10 ms + i, three events (2, 1, 1 tokens) 40, 50 and 61 ms later."""
    send = 0.010 + i * 0.001
    base = {"id": i, "send_s": send, "token_times_s": [send + 0.040, send + 0.050, send + 0.061],
            "event_tokens": [2, 1, 1], "output_tokens": 4, "error": None, "cancelled": False,
            "server_request_id": f"chatcmpl-{i}", "first_output_s": send + 0.050,
            "reasoning_tokens": 2, "cached_tokens": 16,
            "tool_calls": [{"id": "c1", "name": "f", "argument_tokens": 1}],
            "server_timing": {"queue_time_ms": 5.0, "time_to_first_token_ms": 20.0,
                              "generation_time_ms": 19.0}}
    return {**base, **kw}


def _line(i: int, late_ms: float = 0.0, **kw) -> dict:
    """The server's line of request i: arrived 2 ms after the send, each event written
    ``late_ms`` before the client read it (0.3 ms more on the first)."""
    send = T0 + 0.010 + i * 0.001
    lag = late_ms / 1000.0
    base = {"id": f"chatcmpl-{i}", "status": 200, "finish": "length", "arrival": send + 0.002,
            "submitted": send + 0.003, "queue_exit": send + 0.008, "first_token": send + 0.0385,
            "last_token": send + 0.0595, "first_output_sent": send + 0.050 - lag,
            "output_tokens": 4, "reasoning_tokens": 2, "tool_call_tokens": 1,
            "cached_tokens": 16,
            "events": [[send + 0.0397 - lag, 2, "reasoning"], [send + 0.050 - lag, 1, "answer"],
                       [send + 0.061 - lag, 1, "tool"]]}
    return {**base, **kw}


def _result(requests: list[dict], http: dict | None = None) -> dict:
    return {"summary": {"http": {"t0_epoch_s": T0, **(http or {})}}, "requests": requests}


def _cases() -> dict[str, tuple[dict, dict, dict]]:
    """name: (result, log, audit's keyword arguments)."""
    reqs = [_request(i) for i in range(6)]
    log = {f"chatcmpl-{i}": _line(i) for i in range(6)}
    cases: dict[str, tuple[dict, dict, dict]] = {"passes": (_result(reqs), log, {})}
    # Failed and cancelled requests, one not in the log, one whose line is no finished stream,
    # one with no server timings and counts that differ.
    mixed = copy.deepcopy(reqs) + [
        _request(6, error="HTTP 500"), _request(7, cancelled=True), _request(8),
        _request(9), _request(10, server_timing=None, output_tokens=5, reasoning_tokens=None,
                              cached_tokens=None, tool_calls=None, first_output_s=None)]
    mixed_log = {**log, "chatcmpl-9": _line(9, status=500),
                 "chatcmpl-10": _line(10, finish="stop", reasoning_tokens=None,
                                      tool_call_tokens=None, first_output_sent=None)}
    cases["mixed"] = (_result(mixed), mixed_log, {})
    # Every event written 3 ms before the client read it: the timings fail; with the
    # client's recorded loop lag and send lag, the cause names the client.
    late = {f"chatcmpl-{i}": _line(i, late_ms=3.0) for i in range(6)}
    cases["late"] = (_result(reqs), late, {})
    cases["late_client_bound"] = (_result(reqs, {
        "loop_lag_p50_ms": 1.5, "loop_lag_p99_ms": 4.0, "send_lag_p50_ms": 0.5,
        "send_lag_p99_ms": 2.5, "client_bound": True, "client_fell_behind": True}), late, {})
    cases["late_tail"] = (_result(reqs), late, {"tolerance_ms": 5.0, "tail_tolerance_ms": 0.5})
    # Timings within tolerance, a count off: the client miscounted.
    cases["miscount"] = (_result([dict(r, output_tokens=5) for r in reqs]), log, {})
    # The ids the client chose, the tails of the server's.
    tails = [dict(r, server_request_id=str(r["id"])) for r in reqs]
    cases["tails"] = (_result(tails), log, {})
    # No ids: joined by send order; each side on its own clock.
    anonymous = [dict(r, server_request_id=None) for r in reqs]
    cases["send_order"] = (_result(anonymous), log, {})
    cases["own_origins"] = ({"summary": {}, "requests": reqs}, log, {})
    return cases


def _reports() -> dict[str, dict | str]:
    out: dict[str, dict | str] = {}
    for name, (result, log, kw) in _cases().items():
        try:
            out[name] = A.audit(result, log, **kw)
        except UsageError as e:
            out[name] = f"UsageError: {e}"
    return json.loads(json.dumps(out))  # as the report's JSON reads back


def test_reports_are_those_written_before():
    got = _reports()
    want = json.loads(GOLDEN.read_text())
    assert list(got) == list(want)
    for name in want:
        assert json.dumps(got[name]) == json.dumps(want[name]), name  # keys in order too


def test_the_cases_reach_what_they_vary():
    """The golden reports would hide a case that fails to vary: every verdict and join the
    cases aim at is there."""
    r = _reports()
    assert all(isinstance(v, dict) for v in r.values())
    assert r["passes"]["passed"] and not r["late"]["passed"]
    assert r["mixed"]["coverage"]["missing"] == 2 and r["mixed"]["not_comparable"] == 1
    assert r["late_client_bound"]["cause"].startswith("the client, not the server")
    assert r["late"]["cause"] != r["late_client_bound"]["cause"]
    assert r["send_order"]["joined_by"] == "send_order"
    assert r["own_origins"]["basis"] == "own_origins"
    assert r["tails"]["joined"] == 6
    assert r["miscount"]["cause"].startswith("a token count differs")


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(json.dumps(_reports(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
