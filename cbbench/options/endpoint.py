"""The endpoint options: where HTTP requests go and how (URL, API, headers, model, tokenizer,
timeouts, concurrency, ignore-eos, /metrics scraping, client workers). Declared once; `run`,
`sweep` and `capacity` take them and build the target's EndpointOptions and LoadPlan."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbbench.engine.args import flag_of
from cbbench.errors import UsageError
from cbbench.options.fields import check_fields, opt


@dataclass(frozen=True)
class EndpointFlags:
    endpoint: str | None = opt(
        None,
        "Benchmark this OpenAI-compatible endpoint instead of the bundled engine; several "
        "comma-separated URLs (replicas without a gateway) share the load by --balance.",
    )
    api: str = opt(
        "completions",
        "Endpoint API: completions | chat | responses (OpenAI's Responses) | anthropic "
        "(Anthropic's Messages), streamed; embeddings | rerank (one JSON answer per request: "
        "latency, requests/s, input tokens/s). docs/endpoints.md.",
    )
    batch_size: int | None = opt(
        None,
        "--api embeddings: inputs per request; rerank: documents per query (default 1).",
    )
    served_model: str | None = opt(
        None, "Model name to request. Default: the server's only (base) model in /v1/models."
    )
    ignore_eos_field: bool = opt(
        True,
        "Send ignore_eos (vLLM, SGLang); turn off for servers that reject unknown fields.",
    )
    header: list[str] | None = opt(
        None,
        "HTTP header KEY=VALUE (repeatable); VALUE $NAME or env:NAME reads the environment. "
        "Values are never written to the results.",
    )
    request_timeout: float = opt(600.0, "Seconds allowed per request (endpoint).")
    max_concurrency: int | None = opt(
        None,
        "Cap on requests in flight (closed loop): TTFT/E2EL are reported from the intended "
        "start and from the send, the slot wait on its own.",
    )
    tokenizer: str | None = opt(
        None,
        "tokenizer.json, or a Hugging Face model folder holding it (and tokenizer_config.json):"
        " exact synthetic prompt lengths and token counts (endpoint). Without it, prompts are "
        "sized with the server's /tokenize where it has one.",
    )
    scrape_metrics: bool = opt(
        False,
        "Sample the endpoint's Prometheus /metrics during the run (vLLM, SGLang, TGI, llama.cpp "
        "and cbbench names); with vLLM's histograms, the server's own TTFT/TPOT beside the "
        "client's.",
    )
    scrape_metrics_filter: str | None = opt(
        None,
        "Keep the /metrics names this regex finds (re.search) instead of the known servers' "
        "(vllm:, sglang:, tgi_, llamacpp:, cbbench_); implies --scrape-metrics.",
        metavar="REGEX",
    )
    workers: str = opt(
        "1",
        "Client processes that send the schedule (endpoint runs): N, or auto (as many as the "
        "schedule needs by a calibration of this client's CPU per request, at most the usable "
        "cores: one at 350 req/s or less and for a burst; with --ray, one per cluster CPU but one).",
    )
    ray: bool = opt(
        False,
        "Run the workers as Ray actors (pip install 'cbbench[ray]'); a local Ray instance "
        "unless --ray-address is given.",
        switch=False,
    )
    ray_address: str | None = opt(None, "Join this running Ray cluster (with --ray).")
    balance: str = opt(
        "round-robin",
        "How requests spread over several --endpoint URLs: round-robin | least-in-flight "
        "(this client's requests in flight at each).",
        choices=("round-robin", "least-in-flight"),
    )
    lora_modules: str | None = opt(
        None,
        "NAME=SHARE,...: send that share of requests to each LoRA adapter name (the model "
        "field; drawn per request from the seed), the rest to the served model; the summary "
        "splits by model.",
        metavar="NAME=SHARE,...",
    )

    def validate(self) -> None:
        check_fields(self)
        if self.endpoint is None:  # a value other than the default was given
            self.refuse_without_endpoint(f.name for f in dataclasses.fields(self)
                                         if getattr(self, f.name) != f.default)

    def validate_given(self, given: Collection[str]) -> None:
        """Group.build's check of the flags given on the command line, at their defaults too
        (`--api completions`): without --endpoint each would do nothing."""
        if self.endpoint is None:
            self.refuse_without_endpoint(given)

    def refuse_without_endpoint(self, names: Iterable[str]) -> None:
        """A UsageError naming the first of these endpoint-only flags, as it was given
        (--no-ignore-eos-field)."""
        names = set(names)
        for name, why in ENDPOINT_ONLY.items():
            if name in names:
                flag = flag_of(name)
                if getattr(self, name) is False:
                    flag = "--no-" + flag[2:]
                raise UsageError(f"{flag} needs --endpoint ({why})")

    def target(self, seed: int):
        """The HTTP target's EndpointOptions (None without --endpoint), checked before any
        probe runs."""
        if self.endpoint is None:
            return None
        from cbbench.targets.balance import parse_lora_modules
        from cbbench.targets.options import EndpointOptions, parse_header

        opts = EndpointOptions(
            endpoint=self.endpoint,
            api=self.api,
            served_model=self.served_model,
            ignore_eos_field=self.ignore_eos_field,
            headers=dict(parse_header(h) for h in self.header or []),
            request_timeout_s=self.request_timeout,
            tokenizer=self.tokenizer_path(),
            seed=seed,
            balance=self.balance,
            lora_modules=parse_lora_modules(self.lora_modules),
            max_concurrency=self.max_concurrency,
            # A filter says which metrics to keep: it asks for the scrape too.
            scrape_metrics=self.scrape_metrics or self.scrape_metrics_filter is not None,
            scrape_metrics_filter=self.scrape_metrics_filter,
            batch_size=self.batch_size,
        )
        opts.validate()
        return opts

    def tokenizer_path(self) -> str | None:
        """--tokenizer's tokenizer.json, which must exist: a missing path was found only when
        the first point loaded it, a sweep's point already started."""
        if self.tokenizer is None:
            return None
        from cbbench.load.prompts import tokenizer_file

        path = tokenizer_file(self.tokenizer)
        if not Path(path).exists():
            raise UsageError(f"--tokenizer {path}: no such file or folder")
        if not Path(path).is_file():  # a device or FIFO: load_tokenizer's refusal, sooner
            raise UsageError(f"--tokenizer {path}: not a tokenizer.json file")
        return path

    def load_plan(self):
        """--workers and --ray, checked: they apply to endpoint runs only."""
        from cbbench.distributed.plan import LoadPlan, parse_workers

        load = LoadPlan(parse_workers(self.workers), self.ray, self.ray_address).validate()
        if self.endpoint is None and load.distributed:
            raise UsageError("--workers and --ray apply to --endpoint runs")
        return load


# Why each flag needs --endpoint, said when it is given without one (where it did nothing).
# --workers, --ray and --ray-address are the load plan's (load_plan): --workers 1 runs here too.
ENDPOINT_ONLY: dict[str, str] = {
    "api": "it picks the API of an endpoint's requests",
    "batch_size": "it sets the inputs per request of --api embeddings or rerank",
    "served_model": "it names the model an endpoint serves",
    "ignore_eos_field": "it says whether an endpoint's requests carry ignore_eos; the bundled "
    "engine takes --ignore-eos",
    "header": "it adds HTTP headers to an endpoint's requests",
    "request_timeout": "it bounds each HTTP request",
    "max_concurrency": "it caps the HTTP requests in flight",
    "tokenizer": "it sizes the prompts and counts the tokens of an endpoint's model",
    "scrape_metrics": "it reads a server's /metrics; the bundled engine's own figures are in "
    "every result",
    "scrape_metrics_filter": "it picks the /metrics names --scrape-metrics keeps",
    "balance": "it spreads requests over several --endpoint URLs",
    "lora_modules": "it names a server's adapters",
}


# sweep and capacity: open loop only (no --max-concurrency, which would cap the very load a
# rate sweep offers) and no scraping; their probes share one Ray instance.
PROBE_ENDPOINT: dict[str, Any] = dict(
    only=("endpoint", "api", "served_model", "ignore_eos_field", "header", "request_timeout",
          "tokenizer", "workers", "ray", "ray_address", "batch_size", "balance", "lora_modules"),
    help={
        "workers": "Client processes that send each probe's schedule (--endpoint runs): N, or "
        "auto (as many as the probe's schedule needs by a calibration of this client's CPU "
        "per request), as in `cbbench run`.",
        "ray": "Run each probe's workers as Ray actors (pip install 'cbbench[ray]'): one Ray "
        "instance for every probe, local unless --ray-address is given.",
    },
)
