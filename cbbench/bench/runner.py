"""One benchmark run, target-agnostic: workload -> arrival schedule -> target -> result dict."""

from __future__ import annotations

import datetime as _dt
import logging
import math
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cbbench import __version__
from cbbench.analysis.compact.compact_run import CompactRun
from cbbench.analysis.comparison.sim_error import sim_error
from cbbench.analysis.summary.columns import RequestColumns, request_columns, token_gaps_s
from cbbench.analysis.summary.deployment import add_deployment
from cbbench.analysis.summary.inputs import add_input_figures
from cbbench.analysis.summary.metrics import (
    add_utilization,
    engine_columns,
    gpu_of,
    itl_histogram,
    summarize,
    summarize_engine_columns,
)
from cbbench.analysis.summary.speculative import engine_speculative
from cbbench.analysis.summary.splits import add_splits
from cbbench.analysis.summary.steady_state import steady_state
from cbbench.analysis.summary.telemetry import add_energy_per_output_token
from cbbench.analysis.summary.turns import by_turn, session_summary
from cbbench.bench.run_spec import DEFAULT_NUM_REQUESTS as DEFAULT_NUM_REQUESTS  # re-exported:
from cbbench.bench.run_spec import RunSpec as RunSpec  # callers import RunSpec from here
from cbbench.bench.target_run import iterations_of
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.arrivals import arrival_times, count_within, resolve_process
from cbbench.load.cancel import cancel_plan
from cbbench.load.delays import parse_delay
from cbbench.load.images import RANDOM_MM_WORKLOAD, ImageSpec
from cbbench.load.limits import check_request_count
from cbbench.load.session_plan import DEFAULT_THINK_TIME, SessionPlan
from cbbench.load.sessions import Session, check_session_tokens, sample_sessions
from cbbench.load.synthetic import RANDOM_WORKLOAD, RandomSpec, random_workload
from cbbench.load.workload import BUILTIN_WORKLOADS, Workload, load_workload, sample_requests
from cbbench.load.workload_types import WorkloadRequest
from cbbench.schema import RUN_SCHEMA_VERSION, RunResult, as_run_result
from cbbench.targets.engine import EngineRun, engine_config_dict, run_engine

if TYPE_CHECKING:
    from cbbench.bench.dcgm import DcgmScraper
    from cbbench.bench.nvml_sampler import TelemetrySampler
    from cbbench.load.cancel import CancelPlan

log = logging.getLogger(__name__)

def request_record_dict(rec, detailed: bool) -> dict:
    ms = 1000.0
    d = {
        "id": rec.id,
        "prompt_tokens": rec.prompt_tokens,
        "output_tokens": rec.output_tokens,
        "ttft_ms": rec.ttft_s * ms if rec.ttft_s is not None else None,
        "tpot_ms": rec.tpot_s * ms if rec.tpot_s is not None else None,
        "e2el_ms": rec.e2el_s * ms if rec.e2el_s is not None else None,
        "error": rec.error,
        "cancelled": rec.cancelled,
        "error_type": rec.error_type,
        "intended_start_s": rec.intended_start_s,
        # From when the client was ready: the intended start, or a freed --max-concurrency slot.
        "send_lag_ms": (rec.send_s - rec.ready_s) * ms if rec.send_s is not None else None,
        "num_preemptions": rec.num_preemptions,
        "priority": rec.priority,
        # Issue 24: null when unknown (no reasoning_len in-process; a server that sent none).
        "ttfot_ms": rec.ttfot_s * ms if rec.ttfot_s is not None else None,
        "reasoning_tokens": rec.reasoning_tokens,
        "cached_tokens": rec.cached_tokens,
    }
    if rec.event_tokens_method is not None:
        d["tokens_per_event_method"] = rec.event_tokens_method
    if rec.tool_calls is not None:
        d["tool_calls"] = rec.tool_calls
    if rec.worker is not None:
        d["worker"] = rec.worker
    if rec.first_scheduled_s is not None:
        d["queue_ms"] = (rec.first_scheduled_s - rec.intended_start_s) * ms
    if rec.max_tokens is not None:
        d["max_tokens"] = rec.max_tokens
    if rec.server_prompt_tokens is not None:
        d["server_prompt_tokens"] = rec.server_prompt_tokens
    if rec.turn is not None:
        d["session_id"] = rec.session_id
        d["turn"] = rec.turn
        d["turn_kind"] = rec.turn_kind
        if rec.agent is not None:
            d["agent"] = rec.agent
    if rec.slot_s is not None:
        d["slot_wait_ms"] = (rec.slot_s - rec.intended_start_s) * ms
        d["ttft_from_send_ms"] = rec.ttft_from_send_s * ms if rec.ok else None
        # What an --slo judges a capped request on (analysis/summary/metrics.py meets_slo).
        d["e2el_from_send_ms"] = rec.e2el_from_send_s * ms if rec.ok else None
    if rec.output_tokens_method is not None:  # HTTP: how the output was counted, and asked
        d["output_tokens_method"] = rec.output_tokens_method
        d["output_token_counts"] = rec.output_token_counts
        d["max_tokens"] = rec.max_tokens
        d["finish_reason"] = rec.finish_reason
        d["server_request_id"] = rec.server_request_id  # null: the server sent no id
        d["endpoint"] = rec.endpoint  # issue 27: the URL it went to (null: an import)
        d["model"] = rec.model  # the model (or LoRA adapter) it asked for
    if rec.prompt_token_counts is not None:
        d["prompt_token_counts"] = rec.prompt_token_counts
    d.update(_known(rec, ("server_timing", "ttft_parts", "e2el_parts")))  # issue 27
    _input_fields(rec, d)
    if detailed:
        t = rec.token_times_s
        d["token_times_s"] = list(t)
        d["send_s"] = rec.send_s
        d["first_output_s"] = rec.first_output_s
        if rec.event_tokens is not None:
            d["event_tokens"] = list(rec.event_tokens)
        d["itl_ms"] = (token_gaps_s(rec)[0] * ms).tolist()  # per token (k gaps of g/k)
        if rec.output_token_ids is not None:
            d["output_token_ids"] = rec.output_token_ids
    return d


def _known(rec, names: tuple[str, ...]) -> dict:
    """The record's fields among ``names`` that are set."""
    return {k: getattr(rec, k) for k in names if getattr(rec, k) is not None}


def _input_fields(rec, d: dict) -> None:
    """Issue 26: a request's images (image_tokens null where unknown), embeddings/rerank
    inputs and its body's bytes."""
    if rec.images is not None:
        d["images"] = rec.images
        d["image_bytes"] = rec.image_bytes
        d["image_tokens"] = rec.image_tokens
    if rec.inputs is not None:
        d["inputs"] = rec.inputs
        d["server_request_id"] = rec.server_request_id  # joins the server's log line
    if rec.request_bytes is not None:
        d["request_bytes"] = rec.request_bytes


REDACTED = "<redacted>"
URL_FLAGS = ("--endpoint", "--gpu-metrics")  # a URL's user:password@ and query are dropped


def _redact_option(flag: str, value: str) -> str:
    from cbbench.targets.options import redact_url

    if flag in URL_FLAGS:
        return redact_url(value)
    key, sep, val = value.partition("=")
    if sep and not (val.startswith("env:") or val.startswith("$")):
        return f"{key}={REDACTED}"  # a literal header value may be an API key
    return value


def recorded_command(argv: list[str]) -> str:
    """The command line for the result file, with literal header values and URL credentials
    removed (the env:NAME / $NAME forms name a variable, not a secret, and are kept)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, inline = arg.partition("=")
        if flag == "--header" or flag in URL_FLAGS:
            if eq:
                out.append(f"{flag}={_redact_option(flag, inline)}")
            elif i + 1 < len(argv):
                out += [arg, _redact_option(flag, argv[i + 1])]
                i += 1
            else:
                out.append(arg)
        else:
            out.append(arg)
        i += 1
    # Quoted as a shell reads it back: a --label or a path with a space re-runs as given.
    return shlex.join(["cbbench", *out])


def _telemetry_indices(spec: RunSpec) -> list[int] | None:
    """GPUs to sample: the torch engine's device, or --gpu-index for an endpoint on this host.
    None: nothing to sample (the simulated GPU)."""
    if spec.endpoint is not None:
        return [spec.output.gpu_index] if spec.output.gpu_index is not None else None
    if spec.engine.engine == "sim" or _runs_on_cpu(spec.engine):
        return None
    return [spec.output.gpu_index if spec.output.gpu_index is not None else 0]


def _runs_on_cpu(args: EngineArgs) -> bool:
    """The torch engine on the CPU (--device cpu, or no CUDA device): no GPU to sample, which
    is information, not a failed NVML start to warn about."""
    if args.device is not None:
        return args.device.startswith("cpu")
    from cbbench.engine.build import cuda_available

    return not cuda_available()


# --tool-time-scale's upper end: tools a thousand times slower is past any use, and it keeps a
# scaled wait a number every clock can sleep on.
MAX_TOOL_TIME_SCALE = 1000.0


def check_time_scale(process: str, time_scale: float) -> None:
    """--time-scale's value, and that it has a trace to scale."""
    if time_scale == 1.0:
        return
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise UsageError(f"--time-scale must be a positive number, got {time_scale}")
    if process != "trace":
        raise UsageError("--time-scale applies to --arrival trace (the trace's own timestamps)")


def scale_trace_time(arrivals, process: str, time_scale: float):
    """--time-scale: a trace's offsets times X (X < 1 replays faster, X > 1 slower). The
    first request stays at 0. --duration counts on the same scaled times (_request_count)."""
    check_time_scale(process, time_scale)
    if time_scale == 1.0:
        return arrivals
    from cbbench.load.arrivals import check_schedule_span, scale_times

    scaled = scale_times(arrivals, time_scale)
    check_schedule_span(scaled, "--time-scale and the trace's arrival_s")  # bypassed it before
    return scaled


@dataclass
class Schedule:
    """What a run sends and when, decided before anything is sent."""

    workload: Workload
    process: str | None  # the arrival process (the replayed run's, on --replay)
    until: float | None  # --duration (or a ramp's own length); None: bound by the count
    wreqs: list  # the requests (empty for a session workload: the plan sends them)
    arrivals: np.ndarray  # their arrival offsets, or the sessions' first turns'
    plan: SessionPlan | None
    cancel: CancelPlan | None  # the --cancel-rate plan


def execute_run(
    spec: RunSpec,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    live=None,
    records: bool = True,
) -> RunResult:
    """One run: the schedule, the target, then the result as its model (cbbench/schema/run.py;
    ``write_result`` writes it). ``live``: a LiveBoard (cbbench/targets/live.py) a live view
    reads while the run runs. ``records``: False leaves the per-request and per-iteration
    records out (--summary-only), so a million-request run never builds them."""
    replay = None
    if spec.load.replay is not None:
        from cbbench.bench.replay import load_replay

        replay = load_replay(str(spec.load.replay), spec.engine)
        spec = replay.run_spec(spec)
    sched = plan_schedule(spec, replay)
    if live is not None:
        _plan_live(live, spec, sched)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    telemetry = Telemetry(spec)
    try:
        run, target_config = _run_target(spec, sched, telemetry, should_stop, on_progress, live)
    finally:
        telemetry.stop()
    config = _run_config(spec, sched, target_config)
    summary = _summary(spec, sched, run)
    server_side: dict[str, Any] = {}
    if spec.endpoint is not None:
        server_side = _add_http_figures(summary, run)
        add_splits(summary, run.records, run.duration_s, spec.percentiles)
    # The run's steady window, so the telemetry's "steady state" is the run's (it was the middle
    # 80% of the sampled span, another window under the same words).
    window = (summary.get("steady_state") or {}).get("window_s")
    # The run's figures over the run's span, [t0, its end]: the sampler ran before and after it.
    telemetry_result = telemetry.result(tuple(window) if window else None,
                                        (0.0, float(summary["duration_s"])))
    add_energy_per_output_token(telemetry_result, summary.get("total_output_tokens"))
    requests, iterations = _records(run, spec, records)
    # The file's keys in the file's order (tests/cli/test_golden_results.py holds it).
    return as_run_result({
        "schema_version": RUN_SCHEMA_VERSION,
        "cbbench_version": __version__,
        "interrupted": run.interrupted,
        "config": config,
        "started_at": started,
        **server_side,
        "summary": summary,
        "telemetry": telemetry_result,
        "requests": requests,
        "iterations": iterations,
    })


def _records(run, spec: RunSpec, keep: bool) -> tuple[list[dict], list[dict]]:
    """The result's per-request and per-iteration rows (none unless ``keep``)."""
    if not keep:
        return [], []
    if isinstance(run, CompactRun):
        from cbbench.analysis.compact.compact_rows import (
            compact_iteration_dicts,
            compact_request_dicts,
        )

        return (list(compact_request_dicts(run, spec.output.save_detailed, run.view)),
                list(compact_iteration_dicts(run)))
    return ([request_record_dict(r, spec.output.save_detailed) for r in run.records],
            iterations_of(run))


def _load_workload(spec: RunSpec, replay) -> Workload:
    if replay is not None:
        return Workload(str(replay.config.workload), replay.requests)
    if spec.load.workload == RANDOM_WORKLOAD:
        return Workload(RANDOM_WORKLOAD, [])  # made once the request count is known
    if spec.load.workload == RANDOM_MM_WORKLOAD:
        return Workload(RANDOM_MM_WORKLOAD, [])
    pooling = spec.endpoint is not None and spec.endpoint.pooling
    if spec.endpoint is not None and spec.endpoint.tokenizer:
        from cbbench.load.prompts import count_prompt_tokens, count_tokens, load_tokenizer

        tok = load_tokenizer(spec.endpoint.tokenizer)
        # A request's text prompt counts as the server counts it, special tokens included
        # (vLLM's len(tokenizer(prompt).input_ids): Llama-3's BOS, left out before); a session
        # message counts its content alone, the chat template adding the rest.
        return load_workload(spec.load.workload, lambda text: count_tokens(tok, text), pooling,
                             count_prompt=lambda text: count_prompt_tokens(tok, text))
    return load_workload(spec.load.workload, pooling=pooling)


def _request_count(spec: RunSpec, workload: Workload, process: str) -> tuple[int | None, float | None]:
    """How many requests (None: the whole file, in order) and the time bound, if any."""
    num_requests = spec.load.num_requests
    until = spec.duration_s
    if until is None and spec.ramp is not None and num_requests is None:
        until = spec.ramp.seconds  # a ramp alone runs for its own length
    if until is not None:
        # Time-bound: as many requests (or sessions) as the schedule has arrivals before the
        # time is up, on the schedule as sent: a trace's times scaled by --time-scale (counted
        # on the file's own times, 0.5 sent half the duration's requests, 2 ran twice past it).
        check_time_scale(process, spec.load.time_scale)
        num_requests = count_within(
            until, spec.request_rate, spec.load.burstiness, process, spec.load.seed, spec.ramp,
            workload.sessions if workload.is_sessions else workload.requests,
            time_scale=spec.load.time_scale,
        )
    elif num_requests is None and (
        spec.load.workload in BUILTIN_WORKLOADS or spec.load.workload in (RANDOM_WORKLOAD,
                                                                RANDOM_MM_WORKLOAD)
    ):
        # Built-ins are large traces: sample vLLM's default count. A user's file without the
        # flag is replayed whole, in order.
        num_requests = DEFAULT_NUM_REQUESTS
    if num_requests is not None:
        check_request_count(num_requests, f"--num-requests {num_requests}")
    return num_requests, until


def _draw(spec: RunSpec, workload: Workload, num_requests: int | None):
    """The drawn requests (or sessions), the notices of a small workload said once."""
    drawn: list[Session] | list[WorkloadRequest]
    if workload.is_sessions:
        assert workload.sessions is not None  # is_sessions says so
        drawn, replaced = sample_sessions(workload.sessions, num_requests, spec.load.seed)
        check_session_tokens(drawn)
        what = f"{len(workload.sessions)} sessions"
    else:
        drawn, replaced = sample_requests(workload, num_requests, spec.load.seed)
        what = f"{len(workload.requests)} requests"
    if replaced:
        log.info(f"the workload has {what}; drew {num_requests} with replacement")
    for note in workload.notes:
        log.info(note)
    return drawn


def random_mm_workload(random: RandomSpec, images: ImageSpec, num_requests: int,
                       seed: int) -> Workload:
    """--workload random: the lengths; then each request's images (load/images.py)."""
    from dataclasses import replace

    base = random_workload(random, num_requests, seed)
    refs = images.refs(len(base.requests), seed)
    reqs = [replace(w, images=r) for w, r in zip(base.requests, refs)]
    sizes = ", ".join(f"{w}x{h}" for w, h in images.sizes)
    return Workload(RANDOM_MM_WORKLOAD, reqs, f"{base.description}; {images.per_request} "
                    f"{images.format} image(s) per request of {sizes}")


def check_workload_api(spec: RunSpec, drawn) -> None:
    """Refuse a workload the target's API cannot send (it would be dropped silently)."""
    if spec.load.workload == RANDOM_MM_WORKLOAD or any(
            getattr(w, "images", None) for w in drawn):
        if spec.endpoint is None:
            raise UsageError("image workloads go to an endpoint: give --endpoint (cbbench serve "
                             "--engine sim charges images on a simulated GPU)")
        if spec.endpoint.api != "chat":
            raise UsageError(f"images are sent in chat messages: use --api chat, not "
                             f"--api {spec.endpoint.api}")


def plan_schedule(spec: RunSpec, replay=None) -> Schedule:
    workload = _load_workload(spec, replay)
    process = resolve_process(
        spec.load.arrival, spec.request_rate, workload.has_arrivals,
        spec.load.rate_given or spec.ramp is not None,
    )
    num_requests, until = _request_count(spec, workload, process)
    # _request_count sizes a generated workload: a time bound's count or vLLM's default.
    if spec.load.workload == RANDOM_WORKLOAD:
        assert num_requests is not None
        workload = random_workload(spec.random, num_requests, spec.load.seed)
        num_requests = None  # generated in order: keep them all
    elif spec.load.workload == RANDOM_MM_WORKLOAD:
        assert num_requests is not None
        workload = random_mm_workload(spec.random, spec.images or ImageSpec(), num_requests,
                                      spec.load.seed)
        num_requests = None
    drawn = _draw(spec, workload, num_requests)
    check_workload_api(spec, drawn)
    # For a session workload the arrival process places each session's first turn.
    arrivals = arrival_times(
        drawn, spec.request_rate, spec.load.burstiness, process, spec.load.seed, spec.ramp
    )
    arrivals = scale_trace_time(arrivals, process, spec.load.time_scale)
    if replay is not None:
        process, arrivals = replay.config.arrival, replay.arrivals
    cancel = cancel_plan(spec.load.cancel_rate, spec.load.cancel_after, spec.load.seed)
    if workload.is_sessions:
        scale = spec.load.tool_time_scale
        if not (math.isfinite(scale) and 0 <= scale <= MAX_TOOL_TIME_SCALE):
            raise UsageError(f"--tool-time-scale must be between 0 and {MAX_TOOL_TIME_SCALE:g}, "
                             f"got {scale:g}")
        plan = SessionPlan(drawn, arrivals, parse_delay(
            spec.load.think_time or DEFAULT_THINK_TIME, "--think-time"), spec.load.seed,
            tool_time_scale=scale)
        return Schedule(workload, process, until, [], arrivals[:0], plan, cancel)
    if spec.load.think_time is not None:
        raise UsageError("--think-time applies to multi-turn session workloads")
    if spec.load.tool_time_scale != 1.0:
        raise UsageError("--tool-time-scale applies to agent session workloads (tool turns)")
    return Schedule(workload, process, until, drawn, arrivals, None, cancel)


class Telemetry:
    """GPU telemetry around a run: prepared before the run's clock starts, started on that
    clock, stopped however it ends.

    prepare() holds everything slow (the imports, NVML's start-up: tens of milliseconds and
    more), so that it runs before the clock's zero: inside the timed window, requests
    arriving at t=0 waited for it at an idle engine and their TTFT counted it. start() then
    only starts the sampling threads."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.indices = _telemetry_indices(spec)
        self.sampler: TelemetrySampler | DcgmScraper | None = None
        self._clock: Any = None  # the run's, once start() has it: the samplers stamp with it
        self._prepared = False

    def _now(self) -> float:
        assert self._clock is not None, "a sampler read the clock before the run started it"
        return self._clock.now()

    def prepare(self) -> None:
        """Build the sampler and open NVML, before the run's clock starts (once; start()
        prepares where this was not called)."""
        if self._prepared:
            return
        self._prepared = True
        if self.spec.output.gpu_metrics:
            self._prepare_dcgm()
            return
        if self.indices is None:
            return
        from cbbench.bench.nvml_sampler import TelemetrySampler

        # The engine's own device is a CUDA ordinal of this process (CUDA_VISIBLE_DEVICES
        # applied): mapped to its NVML handle by PCI bus id. --gpu-index is NVML's numbering.
        spec = self.spec
        kind = "cuda" if spec.endpoint is None and spec.output.gpu_index is None else "nvml"
        sampler = TelemetrySampler(
            self.indices, spec.output.telemetry_interval, clock=self._now, index_kind=kind
        )
        sampler.open()
        self.sampler = sampler

    def _prepare_dcgm(self) -> None:
        """--gpu-metrics: the DCGM exporters' pages, on the run's clock (URL credentials kept
        out of the result)."""
        from cbbench.bench.dcgm import DcgmScraper
        from cbbench.targets.options import redact_url

        urls = list(self.spec.output.gpu_metrics or [])
        self.sampler = DcgmScraper(urls, self.spec.output.telemetry_interval, clock=self._now,
                                   shown_urls=[redact_url(u) for u in urls])

    def start(self, clock) -> None:
        """Start sampling on ``clock``, the run's (at its zero)."""
        self.prepare()
        self._clock = clock
        if self.sampler is not None:
            self.sampler.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def result(self, window: tuple[float, float] | None = None,
               span: tuple[float, float] | None = None) -> dict:
        """The telemetry section; ``window``: the run's steady window (start_s, end_s), over
        which the steady figures are taken (None: the middle 80%); ``span``: the run's
        (0, duration_s), over which every figure is taken (None: every sample)."""
        from cbbench.analysis.summary.telemetry import (
            CPU_RUN_REASON,
            SIMULATED_GPU_REASON,
            unavailable,
            warning_line,
        )

        if self.sampler is not None:
            telemetry = self.sampler.to_result(window, span)
        elif self.spec.output.gpu_metrics:  # the target never started its clock (array simulator)
            telemetry = unavailable("the run's clock never started: no DCGM page was scraped")
        elif self.spec.endpoint is not None:
            telemetry = unavailable("remote endpoint: give --gpu-metrics URL (the server's DCGM "
                                    "exporter) or --gpu-index (a GPU on this host)")
        elif self.spec.engine.engine != "sim":
            telemetry = unavailable(CPU_RUN_REASON)
        else:
            telemetry = unavailable(SIMULATED_GPU_REASON)
        line = warning_line(telemetry)
        if line and (self.indices is not None or self.spec.output.gpu_metrics):
            log.info(line)
        return telemetry


def _plan_live(live, spec: RunSpec, sched: Schedule) -> None:
    arrivals = sched.arrivals
    total = sched.plan.num_turns if sched.plan is not None else len(sched.wreqs)
    planned = sched.until if sched.until is not None else (
        float(max(arrivals)) if sched.plan is None and len(arrivals) else None)
    live.plan(total, planned, spec.request_rate if spec.ramp is None else None)


def _run_target(spec: RunSpec, sched: Schedule, telemetry: Telemetry, should_stop, on_progress,
                live=None):
    """Send the schedule to the endpoint or the bundled engine; the run and its config."""
    if spec.endpoint is not None:
        from cbbench.distributed.run import SinceInstant, run_load

        telemetry.prepare()  # NVML's start-up, before any t0
        # Sampling starts at the requests' t0, which the client takes after its own set-up
        # (the tokenizer, the served model, sizing the prompts, the workers): seconds, not
        # the µs a clock started here assumed, and every sample was stamped that much late.
        on_t0 = lambda t0: telemetry.start(SinceInstant(t0))  # noqa: E731
        run = run_load(
            spec.endpoint, sched.wreqs, sched.arrivals, spec.load_plan, should_stop=should_stop,
            on_progress=on_progress, on_t0=on_t0, sessions=sched.plan, cancel=sched.cancel,
            live=live,
        )
        return run, {
            "target": "http", **spec.endpoint.to_config(run.info.get("served_model")),
            **spec.load_plan.to_config(len(run.info["workers"])),
        }
    engine_run: EngineRun | CompactRun | None = _run_compact(spec, sched, should_stop,
                                                              on_progress, live)
    if engine_run is None:
        engine_run = run_engine(
            spec.engine, sched.wreqs, sched.arrivals, should_stop=should_stop,
            on_progress=on_progress, keep_token_ids=spec.output.save_detailed,
            prepare=telemetry.prepare, on_start=telemetry.start, sessions=sched.plan,
            cancel=sched.cancel, live=live,
        )
    return engine_run, {
        "target": "engine",
        **{
            f"engine_{k}" if k == "seed" else k: v
            for k, v in engine_config_dict(spec.engine, engine_run.resolved).items()
        },
    }


def _run_compact(spec: RunSpec, sched: Schedule, should_stop, on_progress,
                 live=None) -> CompactRun | None:
    """A large simulated run by the array simulator (targets/engine_compact.py), where it
    models the run; None: the object engines run it. Its simulated GPU has no telemetry to
    start."""
    from cbbench.targets import engine_compact

    if len(sched.wreqs) < engine_compact.COMPACT_MIN_REQUESTS:
        return None
    why = engine_compact.compact_unsupported(spec.engine, sched.wreqs, sessions=sched.plan,
                                             cancel=sched.cancel)
    if why is not None:
        log.info(f"{len(sched.wreqs)} requests with {why}: the engine's objects step this run "
                 "(the array simulator does not model it; slower at this size)")
        return None
    return engine_compact.run_engine_compact(spec.engine, sched.wreqs, sched.arrivals,
                                             should_stop, on_progress, live=live)


def _run_config(spec: RunSpec, sched: Schedule, target_config: dict) -> dict:
    plan, cancel = sched.plan, sched.cancel
    return {
        "label": spec.output.label,
        "workload": sched.workload.name,
        "num_requests": len(sched.wreqs) if plan is None else len(plan.sessions),
        **({"sessions": plan.to_config()} if plan is not None else {}),
        **(cancel.to_config() if cancel is not None else {}),
        "seed": spec.load.seed,
        # JSON has no infinity: "inf" is written as the string the CLI takes.
        "request_rate": (
            None if spec.ramp is not None
            else "inf" if math.isinf(spec.request_rate) else spec.request_rate
        ),
        "ramp": spec.ramp.to_config() if spec.ramp is not None else None,
        "duration_s": sched.until,  # None: bound by the request count
        "burstiness": spec.load.burstiness,
        "arrival": sched.process,
        **({"time_scale": spec.load.time_scale} if spec.load.time_scale != 1.0 else {}),
        **({"random": spec.random.to_config()}
           if spec.load.workload in (RANDOM_WORKLOAD, RANDOM_MM_WORKLOAD) else {}),
        **({"images": (spec.images or ImageSpec()).to_config()}
           if spec.load.workload == RANDOM_MM_WORKLOAD else {}),
        **({"replay": spec.load.replay.name} if spec.load.replay is not None else {}),
        "slo": spec.slo,
        "percentiles": list(spec.percentiles),
        **({"slice_s": spec.slice_s} if spec.slice_s is not None else {}),
        **target_config,
        "command": recorded_command(sys.argv[1:]),
    }


def _summary(spec: RunSpec, sched: Schedule | None, run) -> dict:
    """The run's summary, one path for every kind of run: its requests as columns, then the
    same functions over them. ``sched``: None where no schedule is at hand (a column run a
    benchmark built): no session plan, no intervals."""
    iterations = iterations_of(run)  # the rows; a column run's steps are its columns
    # The requests and the iterations as columns (None: no iteration), which every figure reads.
    if isinstance(run, CompactRun):  # the array simulator's run (analysis/compact/)
        from cbbench.analysis.compact.compact_summary import check_compact_scope, compact_columns

        check_compact_scope(run, spec)
        cols = run.view = compact_columns(run)  # made once: the summary's and the rows' columns
        steps = run.steps.columns if len(run.steps) else None
    else:
        cols = request_columns(run.records)
        steps = engine_columns(iterations) if iterations else None
    pooled = cols.tokens.pooled_gaps_ms(np.flatnonzero(cols.ok))  # the completed requests'
    summary = summarize(cols, run.duration_s, spec.slo, spec.percentiles, pooled)
    add_views(summary, spec, run, cols)
    # The report draws ITL from this without --save-detailed (cbbench/analysis/summary/histogram.py).
    summary["itl_histogram"] = itl_histogram(cols, pooled)
    plan = sched.plan if sched is not None else None
    if plan is not None:
        summary["by_turn"] = by_turn(cols, spec.percentiles)
        summary["sessions"] = session_summary(
            run.records, plan.planned_turns(), run.sessions_ended_early, spec.percentiles
        )
    summary["steady_state"] = steady_state(
        cols, run.duration_s, steps, spec.output.warmup, spec.output.cooldown, spec.percentiles,
    )
    if steps is not None:
        summary["engine"] = _engine_summary(run, iterations, steps)
        speculative = engine_speculative(
            iterations, getattr(run.resolved, "speculative_tokens", None)
        )
        if speculative is not None:
            summary["speculative"] = speculative
    if spec.endpoint is None:
        add_deployment(summary, spec.engine, run, iterations, spec.percentiles)
        if not run.interrupted and sched is not None:
            add_intervals(summary, spec, sched)
    if spec.endpoint is not None:
        add_input_figures(summary, run.records, run.duration_s, spec.endpoint.pooling)
    if run.not_sent:
        summary["not_sent"] = run.not_sent
    return summary


def add_views(summary: dict, spec: RunSpec, run, cols: RequestColumns) -> None:
    """Issue 27's views of the run: the TTFT / E2EL breakdown (endpoint runs whose server told
    its timings) and the time slices (--slice)."""
    if spec.endpoint is not None:
        from cbbench.analysis.server_side.server_join import read_log_for
        from cbbench.analysis.server_side.ttft_breakdown import attach_parts, summarize_breakdown

        server_log = None
        if spec.output.server_log:
            try:
                server_log = read_log_for(str(spec.output.server_log), run.records)
            except UsageError as e:  # the run is measured: keep it, without the log's split
                log.info(f"warning: --server-log not used ({e}); the TTFT split is the response's")
        if attach_parts(run.records, server_log, run.info.get("t0_epoch_s")):
            summary.update(summarize_breakdown(run.records, percentiles=spec.percentiles))
    if spec.slice_s is not None:
        from cbbench.analysis.summary.slices import time_slices

        try:
            summary["slices"] = time_slices(cols, run.duration_s, spec.slice_s,
                                            spec.percentiles)
        except UsageError as e:  # a side product: it costs the slices, never the result
            log.info(f"warning: --slice not applied ({e})")


def _engine_summary(run: EngineRun | CompactRun, iterations: list[dict], steps) -> dict:
    """summary.engine from the iterations' columns; MBU and MFU into the iteration rows where
    the GPU is known (a column run has none: compact_rows adds its own)."""
    gpu_spec = run.resolved.gpu_spec
    if (gpu := gpu_of(gpu_spec)) is not None:
        for it in iterations:
            add_utilization(it, gpu, run.resolved.dtype)
    engine = summarize_engine_columns(steps, gpu_spec, run.resolved.dtype)
    engine["kv_blocks_in_use_at_end"] = run.kv_blocks_in_use_at_end
    error, reason = sim_error(iterations, simulated=run.resolved.engine == "sim")
    engine["sim_error"] = error
    if reason is not None:
        engine["sim_error_reason"] = reason
    if isinstance(run, EngineRun) and run.resolved.engine == "torch":
        # Triton compilations inside the timed run (0 is the goal: each one stalls an
        # iteration); null where Triton's compilation hook is unavailable.
        engine["kernel_compilations_during_run"] = run.kernel_compilations
    return engine


def _add_http_figures(summary: dict, run) -> dict[str, Any]:
    """An endpoint run's own figures: workers, client health (into the summary), and the
    server's /metrics (returned: the result's server_histograms and server_metrics)."""
    from cbbench.targets.client_health import client_bound_summary

    info = dict(run.info)
    server_metrics = info.pop("server_metrics", None)
    server_histograms = info.pop("server_histograms", None)
    server_side: dict[str, Any] = {}
    if server_histograms is not None:  # vLLM's latency histograms, before and after
        server_side.update(server_histograms=server_histograms)
    summary.update(workers=info.pop("workers"), client_bound=client_bound_summary(info),
                   http=info)
    if server_metrics is not None:
        server_side.update(server_metrics=server_metrics)
        from cbbench.analysis.server_side.speculative_scrape import scraped_speculative

        scraped = scraped_speculative(server_metrics)
        if scraped is not None and "speculative" not in summary:
            summary.update(speculative=scraped)
    return server_side


def add_intervals(summary: dict, spec: RunSpec, sched: Schedule) -> None:
    """summary.intervals on a simulated run with a calibrated profile: the same requests
    simulated at the fast and the slow end of the profile's residual spread."""
    opts = spec.engine
    if opts.engine != "sim" or opts.gpu_profile is None:
        return
    from cbbench.analysis.summary.intervals import intervals
    from cbbench.engine.build_common import load_device_profile
    from cbbench.engine.sim.sim_bounds import SPREAD_LEVEL

    spread = load_device_profile(opts).spread
    if not spread:
        return
    bounds = []
    for end in ("low", "high"):
        factors = {cls: band[end] for cls, band in spread.items()}
        run = run_engine(opts, sched.wreqs, sched.arrivals, sessions=sched.plan,
                         cancel=sched.cancel, step_time_factors=factors)
        bounds.append(summarize(run.records, run.duration_s, spec.slo))
    summary["intervals"] = intervals(summary, bounds, SPREAD_LEVEL)


