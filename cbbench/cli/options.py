"""Pieces shared by the CLI commands: messages, exit codes, the engine options that `run`,
`serve`, `compare`, `sweep` and `capacity` all take (derived from EngineArgs, so the names
cannot drift), and the endpoint options."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import inspect
import math
import typing
from pathlib import Path
from typing import Annotated

import typer

from cbbench.engine.args import EngineArgs, EngineArgsError, flag_of
from cbbench.errors import UsageError

USAGE_EXIT = 2
ENGINE_PANEL = "Engine"


def notice(msg: str) -> None:
    typer.echo(f"cbbench: {msg}", err=True)


def guard(fn):
    """Turn a UsageError into one line on stderr and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            check_finite(kwargs)
            return fn(*args, **kwargs)
        except UsageError as e:
            typer.echo(f"cbbench: error: {e}", err=True)
            raise typer.Exit(USAGE_EXIT) from None

    return wrapper


def check_finite(values: dict) -> None:
    """No float option takes nan or an infinity (those that take inf, the request rates, are
    text): one check for every command's options, the ones added later included."""
    for name, v in values.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(f"{flag_of(name)} must be a finite number, got {v}")


def given(name: str) -> bool:
    """Whether the running command's option ``name`` was given (on the command line or the
    environment), not left at its default: a default cannot say so by its value."""
    try:  # Typer 0.2x runs commands on its own copy of Click
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context

    ctx = get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def output_file(text: str) -> Path:
    """A file output's path, as given: pathlib drops a trailing '/', so `--output newdir/`
    wrote a file named newdir. A name ending in '/' that is not a folder is refused (one that
    is gets check_writable's "is a folder")."""
    if text.endswith("/") and not Path(text).is_dir():
        raise typer.BadParameter(f"{text!r} ends in '/' but is not a folder: name a file")
    return Path(text)


def default_output_path(kind: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"run-{stamp}-{kind}.json"


def parse_rate_option(text: str) -> float:
    from cbbench.load.arrivals import parse_rate

    return parse_rate(text)


# ---- engine options, derived from EngineArgs ---------------------------------------------------
def _engine_option(f: dataclasses.Field, hint):
    """The Typer option of one EngineArgs field: --flag (or --flag/--no-flag for a switch),
    its help and its choices, in the help's "Engine" panel. Values are checked by
    EngineArgs.validate() before the command runs."""
    flag = flag_of(f.name)
    meta = f.metadata
    decls = (f"{flag}/--no-{flag[2:]}",) if hint is bool else (flag,)
    kwargs = {"help": meta.get("help"), "rich_help_panel": ENGINE_PANEL}
    if meta.get("choices"):
        kwargs["metavar"] = "|".join(meta["choices"])
    return Annotated[hint, typer.Option(*decls, **kwargs)]


def _engine_cli_fields() -> list[tuple[str, object, object]]:
    hints = typing.get_type_hints(EngineArgs)
    return [
        (f.name, _engine_option(f, hints[f.name]), f.default)
        for f in dataclasses.fields(EngineArgs)
        if f.metadata.get("cli", True)
    ]


# (name, annotation, default) of every engine option a command takes, in EngineArgs' order.
ENGINE_OPTIONS = tuple(_engine_cli_fields())


def with_engine_options(fn):
    """Give a command the engine options: Typer sees them in its signature (after the
    command's own), and the command receives them checked and bundled as ``engine_opts``
    (an EngineArgs built with the command's own ``--seed``). Derived from EngineArgs, so run,
    serve, compare, sweep and capacity cannot drift apart."""
    hints = inspect.signature(fn, eval_str=True).parameters
    own = [p for name, p in hints.items() if name != "engine_opts"]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
        for name, ann, default in ENGINE_OPTIONS
    ]

    @functools.wraps(fn)
    def wrapper(**kwargs):
        values = {name: kwargs.pop(name) for name, _, _ in ENGINE_OPTIONS}
        kwargs["engine_opts"] = engine_args(**values, seed=kwargs["seed"])
        return fn(**kwargs)

    params = own + extra
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def engine_args(**values) -> EngineArgs:
    """EngineArgs from option values, checked (UsageError naming the option)."""
    try:
        return EngineArgs(**values).validate()
    except EngineArgsError as e:
        raise UsageError(str(e)) from None


# ---- endpoint options, shared by run, sweep and capacity ------------------------------------
Endpoint = Annotated[
    str | None,
    typer.Option(help="Benchmark this OpenAI-compatible endpoint instead of the bundled engine."),
]
Api = Annotated[str, typer.Option(help="Endpoint API: completions | chat.")]
ServedModel = Annotated[
    str | None, typer.Option(help="Model name to request. Default: the first of /v1/models.")
]
IgnoreEosField = Annotated[
    bool,
    typer.Option(
        "--ignore-eos-field/--no-ignore-eos-field",
        help="Send ignore_eos (vLLM, SGLang); turn off for servers that reject unknown fields.",
    ),
]
Header = Annotated[
    list[str] | None,
    typer.Option(help="HTTP header KEY=VALUE (repeatable); VALUE $NAME or env:NAME reads the "
                 "environment. Values are never written to the results."),
]
RequestTimeout = Annotated[float, typer.Option(help="Seconds allowed per request (endpoint).")]
Tokenizer = Annotated[
    str | None,
    typer.Option(help="tokenizer.json: exact synthetic prompt lengths and token counts (endpoint)."),
]


def endpoint_options(
    endpoint, api, served_model, ignore_eos_field, header, request_timeout, tokenizer, seed,
    max_concurrency=None, scrape_metrics=False, scrape_metrics_filter=None,
):
    """EndpointOptions for --endpoint (None without it), checked before any probe runs."""
    if endpoint is None:
        if scrape_metrics or scrape_metrics_filter is not None:  # was silently ignored
            raise UsageError("--scrape-metrics reads a server's /metrics: it needs --endpoint "
                             "(the bundled engine's own figures are in every result)")
        return None
    from cbbench.targets.options import EndpointOptions, parse_header

    opts = EndpointOptions(
        endpoint=endpoint,
        api=api,
        served_model=served_model,
        ignore_eos_field=ignore_eos_field,
        headers=dict(parse_header(h) for h in header or []),
        request_timeout_s=request_timeout,
        tokenizer=tokenizer,
        seed=seed,
        max_concurrency=max_concurrency,
        # A filter says which metrics to keep: it asks for the scrape too.
        scrape_metrics=scrape_metrics or scrape_metrics_filter is not None,
        scrape_metrics_filter=scrape_metrics_filter,
    )
    opts.validate()
    return opts
