"""The load options: what to send and when (workload, counts, rates, arrivals, duration, ramp,
sessions, cancellation, synthetic lengths, seed, replay), and the per-probe sizing of sweep and
capacity. Declared once; `run`, `compare --variants`, `sweep` and `capacity` take them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbbench.errors import UsageError
from cbbench.load.builtin_names import listed
from cbbench.options.fields import check_fields, opt

SYNTHETIC_PANEL = "Synthetic workload"
PROBE_ARRIVALS = ("gamma", "constant")  # a sweep's probes set their own rates
RATE_INF = "inf"


@dataclass(frozen=True)
class LoadOptions:
    workload: str = opt(
        "sharegpt",
        f"Built-in workload ({listed()}; see `cbbench workloads list`), random "
        "(see --input-len), random-mm (random with images: --images-per-request), a JSONL file, "
        "or a trace file (Azure LLM inference CSV, BurstGPT "
        "CSV, Mooncake JSONL; recognized by its header).",
    )
    num_requests: int | None = opt(
        None,
        "Requests drawn from the workload with --seed (vLLM's default: 1000); sessions, for a "
        "multi-turn workload.",
        low=1,
    )
    seed: int = opt(0, "Seed for request sampling, arrivals and sampling.")
    request_rate: str = opt(RATE_INF, "Requests per second, or inf to send all at t=0.")
    burstiness: float = opt(
        1.0, "Gamma shape of inter-arrival times: 1 = Poisson, <1 burstier.",
        low=0.0, low_open=True,
    )
    arrival: str = opt(
        "auto",
        "auto | gamma | constant | trace. auto: the trace's arrival_s when it has them and no "
        "--request-rate is given, else gamma.",
    )
    duration: str | None = opt(
        None,
        "Run for this long (60s, 5m, 1h): requests are drawn from the workload until the "
        "arrival schedule reaches it (instead of --num-requests).",
    )
    ramp: str | None = opt(
        None,
        "START:END:SECONDS: a linear request-rate ramp (req/s) instead of --request-rate, held "
        "at END after SECONDS; lasts SECONDS unless --duration or --num-requests says otherwise.",
    )
    input_len: int | None = opt(
        None, "--workload random: input tokens per request (default 1024).", panel=SYNTHETIC_PANEL
    )
    output_len: int | None = opt(
        None, "--workload random: output tokens per request (default 128).", panel=SYNTHETIC_PANEL
    )
    length_range: float | None = opt(
        None,
        "--workload random: lengths uniform in [len*(1-R), len*(1+R)], 0 <= R < 1 (default 0: "
        "exact).",
        panel=SYNTHETIC_PANEL,
    )
    prefix_len: int | None = opt(
        None, "--workload random: the same N tokens in front of every prompt (default 0).",
        panel=SYNTHETIC_PANEL,
    )
    images_per_request: int | None = opt(
        None, "--workload random-mm: images per request (default 1).", panel=SYNTHETIC_PANEL
    )
    image_size: str | None = opt(
        None,
        "--workload random-mm: image size WxH, or a comma list to draw from uniformly "
        "(512x512,1024x1024); default 512x512.",
        panel=SYNTHETIC_PANEL,
    )
    image_format: str | None = opt(
        None, "--workload random-mm: jpeg (default) | png.", panel=SYNTHETIC_PANEL,
    )
    think_time: str | None = opt(
        None,
        "Multi-turn sessions: the wait (ms) after a reply before the next turn: N, exp:MEAN or "
        "uniform:LOW:HIGH. Default exp:1000 (ShareGPT has no timing); a turn's own "
        "think_time_ms wins.",
    )
    tool_time_scale: float = opt(
        1.0,
        "Agent sessions: multiply every tool turn's tool_time_ms (0.01: tools a hundred times "
        "faster; 0: each tool turn at once).",
    )
    cancel_rate: float | None = opt(
        None,
        "Cancel this share of requests mid-stream (0-1): the client closes the stream, the "
        "engine aborts. Needs --cancel-after.",
    )
    cancel_after: str | None = opt(
        None,
        "When a picked request is cancelled, in ms after its send: N, exp:MEAN or "
        "uniform:LOW:HIGH (it completes normally if it finishes first).",
    )
    time_scale: float = opt(
        1.0,
        "With --arrival trace: multiply the trace's timestamps (0.5 replays twice as fast).",
    )
    replay: Path | None = opt(
        None,
        "Re-run a result's exact requests and arrival times, with its scheduling options (e.g. "
        "--engine sim --gpu-profile P.json: the simulator's error on that run; compare the two "
        "files).",
    )
    request_rate_flag: bool = opt(
        False, "Whether --request-rate was on the command line (set by the command).",
        cli=False, given_of="request_rate",
    )

    @property
    def rate_given(self) -> bool:
        """Whether a rate was asked for: --request-rate on the command line in any spelling
        parse_rate takes (an explicit inf, INF or Infinity is given: only "inf" read as the
        default before, so `--request-rate inf` replayed a trace's times where INF sent all at
        t=0), or, where code builds the options, a rate other than the default's text."""
        return self.request_rate_flag or self.request_rate != RATE_INF

    def validate(self) -> None:
        check_fields(self)
        if self.duration is not None and self.num_requests is not None:
            raise UsageError("--duration and --num-requests both set the run's length: give one")
        if self.ramp is not None and self.rate_given:
            raise UsageError("--ramp sets the request rate: drop --request-rate")
        if self.arrival == "trace" and self.rate_given:  # recorded in the config, never used
            raise UsageError("--arrival trace replays the trace's own arrival_s: drop "
                             "--request-rate (--time-scale replays it faster or slower)")
        if self.replay is not None and (self.num_requests is not None or self.duration is not None
                                        or self.ramp is not None or self.rate_given):
            raise UsageError("--replay takes the recorded run's requests and arrivals: drop "
                             "--num-requests, --duration, --ramp and --request-rate")

    # Parsed forms, each read where the text is (UsageError naming the flag).
    def rate(self) -> float:
        from cbbench.load.arrivals import parse_rate

        return parse_rate(self.request_rate)

    def duration_s(self) -> float | None:
        from cbbench.load.arrivals import parse_duration

        return parse_duration(self.duration) if self.duration is not None else None

    def ramp_spec(self):
        from cbbench.load.arrivals import parse_ramp

        return parse_ramp(self.ramp) if self.ramp is not None else None

    def random_spec(self):
        """The --workload random parameters (vLLM's defaults where not given); an error when
        they are given for another workload, where they would silently do nothing."""
        from cbbench.load.images import RANDOM_MM_WORKLOAD
        from cbbench.load.synthetic import RANDOM_WORKLOAD, RandomSpec

        given = {
            "input_len": self.input_len, "output_len": self.output_len,
            "length_range": self.length_range, "prefix_len": self.prefix_len,
        }
        given = {k: v for k, v in given.items() if v is not None}
        if given and self.workload not in (RANDOM_WORKLOAD, RANDOM_MM_WORKLOAD):
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            verb = "applies" if len(given) == 1 else "apply"
            raise UsageError(f"{flags} {verb} only to --workload random")
        return RandomSpec(**given).validate()

    def image_spec(self):
        """--workload random-mm's images (None for another workload, where the image flags
        are an error: they would do nothing)."""
        from cbbench.load.images import (
            DEFAULT_IMAGE_FORMAT,
            DEFAULT_IMAGE_SIZE,
            DEFAULT_IMAGES_PER_REQUEST,
            RANDOM_MM_WORKLOAD,
            ImageSpec,
            parse_image_sizes,
        )

        given = [f for f, v in (("--images-per-request", self.images_per_request),
                                ("--image-size", self.image_size),
                                ("--image-format", self.image_format)) if v is not None]
        if self.workload != RANDOM_MM_WORKLOAD:
            if given:
                raise UsageError(f"{', '.join(given)} apply only to --workload random-mm")
            return None
        return ImageSpec(
            self.images_per_request or DEFAULT_IMAGES_PER_REQUEST,
            parse_image_sizes(self.image_size or DEFAULT_IMAGE_SIZE),
            self.image_format or DEFAULT_IMAGE_FORMAT,
        ).validate()


@dataclass(frozen=True)
class ProbeOptions:
    """How big each probe of a sweep or a capacity search is (bench/probe.py's ProbeSizing)."""

    min_duration: float = opt(
        60.0,
        "Seconds of arrivals each probe should span: it sends max(--num-requests, rate x this) "
        "requests, so queues can settle into a steady state.",
    )
    max_requests: int = opt(10_000, "The most requests one probe sends.")
    reuse_prompts: bool = opt(
        False,
        "Send every point the same requests (one draw, one prompt text). Default: each point "
        "draws fresh prompts with its own seed, so no point meets another's in a server's "
        "prefix cache.", switch=False,
    )
    reset_prefix_cache: bool = opt(
        False,
        "Before each point, POST /reset_prefix_cache on the --endpoint (vLLM's route, with "
        "VLLM_SERVER_DEV_MODE=1; cbbench serve has it): every point starts with an empty "
        "prefix cache. The result records each call's answer.", switch=False,
    )

    skip_warmup: bool = opt(
        False,
        "No warm-up before each point. Default (--endpoint): each point first sends as many "
        "requests as it expects in flight (its rate x the last point's median E2EL), all at "
        "once, with prompts of their own, results discarded.", switch=False,
    )

    def validate(self) -> None:
        check_fields(self)


# How sweep and capacity take the load group: a probe's size and an open-loop process.
# --workload's help where the command takes no synthetic-length or image flag (sweep, capacity,
# compare): random runs at its default lengths, and no image workload runs in-process.
FIXED_LENGTHS_WORKLOAD_HELP = (
    f"Built-in workload ({listed()}; see `cbbench workloads list`), random (1024 input and 128 "
    "output tokens a request), a JSONL file, or a trace file (Azure LLM inference CSV, BurstGPT "
    "CSV, Mooncake JSONL; recognized by its header).")
PROBE_LOAD: dict[str, Any] = dict(
    only=("workload", "num_requests", "seed", "burstiness", "arrival"),
    defaults={"num_requests": 1000, "arrival": "gamma"},
    help={
        "workload": FIXED_LENGTHS_WORKLOAD_HELP,
        "num_requests": "Requests per probe at the least (more at high rates: see "
        "--min-duration), and the size of a rate-inf probe.",
        "seed": "Seed for requests, arrivals and sampling (all probes).",
        "arrival": "gamma (with --burstiness) | constant.",
    },
)
