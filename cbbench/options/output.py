"""The output options: what a run measures beyond the requests (SLOs, the steady-state window,
GPU telemetry) and what it writes (the result file, its detail, the label, the exit rule)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbbench.errors import UsageError
from cbbench.options.fields import check_fields, opt


def output_file(text: str) -> Path:
    """A file output's path, as given: pathlib drops a trailing '/', so `--output newdir/`
    wrote a file named newdir. A name ending in '/' that is not a folder is refused (one that
    is gets check_writable's "is a folder")."""
    if text.endswith("/") and not Path(text).is_dir():
        raise UsageError(f"{text!r} ends in '/' but is not a folder: name a file")
    return Path(text)


@dataclass(frozen=True)
class OutputOptions:
    slo: str | None = opt(
        None,
        "Goodput SLOs in ms, e.g. ttft=500,tpot=50,e2el=10000 (one grammar with sweep and "
        "capacity: KEY=MS, KEY in ttft, tpot, e2el).",
    )
    attainment: float | None = opt(
        None, "Attainment target (default: the SLO's percentile).", low=0.0, low_open=True,
        high=1.0,
    )
    warmup: float | None = opt(
        None,
        "Steady-state window: leave out the run's first SECONDS (with --cooldown; default: "
        "detected from the running-request count).",
        low=0.0,
    )
    cooldown: float | None = opt(
        None, "Steady-state window: leave out the run's last SECONDS.", low=0.0
    )
    output: Path | None = opt(
        None,
        "Result JSON path, or - for stdout (the table then goes to stderr). Default: "
        "results/run-<time>-<engine>.json.",
        parser=output_file, metavar="<path>",
    )
    save_detailed: bool = opt(False, "Also store per-request ITL lists and output token ids.")
    max_error_rate: float = opt(
        0.0, "Exit 1 (after writing the result) when more requests fail.", low=0.0, high=1.0
    )
    gpu_index: int | None = opt(
        None, "GPU to sample with NVML (default: the engine's; for --endpoint, none)."
    )
    telemetry_interval: float = opt(
        0.05, "Seconds between GPU telemetry samples.", low=0.0, low_open=True
    )
    gpu_metrics: list[str] | None = opt(
        None,
        "A DCGM exporter's Prometheus page (http://GPU-HOST:9400/metrics; repeatable, one per "
        "GPU server), scraped every --telemetry-interval during the run: per-GPU HBM bandwidth "
        "(DCGM_FI_PROF_DRAM_ACTIVE), SM and tensor activity, memory, clocks and power as the "
        "result's telemetry (source dcgm), instead of NVML on this host.",
        metavar="URL",
    )
    label: str | None = opt(None, "A name for this run, shown by compare and report.")
    summary_only: bool = opt(
        False,
        "Write config and summary only (no per-request or per-iteration records): small files "
        "for committed baselines.",
    )
    percentiles: str | None = opt(
        None,
        "Percentiles every latency distribution holds, e.g. 50,90,99,99.9 (keys p50, p99.9). "
        "Default: 50,90,95,99.",
        metavar="LIST",
    )
    slice: str | None = opt(
        None,
        "Also summarize the run in time slices of DURATION (10s, 500ms, 1m): summary.slices, "
        "each with its requests finished, throughput, TTFT/TPOT/ITL, errors and in-flight.",
        metavar="DURATION",
    )
    output_format: str | None = opt(
        None,
        "Also write the result as br0.2 (llm-d's Benchmark Report), csv or parquet beside the "
        "JSON (cbbench export's files, named after --output).",
        choices=("br0.2", "csv", "parquet"),
    )
    server_log: Path | None = opt(
        None,
        "The server's request log (cbbench serve --request-log) on this host: each request's "
        "TTFT and E2EL split into send lag, the way in, queue, prefill (decode) and delivery "
        "(ttft_parts, summary.ttft_breakdown), with the server's --enable-per-request-metrics "
        "timings or without them.",
        metavar="<path>",
    )
    json: bool = opt(False, "Print the result JSON instead of the table.", flag="--json",
                     switch=False)
    quiet: bool = opt(
        False,
        "No live panel while the run runs (it shows only on a terminal, never in a pipe).",
        switch=False,
    )

    def validate(self) -> None:
        check_fields(self)  # the SLO text is read (and checked) by its one parser
        self.percentile_list()
        self.slice_s()
        self.check_gpu_metrics()
        if self.save_detailed and self.summary_only:  # the details went nowhere, exit 0
            raise UsageError("--save-detailed adds to each request's record and --summary-only "
                             "keeps none: give one of them")

    def check_gpu_metrics(self) -> None:
        """--gpu-metrics: http(s) URLs, and not beside --gpu-index (one telemetry source)."""
        from urllib.parse import urlsplit

        for url in self.gpu_metrics or []:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise UsageError(f"--gpu-metrics {url!r}: give an http(s) URL, e.g. "
                                 "http://gpu-host:9400/metrics")
        if self.gpu_metrics and self.gpu_index is not None:
            raise UsageError("--gpu-metrics reads the GPUs from a DCGM exporter; --gpu-index "
                             "samples one on this host with NVML: give one of them")

    def slice_s(self) -> float | None:
        """--slice in seconds (None: no slices)."""
        if self.slice is None:  # the default: nothing to check, nothing to import
            return None
        from cbbench.analysis.summary.slices import MIN_SLICE_S
        from cbbench.load.arrivals import parse_duration

        value = parse_duration(self.slice, "--slice")
        if value < MIN_SLICE_S:
            raise UsageError(f"--slice {self.slice} is shorter than {MIN_SLICE_S * 1e3:g} ms: "
                             "give a longer slice")
        return value

    def percentile_list(self) -> tuple[float, ...]:
        """--percentiles as numbers (the default set when not given)."""
        from cbbench.analysis.summary.percentiles import parse_percentiles

        return parse_percentiles(self.percentiles)

    def percentiles_given(self) -> tuple[float, ...] | None:
        """--percentiles as numbers, or None when not given (a reader keeps its own columns)."""
        return None if self.percentiles is None else self.percentile_list()

    def goodput_slo(self) -> dict[str, float]:
        """--slo as run's goodput limits."""
        from cbbench.analysis.summary.metrics import parse_slo

        return parse_slo(self.slo)

    def attainment_slo(self):
        """--slo and --attainment as a sweep's or capacity search's AttainmentSLO."""
        from cbbench.analysis.summary.slo import parse_attainment_slo

        return parse_attainment_slo(self.slo, self.attainment)


@dataclass(frozen=True)
class WindowOptions:
    """Which window of a result `gate` and `compare` read (cbbench/analysis/comparison/windows.py)."""

    window: str = opt(
        "all",
        "all: the whole run's figures; steady: the steady-state window's "
        "(summary.steady_state: ramp-up and drain left out).",
    )

    def validate(self) -> None:
        from cbbench.analysis.comparison.windows import check_window

        check_window(self.window)


RUN_OUTPUT: dict[str, Any] = dict(only=(
    "slo", "warmup", "cooldown", "output", "save_detailed", "max_error_rate", "gpu_index",
    "telemetry_interval", "gpu_metrics", "label", "summary_only", "percentiles", "slice", "output_format", "server_log", "json", "quiet",
))
# The one flag compare, gate and report take from this group.
READ_OUTPUT: dict[str, Any] = dict(only=("percentiles",))
