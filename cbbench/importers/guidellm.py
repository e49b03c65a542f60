"""GuideLLM's benchmarks JSON (`guidellm benchmark run --output-path benchmarks.json`, a
GenerativeBenchmarksReport, schema version 2) -> a cbbench result.

The report holds ``benchmarks``, one per strategy GuideLLM ran (a sweep writes several); each
has ``requests`` grouped by status (``successful``, ``incomplete``, ``errored``: lists of
GenerativeRequestStats), and each request has ``info.timings`` (Unix seconds):
``targeted_start`` (when its strategy meant it to go), ``request_start`` (the send),
``first_token_iteration``, ``first_output_token_iteration`` (the first non-reasoning token),
``last_token_iteration``, ``request_end`` and ``token_iterations`` (stream events with
tokens), beside ``input_metrics``/``output_metrics`` (``text_tokens``: the server's usage, else
GuideLLM's count) and ``response_id`` (guidellm/schemas/request_stats.py, info.py).

What carries over, and how it differs from a cbbench run of the same load:
- under a strategy with an arrival schedule (constant, poisson, trace) the intended start is
  ``targeted_start`` (the schedule), so TTFT/E2EL count from it as a cbbench run does and the
  send lag is the gap to ``request_start``; GuideLLM's own TTFT counts from the send;
- the synchronous, concurrent and throughput strategies have no arrival schedule
  (guidellm/scheduler/strategies.py ``next_request_time``): ``targeted_start`` is the
  strategy's start for every throughput request, and the worker's last completion under
  synchronous and concurrent, so a request's gap to its send is its wait for one of the
  strategy's concurrency slots, not lateness. There the intended start is the send: TTFT and
  E2EL are GuideLLM's own (first token / last token - ``request_start``), and
  ``summary.latency_basis`` says ``send``;
- GuideLLM keeps no per-event times, only the first and last token and the number of events:
  the events in between are spaced evenly (as GuideLLM's own over-time figures space them), the
  first carrying one token and the rest the remaining tokens shared as evenly as whole tokens
  allow. TTFT, TPOT and E2EL are exact; ITL percentiles are per-request means, not measured gaps;
- not streamed (the backend's ``stream`` false), a request has no token times: its answer is
  one event at ``request_end`` (TTFT = E2EL, as inference-perf's and AIPerf's imports have it);
- ``incomplete`` requests (in flight when the benchmark ended) are imported as interrupted.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.errors import UsageError
from cbbench.finite import is_finite
from cbbench.importers.checks import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, check_count
from cbbench.importers.fields import ToolFields, base_config, part, spread_tokens

TOOL = "guidellm"
STATUSES = ("successful", "incomplete", "errored")
# GuideLLM's strategies without an arrival schedule (guidellm/scheduler/strategies.py): each
# request's targeted_start is when the strategy started (throughput) or when the worker's last
# request completed (synchronous, concurrent). Constant, poisson and trace give each request an
# arrival time; a strategy not named here (or none) keeps targeted_start as the intended start.
UNSCHEDULED = frozenset({"synchronous", "concurrent", "throughput"})
SEND_BASIS = "send"  # summary.latency_basis: TTFT and E2EL count from the send


class Report(ToolFields):
    benchmarks: Any = None
    config: Any = None  # the scenario: data, target, model


class Benchmark(ToolFields):
    requests: Any = None  # lists of request stats by status
    metrics: Any = None  # request_totals: the requests run, by status (sampled or not)
    config: Any = None
    start_time: Any = None
    duration: Any = None


class BenchConfig(ToolFields):
    strategy: Any = None


class Strategy(ToolFields):
    type_: Any = None
    rate: Any = None
    streams: Any = None


class Scenario(ToolFields):
    data: Any = None
    target: Any = None
    model: Any = None
    spec: Any = None  # GuideLLM 0.8: the scenario is here (Spec)


class Spec(ToolFields):
    backend: Any = None  # target, model
    data: Any = None  # a list of data-source objects


class Row(ToolFields):
    """One request's stats (guidellm/schemas/request_stats.py)."""

    info: Any = None
    input_metrics: Any = None
    output_metrics: Any = None
    response_id: Any = None
    prompt_tokens: Any = None
    output_tokens: Any = None


class Info(ToolFields):
    timings: Any = None
    error: Any = None  # an errored request's


class TokenMetrics(ToolFields):
    """input_metrics / output_metrics."""

    text_tokens: Any = None  # the server's usage, else GuideLLM's count


class Timings(ToolFields):
    """info.timings (Unix seconds), each a finite number or null (_timings checks them; kept
    as written, an int an int)."""

    request_start: Any = None
    targeted_start: Any = None
    first_token_iteration: Any = None
    first_output_token_iteration: Any = None
    last_token_iteration: Any = None
    token_iterations: Any = None
    request_end: Any = None

    def start(self, from_send: bool) -> Any:
        """The intended start: the send where the strategy has no arrival schedule
        (``from_send``), else targeted_start; whichever of the two is there (one is:
        _timings)."""
        first, other = ((self.request_start, self.targeted_start) if from_send
                        else (self.targeted_start, self.request_start))
        return first if first is not None else other


def benchmark(data: Mapping, source: str, index: int | None) -> Benchmark:
    """The benchmark to import: the only one, or ``index`` (0-based) of several."""
    benches = Report.model_validate(dict(data)).benchmarks
    if not isinstance(benches, list) or not benches:
        raise UsageError(f"{source} holds no benchmarks: not a GuideLLM benchmarks JSON")
    if index is None:
        if len(benches) > 1:
            kinds = ", ".join(f"{i}: {_strategy(b, f'{source}: benchmark {i}')}"
                              for i, b in enumerate(benches))
            raise UsageError(f"{source} holds {len(benches)} benchmarks ({kinds}): choose one "
                             "with --benchmark INDEX")
        index = 0
    if not 0 <= index < len(benches):
        raise UsageError(f"--benchmark {index}: {source} holds benchmarks 0..{len(benches) - 1}")
    bench = Benchmark.model_validate(benches[index]) if isinstance(benches[index], dict) else None
    if bench is None or not isinstance(bench.requests, dict):
        raise UsageError(f"{source}: benchmark {index} has no requests by status")
    _strategy_of(bench, f"{source}: benchmark {index}")  # an object, or refused by name
    _scenario(data, source)
    return bench


def _strategy_of(bench: Benchmark, where: str) -> Strategy | None:
    strategy = part(BenchConfig, bench.config, where, "config", TOOL).strategy
    return Strategy.model_validate(strategy) if isinstance(strategy, dict) else None


def _scenario(data: Mapping, where: str) -> Scenario:
    """The scenario's data, target and model: in config.spec (backend.target, backend.model,
    data) as GuideLLM 0.8 writes them, else in config itself."""
    scenario = part(Scenario, Report.model_validate(dict(data)).config, where, "config", TOOL)
    spec = part(Spec, scenario.spec, where, "config.spec", TOOL)
    backend = part(Scenario, spec.backend, where, "config.spec.backend", TOOL)
    sources = spec.data if isinstance(spec.data, list) else []
    # Each source's settings without GuideLLM's unset ones (dozens of nulls a source).
    workload = [{k: v for k, v in s.items() if v not in (None, {}, [])} if isinstance(s, dict)
                else s for s in sources]
    return Scenario(data=scenario.data or (json.dumps(workload) if workload else None),
                    target=scenario.target or backend.target,
                    model=scenario.model or backend.model)


def _strategy(bench: object, where: str) -> str:
    strategy = (_strategy_of(Benchmark.model_validate(bench), where)
                if isinstance(bench, dict) else None)
    if strategy is not None:
        rate = strategy.rate or strategy.streams
        kind = strategy.type_ if "type_" in strategy.model_fields_set else "?"
        return f"{kind}{f' {rate:g}' if isinstance(rate, (int, float)) else ''}"
    return "?"


def _rows(bench: Benchmark, source: str) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    totals = bench.metrics.get("request_totals") if isinstance(bench.metrics, dict) else None
    for status in STATUSES:
        group = bench.requests.get(status) or []
        if not isinstance(group, list):
            raise UsageError(f"{source}: requests.{status} is not a list")
        ran = totals.get(status) if isinstance(totals, dict) else None
        # GuideLLM's sample_size keeps that many requests of each status, its figures over all
        # of them: a sample's counts and throughputs were imported as the run's (10 of 59: 1.67
        # req/s where GuideLLM said 9.88).
        if isinstance(ran, int) and ran > len(group):
            raise UsageError(f"{source}: GuideLLM kept {len(group)} of its {ran} {status} "
                             "requests (its sample_size): a sample's counts and throughputs are "
                             "not the run's; rerun GuideLLM without sample_size")
        rows += [(status, r) for r in group]
    if not rows:
        raise UsageError(f"{source} holds no requests (GuideLLM samples them: raise "
                         "--sample-requests, or leave it unset)")
    return rows


def from_send(bench: Benchmark) -> bool:
    """The benchmark's strategy has no arrival schedule: its requests count from the send."""
    strategy = _strategy_of(bench, "the benchmark")
    return strategy is not None and strategy.type_ in UNSCHEDULED


def latency_basis(bench: Benchmark) -> str | None:
    """summary.latency_basis of the import: ``send`` where the strategy has no schedule."""
    return SEND_BASIS if from_send(bench) else None


def origin(bench: Benchmark, source: str) -> float:
    """The records' zero: the first intended start, on the Unix clock GuideLLM times on."""
    send = from_send(bench)
    return min(_timings(r, source).start(send) for _, r in _rows(bench, source))


def records(bench: Benchmark, source: str) -> list[RequestRecord]:
    rows = _rows(bench, source)
    timings = [_timings(r, f"{source}: request {i}") for i, (_, r) in enumerate(rows)]
    send = from_send(bench)
    starts = [t.start(send) for t in timings]
    t0 = min(starts)
    order = sorted(range(len(rows)), key=lambda i: starts[i])  # the schedule's order
    return [_record(k, rows[i][0], Row.model_validate(rows[i][1]), timings[i], starts[i], t0,
                    f"{source}: request {i}")
            for k, i in enumerate(order)]


def _timings(row: object, where: str) -> Timings:
    info = part(Info, Row.model_validate(row).info, where, "info", TOOL) \
        if isinstance(row, dict) else None
    t = info.timings if info is not None else None
    if not isinstance(t, dict):
        raise UsageError(f"{where} has no info.timings.request_start")
    timings = Timings.model_validate(t)
    if timings.request_start is None and timings.targeted_start is None:
        raise UsageError(f"{where} has no info.timings.request_start")
    for k, v in t.items():
        if v is not None and not is_finite(v):
            raise UsageError(f"{where}: info.timings.{k} holds {v!r}, not a time")
    return timings


def _record(k: int, status: str, row: Row, t: Timings, start: float, t0: float, where: str):
    send = t.request_start
    rec = RequestRecord(
        id=k,
        prompt_tokens=_tokens(row.input_metrics, "input_metrics", row.prompt_tokens, where),
        output_tokens=_tokens(row.output_metrics, "output_metrics", row.output_tokens, where),
        intended_start_s=start - t0,
        send_s=send - t0 if send is not None else None,
        server_request_id=row.response_id,
    )
    rec.output_tokens_method = TOOL
    rec.output_token_counts = {TOOL: rec.output_tokens}
    if status == "errored":
        error = part(Info, row.info, where, "info", TOOL).error
        rec.error, rec.error_type = str(error or "errored"), "error"
        return rec
    if status == "incomplete":
        rec.error = "incomplete: in flight when the GuideLLM benchmark ended"
        rec.error_type = "interrupted"
        return rec
    first, last = t.first_token_iteration, t.last_token_iteration
    if first is None and rec.output_tokens > 0 and not t.token_iterations:
        # Not streamed (stream=false: GuideLLM counts the tokens but times none of them): the
        # whole answer at the request's end, one event (each was imported as a failure).
        first = last = t.request_end
    if first is None:
        rec.error, rec.error_type = "no token arrived", "error"
        return rec
    rec.token_times_s, rec.event_tokens = _events(
        first - t0, (last if last is not None else first) - t0,
        int(t.token_iterations or 1), rec.output_tokens)
    rec.event_tokens_method = TOOL
    out_first = t.first_output_token_iteration
    if out_first is not None and out_first != first:  # it reasoned first
        rec.first_output_s = out_first - t0
    return rec


def _events(first: float, last: float, events: int, tokens: int):
    """Evenly spaced events from the first to the last token: the first one token, the rest
    sharing the remaining tokens as evenly as whole tokens go (largest remainders first)."""
    events = max(1, min(events, tokens)) if tokens > 0 else 1
    times = [float(t) for t in np.linspace(first, last, events)] if events > 1 else [first]
    if events == 1:
        return times, [max(tokens, 1)]
    return times, spread_tokens(tokens, events)


def _tokens(metrics: Any, group: str, computed: Any, where: str) -> int:
    """The tokens of ``metrics`` (the row's ``group``: its text_tokens), else ``computed``
    (the row's prompt_tokens / output_tokens)."""
    v = part(TokenMetrics, metrics, where, group, TOOL).text_tokens
    if v is None:
        v = computed
    if v is None:
        return 0
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    limit = MAX_OUTPUT_TOKENS if group == "output_metrics" else MAX_PROMPT_TOKENS
    # Bounded before any event is built from it (10^11 once asked numpy for 745 GiB).
    return check_count(v, limit, f"{group}.text_tokens", where)


def config(data: Mapping, bench: Benchmark, recs: list[RequestRecord]) -> dict:
    # Both configs are objects (or none): benchmark() refused anything else by name.
    strategy = _strategy_of(bench, "the benchmark")
    rate = strategy.rate if strategy is not None else None
    scenario = _scenario(data, "the report")
    return {
        **base_config(TOOL, len(recs)),
        "workload": str(scenario.data or "unknown")[:200],
        "request_rate": rate if isinstance(rate, (int, float)) else None,
        "endpoint": scenario.target,
        "served_model": scenario.model,
        "model": scenario.model,
        "strategy": strategy.type_ if strategy is not None else None,
    }


def started_at(bench: Benchmark) -> str | None:
    start = bench.start_time
    if not is_finite(start):
        return None
    return dt.datetime.fromtimestamp(start, dt.timezone.utc).isoformat(timespec="seconds")
