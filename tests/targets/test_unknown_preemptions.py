"""An HTTP run's requests: the client cannot see the server's preemptions, so each request's
num_preemptions is unknown (null in the result), as other unknowns of the schema are."""

from __future__ import annotations

from fake_openai import endpoint_options, prompt_requests

from cbbench.bench.runner import request_record_dict
from cbbench.schema.run import Request
from cbbench.targets.http import run_http


def test_an_http_request_has_no_preemption_count(fresh_fake_server):
    """Before: 0, a count the client never had (vLLM's bench serve records none per request)."""
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests(["a b", "c d"]),
                   [0.0, 0.0])
    rows = [request_record_dict(r, detailed=False) for r in run.records]
    assert [r["error"] for r in rows] == [None, None]
    assert [r["num_preemptions"] for r in rows] == [None, None]
    assert all(Request.model_validate(r).num_preemptions is None for r in rows)
