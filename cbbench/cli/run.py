"""`cbbench run`: one benchmark run against the bundled engine (or, later, an endpoint)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from cbbench.cli import options as C
from cbbench.errors import UsageError
from cbbench.load.interrupts import StopSignal

SYNTHETIC_PANEL = "Synthetic workload"
# A load-generator worker died or crashed mid-run: the result is written, but it is short of
# that worker's unreported requests (1 is --max-error-rate's, 2 bad input, 130 interrupted).
WORKER_LOST_EXIT = 3
# What a replay takes from the recorded run (so the same options on the command line would
# be silently ignored).
REPLAY_TAKES = ("workload", "seed", "burstiness", "arrival", "time_scale")


def register(app: typer.Typer) -> None:
    app.command("run")(run)


@C.guard
@C.with_engine_options
def run(
    workload: Annotated[
        str,
        typer.Option(
            help="Built-in workload (sharegpt, sharegpt-multiturn, long-prompt, shared-prefix), "
            "random (see "
            "--input-len), a JSONL file, or a trace file (Azure LLM inference CSV, BurstGPT CSV, Mooncake JSONL; recognized by "
            "its header)."
        ),
    ] = "sharegpt",
    num_requests: Annotated[
        int | None,
        typer.Option(help="Requests drawn from the workload with --seed (vLLM's default: 1000); "
                     "sessions, for a multi-turn workload."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for request sampling, arrivals and sampling.")] = 0,
    request_rate: Annotated[
        str, typer.Option(help="Requests per second, or inf to send all at t=0.")
    ] = "inf",
    burstiness: Annotated[
        float, typer.Option(help="Gamma shape of inter-arrival times: 1 = Poisson, <1 burstier.")
    ] = 1.0,
    arrival: Annotated[
        str,
        typer.Option(
            help="auto | gamma | constant | trace. auto: the trace's arrival_s when it has them "
            "and no --request-rate is given, else gamma."
        ),
    ] = "auto",
    duration: Annotated[
        str | None,
        typer.Option(help="Run for this long (60s, 5m, 1h): requests are drawn from the "
                     "workload until the arrival schedule reaches it (instead of --num-requests)."),
    ] = None,
    ramp: Annotated[
        str | None,
        typer.Option(help="START:END:SECONDS: a linear request-rate ramp (req/s) instead of "
                     "--request-rate, held at END after SECONDS; lasts SECONDS unless "
                     "--duration or --num-requests says otherwise."),
    ] = None,
    input_len: Annotated[
        int | None,
        typer.Option(help="--workload random: input tokens per request (default 1024).",
                     rich_help_panel=SYNTHETIC_PANEL),
    ] = None,
    output_len: Annotated[
        int | None,
        typer.Option(help="--workload random: output tokens per request (default 128).",
                     rich_help_panel=SYNTHETIC_PANEL),
    ] = None,
    length_range: Annotated[
        float | None,
        typer.Option(help="--workload random: lengths uniform in [len*(1-R), len*(1+R)], "
                     "0 <= R < 1 (default 0: exact).", rich_help_panel=SYNTHETIC_PANEL),
    ] = None,
    prefix_len: Annotated[
        int | None,
        typer.Option(help="--workload random: the same N tokens in front of every prompt "
                     "(default 0).", rich_help_panel=SYNTHETIC_PANEL),
    ] = None,
    think_time: Annotated[
        str | None,
        typer.Option(help="Multi-turn sessions: the wait (ms) after a reply before the next "
                     "turn: N, exp:MEAN or uniform:LOW:HIGH. Default exp:1000 (ShareGPT has no "
                     "timing); a turn's own think_time_ms wins."),
    ] = None,
    cancel_rate: Annotated[
        float | None,
        typer.Option(help="Cancel this share of requests mid-stream (0-1): the client closes "
                     "the stream, the engine aborts. Needs --cancel-after."),
    ] = None,
    cancel_after: Annotated[
        str | None,
        typer.Option(help="When a picked request is cancelled, in ms after its send: N, "
                     "exp:MEAN or uniform:LOW:HIGH (it completes normally if it finishes first)."),
    ] = None,
    warmup: Annotated[
        float | None,
        typer.Option(help="Steady-state window: leave out the run's first SECONDS (with "
                     "--cooldown; default: detected from the running-request count)."),
    ] = None,
    cooldown: Annotated[
        float | None,
        typer.Option(help="Steady-state window: leave out the run's last SECONDS."),
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(help="With --arrival trace: multiply the trace's timestamps (0.5 replays "
                     "twice as fast)."),
    ] = 1.0,
    slo: Annotated[
        str | None,
        typer.Option(help="Goodput SLOs in ms, e.g. ttft=500,tpot=50,e2el=10000."),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option(help="Re-run a result's exact requests and arrival times, with its "
                     "scheduling options (e.g. --engine sim --gpu-profile P.json: the "
                     "simulator's error on that run; compare the two files)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Result JSON path, or - for stdout (the table then goes to stderr). "
                     "Default: results/run-<time>-<engine>.json.", parser=C.output_file,
                     metavar="<path>"),
    ] = None,
    save_detailed: Annotated[
        bool, typer.Option(help="Also store per-request ITL lists and output token ids.")
    ] = False,
    endpoint: C.Endpoint = None,
    api: C.Api = "completions",
    served_model: C.ServedModel = None,
    ignore_eos_field: C.IgnoreEosField = True,
    header: C.Header = None,
    request_timeout: C.RequestTimeout = 600.0,
    max_concurrency: Annotated[
        int | None, typer.Option(help="Cap on requests in flight (closed loop): TTFT/E2EL are reported "
                     "from the intended start and from the send, the slot wait on its own.")
    ] = None,
    tokenizer: C.Tokenizer = None,
    scrape_metrics: Annotated[
        bool,
        typer.Option(help="Sample the endpoint's Prometheus /metrics during the run (vLLM, "
                     "SGLang, TGI, llama.cpp and cbbench names); with vLLM's histograms, the "
                     "server's own TTFT/TPOT beside the client's."),
    ] = False,
    workers: Annotated[
        str,
        typer.Option(help="Client processes that send the schedule (endpoint runs): N, or auto "
                     "(one per spare core; with --ray, one per cluster CPU but one)."),
    ] = "1",
    ray: Annotated[
        bool,
        typer.Option("--ray", help="Run the workers as Ray actors (pip install 'cbbench[ray]'); "
                     "a local Ray instance unless --ray-address is given."),
    ] = False,
    ray_address: Annotated[
        str | None, typer.Option(help="Join this running Ray cluster (with --ray).")
    ] = None,
    scrape_metrics_filter: Annotated[
        str | None,
        typer.Option(
            metavar="REGEX",
            help="Keep the /metrics names this regex finds (re.search) instead of the known "
            "servers' (vllm:, sglang:, tgi_, llamacpp:, cbbench_); implies --scrape-metrics.",
        ),
    ] = None,
    max_error_rate: Annotated[
        float, typer.Option(help="Exit 1 (after writing the result) when more requests fail.")
    ] = 0.0,
    gpu_index: Annotated[
        int | None,
        typer.Option(help="GPU to sample with NVML (default: the engine's; for --endpoint, none)."),
    ] = None,
    telemetry_interval: Annotated[
        float, typer.Option(help="Seconds between GPU telemetry samples.")
    ] = 0.05,
    label: Annotated[
        str | None, typer.Option(help="A name for this run, shown by compare and report.")
    ] = None,
    summary_only: Annotated[
        bool,
        typer.Option(help="Write config and summary only (no per-request or per-iteration "
        "records): small files for committed baselines."),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the result JSON instead of the table.")
    ] = False,
    *,
    engine_opts: C.EngineArgs,
) -> None:
    """Run a workload against the bundled engine or an endpoint (--endpoint).

    Prints TTFT, TPOT, ITL and end-to-end latency distributions, throughput and goodput, next to
    the engine's per-iteration story (token budget use, batch occupancy, KV use, preemptions,
    bandwidth), and writes the result JSON.
    """
    from cbbench.analysis.metrics import parse_slo
    from cbbench.analysis.result import (
        check_not_an_input,
        check_writable,
        dumps,
        engine_inputs,
        is_stdout,
        write_result,
    )
    from cbbench.analysis.table import render_summary
    from cbbench.bench.runner import RunSpec, execute_run
    from cbbench.load.arrivals import parse_duration, parse_ramp

    rate = C.parse_rate_option(request_rate)
    if duration is not None and num_requests is not None:
        raise UsageError("--duration and --num-requests both set the run's length: give one")
    if ramp is not None and request_rate != "inf":
        raise UsageError("--ramp sets the request rate: drop --request-rate")
    if replay is not None and (num_requests is not None or duration is not None
                               or ramp is not None or request_rate != "inf"):
        raise UsageError("--replay takes the recorded run's requests and arrivals: drop "
                         "--num-requests, --duration, --ramp and --request-rate")
    if replay is not None:  # these were silently ignored: the recorded run's values stand
        ignored = [C.flag_of(n) for n in REPLAY_TAKES if C.given(n)]
        if ignored:
            raise UsageError(f"--replay takes the recorded run's workload, seed and arrivals: "
                             f"drop {', '.join(ignored)}")
    duration_s = parse_duration(duration) if duration is not None else None
    ramp_spec = parse_ramp(ramp) if ramp is not None else None
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise UsageError(f"--burstiness must be a positive number, got {burstiness}")
    opts = engine_opts
    endpoint_opts = C.endpoint_options(
        endpoint, api, served_model, ignore_eos_field, header, request_timeout, tokenizer, seed,
        max_concurrency=max_concurrency, scrape_metrics=scrape_metrics,
        scrape_metrics_filter=scrape_metrics_filter,
    )
    if endpoint is None and max_concurrency is not None:
        raise UsageError("--max-concurrency applies to --endpoint runs")
    from cbbench.distributed.plan import LoadPlan, parse_workers

    load = LoadPlan(parse_workers(workers), ray, ray_address).validate()
    if endpoint is None and load.distributed:
        raise UsageError("--workers and --ray apply to --endpoint runs")
    if not 0 <= max_error_rate <= 1:
        raise UsageError("--max-error-rate must be between 0 and 1")
    if not telemetry_interval > 0:
        raise UsageError("--telemetry-interval must be > 0")
    spec = RunSpec(
        workload=workload,
        num_requests=num_requests,
        seed=seed,
        request_rate=rate,
        rate_given=request_rate != "inf",
        burstiness=burstiness,
        arrival=arrival,
        time_scale=time_scale,
        think_time=think_time,
        cancel_rate=cancel_rate,
        cancel_after=cancel_after,
        warmup_s=_seconds(warmup, "--warmup"),
        cooldown_s=_seconds(cooldown, "--cooldown"),
        random=random_spec(workload, input_len, output_len, length_range, prefix_len),
        slo=parse_slo(slo),
        save_detailed=save_detailed,
        label=label,
        engine=opts,
        endpoint=endpoint_opts,
        gpu_index=gpu_index,
        telemetry_interval_s=telemetry_interval,
        duration_s=duration_s,
        ramp=ramp_spec,
        load=load,
        replay=str(replay) if replay is not None else None,
    )
    kind = "http" if endpoint else (opts.engine if opts.engine != "auto" else "engine")
    out_path = output or C.default_output_path(kind)
    check_writable(out_path)
    check_not_an_input(out_path, [workload, tokenizer, replay, *engine_inputs(opts)], "--output")

    with StopSignal() as stop, _progress() as on_progress:
        result = execute_run(spec, C.notice, should_stop=stop, on_progress=on_progress)
    if summary_only:
        result = {k: v for k, v in result.items() if k not in ("requests", "iterations")}
        result["telemetry"] = {k: v for k, v in result["telemetry"].items() if k != "samples"}
    # The measurements first: a result that cannot be written (a full disk) is still seen.
    # With --output - the JSON is stdout, so the table goes to stderr.
    to_stdout = is_stdout(out_path)
    if json_out and not to_stdout:
        typer.echo(dumps(result))
    elif not json_out:
        typer.echo(render_summary(result), err=to_stdout)
    write_result(out_path, result)
    if not json_out and not to_stdout:
        typer.echo(f"\nresult: {out_path}")
    s = result["summary"]
    gone = [w for w in s.get("workers") or [] if w["status"] in ("died", "failed")]
    if gone:
        C.notice(
            f"{len(gone)} load-generator worker(s) did not finish (worker "
            f"{', '.join(str(w['worker']) for w in gone)}): the result covers what they reported"
        )
        raise typer.Exit(WORKER_LOST_EXIT)
    sent = s["completed"] + s["failed"]
    if sent and s["failed"] / sent > max_error_rate:
        C.notice(
            f"{s['failed']} of {sent} requests failed ({s['failed'] / sent:.1%}), above "
            f"--max-error-rate {max_error_rate:.1%}"
        )
        raise typer.Exit(1)


def _seconds(value: float | None, flag: str) -> float | None:
    if value is not None and not (value >= 0 and math.isfinite(value)):
        raise UsageError(f"{flag} must be a number of seconds >= 0, got {value}")
    return value


def random_spec(workload, input_len, output_len, length_range, prefix_len):
    """The --workload random parameters (vLLM's defaults where not given); an error when they
    are given for another workload, where they would silently do nothing."""
    from cbbench.load.synthetic import RANDOM_WORKLOAD, RandomSpec

    given = {
        "input_len": input_len, "output_len": output_len, "length_range": length_range,
        "prefix_len": prefix_len,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if given and workload != RANDOM_WORKLOAD:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        verb = "applies" if len(given) == 1 else "apply"
        raise UsageError(f"{flags} {verb} only to --workload random")
    return RandomSpec(**given).validate()


class _progress:
    """A progress bar on stderr, shown only on a terminal and only once a run lasts a moment."""

    DELAY_S = 0.5

    def __enter__(self):
        import time

        self._bar = None
        self._t0 = time.perf_counter()
        self._tty = sys.stderr.isatty()
        return self.update

    def update(self, done: int, total: int) -> None:
        if not self._tty:
            return
        import time

        if self._bar is None:
            if time.perf_counter() - self._t0 < self.DELAY_S:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress(
                "requests", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("run", total=total)
        self._bar.update(self._task, completed=done)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
