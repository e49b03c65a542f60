"""`cbbench serve`: the bundled engine behind an OpenAI-compatible HTTP server.

With ``--engine sim`` the simulated GPU runs in real time (a wall clock: each iteration sleeps
its predicted duration), so real clients see H200-like timing without a GPU.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
from pathlib import Path

import typer

from cbbench import options as O
from cbbench.cli import options as C
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError

# Seconds uvicorn lets open streams run on after Ctrl-C before it cancels them (which aborts
# their requests in the engine).
GRACEFUL_SHUTDOWN_S = 5
READY_POLL_S = 0.05
# Room for load tests with a thousand connections arriving at once.
LISTEN_BACKLOG = 4096


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def build_serving_engine(opts):
    """``build_engine``, with a simulated engine moved from its virtual clock onto a paced wall
    clock: each iteration takes its predicted time, for real."""
    from cbbench.server.paced_clock import PacedWallClock
    from cbbench.targets.engine import build_engine

    engine, resolved = build_engine(opts)
    info = resolved.to_dict()
    # /metrics exports vLLM's spec_decode counters when speculation is on (as vLLM registers them).
    info["speculative_tokens"] = opts.speculative_tokens
    if not engine.clock.realtime:
        engine.clock = PacedWallClock()
        info["clock"] = "wall"
    return engine, info


@O.with_options(O.Group(O.ServeOptions, "options"), O.engine_group())
def serve(*, options: O.ServeOptions, engine_opts: EngineArgs) -> None:
    """Serve the bundled engine over an OpenAI-compatible API.

    /v1/completions, /v1/chat/completions, /v1/responses (OpenAI's Responses) and /v1/messages
    (Anthropic's Messages), streaming or not; GET /v1/responses/{id},
    /v1/messages/count_tokens, /v1/models, vLLM's /tokenize and
    /detokenize, /health and /metrics (vLLM's metric names).

    --temperature, --top-p, --top-k and --ignore-eos are the defaults for requests that leave
    those fields out; --ignore-eos is on, so outputs run to max_tokens, as a benchmark
    expects (default, as vLLM's: 16 on completions; on chat and the Responses API, the context
    the prompt leaves).
    """
    from cbbench.engine.core.request import SamplingParams
    from cbbench.load.chat_template import load_chat_template
    from cbbench.load.prompts import load_tokenizer
    from cbbench.server.app import ServeConfig, create_app
    from cbbench.server.auth import is_loopback, resolve_api_key
    from cbbench.targets.engine import resolve_engine

    host, port, tokenizer = options.host, options.port, options.tokenizer
    request_log, max_connections = options.request_log, options.max_connections
    opts = engine_opts
    # Resolve "auto" here, once: its notice prints now, and build_engine does not repeat it.
    opts = dataclasses.replace(opts, engine=resolve_engine(opts))
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    # The chat template beside the tokenizer.json (a model folder's tokenizer_config.json):
    # chats are rendered with it, as vLLM renders them for the same model.
    template = load_chat_template(tokenizer) if tokenizer is not None else None
    config = ServeConfig(
        served_model_name=options.served_model_name or opts.model,
        tokenizer=tok,
        chat_template=template,
        defaults=SamplingParams(
            temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k,
            ignore_eos=opts.ignore_eos,
        ),
        request_log=request_log,
        api_key=resolve_api_key(options.api_key),
        stream_interval=options.stream_interval,
        reasoning_field=options.reasoning_field,
        report_cached_tokens=opts.enable_prefix_caching,
        per_request_metrics=options.enable_per_request_metrics,
        max_image_bytes=options.max_image_bytes,
        limit_images_per_prompt=options.image_limit,
        max_stored_response_bytes=options.max_stored_response_bytes,
    )
    if config.api_key is None and not is_loopback(host):
        C.notice(
            f"warning: listening on {host} without --api-key: anyone who can reach this port "
            "can use the server"
        )
    _check_writable(request_log)
    from cbbench.analysis.result import check_not_an_input, engine_inputs

    check_not_an_input(request_log, [tokenizer, *engine_inputs(opts)], "--request-log")
    from cbbench.fd_limit import RESERVED_FDS, open_file_limit, raise_open_file_limit
    from cbbench.server.limits import OVERFLOW_RESERVE, guarded_protocol

    # Room beside the connections for the server's own files and for the 503 answers to
    # connections beyond the cap (cbbench/server/limits.py).
    reserved = RESERVED_FDS + OVERFLOW_RESERVE
    allowed = raise_open_file_limit(max_connections, reserved)
    if allowed < max_connections:
        C.notice(f"warning: the open-file limit allows {allowed} connections: "
                 f"--max-connections {max_connections} lowered to {allowed}")
    limits = (f"at most {allowed} connections, {OVERFLOW_RESERVE} more answered 503; "
              f"open-file limit {open_file_limit()}")
    app = create_app(lambda: build_serving_engine(opts), config)
    protocol = guarded_protocol(options.read_timeout, allowed)
    error = _run_event_loop(_run_server(app, host, port, opts.engine, protocol, limits))
    if error is not None:
        raise UsageError(error)


def _run_event_loop(coro):
    """uvloop when it is installed (a libuv loop: cheaper wake-ups and socket writes than
    asyncio's on every token), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _check_writable(path: str | None) -> None:
    if path is None:
        return
    p = Path(path)
    if path.endswith("/") and not p.is_dir():  # pathlib drops the '/': a file would be made
        raise UsageError(f"--request-log {path} ends in '/' but is not a folder: name a file")
    if p.is_dir():
        raise UsageError(f"--request-log {path} is a directory")
    if not p.parent.is_dir():
        raise UsageError(f"--request-log: the folder {p.parent} does not exist")
    try:
        # Non-blocking: a FIFO with no reader made a plain open wait for one, and start-up
        # hung silently; O_NONBLOCK gives ENXIO at once instead.
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        os.close(fd)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise UsageError(f"--request-log {path} is a FIFO with no reader: start its "
                             "reader first, or give a file") from None
        raise UsageError(f"--request-log {path}: {e.strerror or e}") from None


async def _run_server(app, host: str, port: int, kind: str, protocol=None,
                      limits: str | None = None) -> str | None:
    """Run uvicorn until it exits. Returns an error message when the server could not listen
    or the engine failed to start."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app, host=host, port=port, log_level="warning", backlog=LISTEN_BACKLOG,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            # No per-request access log and no X-Forwarded-For rewriting: neither is used,
            # and both run on every request.
            access_log=False, proxy_headers=False,
            # Read timeout, head size and connection cap (cbbench/server/limits.py).
            http=protocol or "auto",
        )
    )
    bridge = app.state.engine
    announce = asyncio.create_task(_announce(server, bridge, host, kind, limits))
    drain = asyncio.create_task(_end_streams_on_exit(server, bridge))
    startup_errors = _StartupErrors(server)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(startup_errors)
    try:
        await server.serve()
    except SystemExit:  # uvicorn exits this way when it cannot bind (it logged why)
        why = f": {startup_errors.messages[-1]}" if startup_errors.messages else ""
        return f"could not listen on {host}:{port}{why}"
    finally:
        uvicorn_log.removeFilter(startup_errors)
        announce.cancel()
        drain.cancel()
    return bridge.error


class _StartupErrors(logging.Filter):
    """Why uvicorn could not start (it logs it, then exits), kept for cbbench's one error line:
    printed by uvicorn it was a second stderr line (`ERROR: [Errno 98] ...`)."""

    def __init__(self, server) -> None:
        super().__init__()
        self.server = server
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and not self.server.started:
            self.messages.append(record.getMessage())
            return False
        return True


async def _end_streams_on_exit(server, bridge) -> None:
    """Once uvicorn is asked to exit (Ctrl-C, SIGTERM), stop the engine: every open stream
    ends at once with an error event and [DONE]. Left to uvicorn, streams outlasting its
    graceful wait were cancelled, one ASGI traceback each."""
    while not server.should_exit:
        await asyncio.sleep(READY_POLL_S)
    await asyncio.to_thread(bridge.stop)


async def _announce(server, bridge, host: str, kind: str, limits: str | None = None) -> None:
    """Print the URL once both uvicorn and the engine are ready; stop the server if the engine
    failed. Not a network loop: it waits out the engine build (a model load can take minutes)."""
    while not (server.started and (bridge.ready or bridge.error)):
        await asyncio.sleep(READY_POLL_S)
    if bridge.error is not None:
        server.should_exit = True
        return
    port = server.servers[0].sockets[0].getsockname()[1]
    model = (bridge.info or {}).get("model", "?")
    said = f" ({limits})" if limits else ""  # the connection cap beside the file limit
    typer.echo(f"cbbench serve: {model} ({kind} engine) ready at http://{host}:{port}/v1{said}")
