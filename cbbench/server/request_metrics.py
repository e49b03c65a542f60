"""`cbbench serve --enable-per-request-metrics`: vLLM's per-request timings in the response
body, field for field (vLLM's PerRequestTimingMetrics, built by its
build_per_request_timing_metrics), so a client reads cbbench serve and vLLM alike:

- ``queue_time_ms``: queued -> first scheduled (the scheduler taking the request in, the
  log's ``admitted``, to its first batch; vLLM: its QUEUED event to its SCHEDULED, the same
  interval as ``vllm:request_queue_time_seconds``);
- ``time_to_first_token_ms``: first scheduled -> first token made (the prefill, as vLLM
  names it: not the client's TTFT, which counts from the request's start);
- ``generation_time_ms``: first token made -> last token made (the decode);
- ``mean_itl_ms``: the decode over (output tokens - 1), for more than one token;
- ``tokens_per_second``: output tokens over first scheduled -> last token.

Each is None where a timestamp it needs is missing. The times are the ones the request log
writes as ``admitted``, ``queue_exit``, ``first_token`` and ``last_token``, so the two agree to
the log's microsecond.
vLLM sends the object as ``metrics`` on a non-streamed response, and on a stream's final usage
chunk (only when usage is asked for: stream_options.include_usage).
"""

from __future__ import annotations

from cbbench.engine.core.request import Request

MS = 1000.0
METRICS_FIELD = "metrics"
FIELDS = (
    "time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
    "tokens_per_second",
)


def timing_metrics(queued: float | None, scheduled: float | None, first: float | None,
                   last: float | None, num_generation_tokens: int) -> dict:
    """vLLM's five fields from the four timestamps (seconds, one clock)."""
    out: dict = dict.fromkeys(FIELDS)
    if scheduled is not None and first is not None:
        out["time_to_first_token_ms"] = (first - scheduled) * MS
    if first is not None and last is not None:
        out["generation_time_ms"] = (last - first) * MS
        if num_generation_tokens > 1:
            out["mean_itl_ms"] = (last - first) / (num_generation_tokens - 1) * MS
    if queued is not None and scheduled is not None:
        out["queue_time_ms"] = (scheduled - queued) * MS
    if scheduled is not None and last is not None and last > scheduled:
        out["tokens_per_second"] = num_generation_tokens / (last - scheduled)
    return out


def request_metrics(req: Request, queued: float | None) -> dict:
    """The ``metrics`` object of a finished engine request; ``queued``: when the scheduler
    took it in, on the engine's clock (the arrival is earlier by the wait for the step in
    flight, which vLLM's queue time leaves out too)."""
    times = req.token_times
    return timing_metrics(
        queued, req.first_scheduled_time, times[0] if times else None,
        times[-1] if times else None, req.num_output_tokens,
    )
