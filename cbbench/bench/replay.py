"""`--replay RESULT.json`: a recorded run's exact requests and arrival times, run again.

The request set comes from the result's per-request records: each request's id, prompt
length, output length (what it produced when it completed — a model that stopped at EOS
stopped there — else the length it asked for) and intended start (the arrival schedule). The
recorded run's seed and cancel plan (--cancel-rate) come with it, and its scheduling options
(so the simulator batches as the real engine did); the command line chooses the device: `--engine sim --gpu-profile PROFILE.json` (or
`--gpu`). Options whose default is "unset" (--model, --dtype, --max-num-batched-tokens,
--max-model-len, --num-kv-blocks) still win when given.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.finite import is_finite
from cbbench.load.workload_types import WorkloadRequest
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Config, Request, RunResult

log = logging.getLogger(__name__)

# Scheduling options of the recorded engine run that the replay keeps (the batching the
# simulator must reproduce).
SCHEDULING_FIELDS = (
    "scheduler", "chunked_prefill", "kv_allocation", "max_num_seqs", "block_size",
    "preemption", "swap_space", "policy", "enable_prefix_caching", "ignore_eos",
)

# Kept too unless the command line sets them (their default is None).
UNSET_DEFAULT_FIELDS = ("model", "dtype", "max_num_batched_tokens", "max_model_len")


@dataclass(frozen=True)
class Replay:
    source: str
    config: Config  # the recorded run's config
    requests: list[WorkloadRequest]
    arrivals: np.ndarray
    engine: EngineArgs  # the command line's options with the recorded scheduling ones

    def run_spec(self, spec):
        """The RunSpec that replays: these requests in their order (the path as the workload,
        so nothing is resampled), the recorded run's config for the record."""
        c = self.config
        rate = c.request_rate
        # The recorded seed everywhere the run reads one: the engine's sampling and an
        # endpoint's synthetic prompt text and adapter picks (drawn per request id from it).
        seed = c.seed if c.seed is not None else spec.load.seed
        if spec.endpoint is not None:
            spec = dataclasses.replace(spec, endpoint=dataclasses.replace(spec.endpoint,
                                                                          seed=seed))
        return dataclasses.replace(
            spec.with_load(
                workload=self.source,
                num_requests=None,
                seed=seed,
                # The recorded cancel plan (picks and delays drawn per request id from the
                # seed), unless the command line gives one.
                **({} if spec.load.cancel_rate is not None or spec.load.cancel_after is not None
                   else _recorded_cancel(c)),
                request_rate="inf" if rate in (None, "inf") else repr(float(rate)),
                burstiness=float(c.burstiness or 1.0),
                arrival="trace",
                time_scale=1.0,
                duration=None,
                ramp=None,
            ),
            engine=dataclasses.replace(self.engine, seed=seed),
        )


def _recorded_cancel(config: Config) -> dict:
    """The recorded run's --cancel-rate / --cancel-after, where it had them."""
    extra = config.model_extra or {}
    if extra.get("cancel_rate") is None:
        return {}
    return {"cancel_rate": extra["cancel_rate"], "cancel_after": extra.get("cancel_after")}


def _int_field(rec: Request, key: str, v: object, where: str, low: int | None) -> int:
    """``v`` (the record's field ``key``) as an int >= ``low``; a text, float, bool or missing
    value in a hand-edited result was an int() ValueError / KeyError traceback."""
    if type(v) is not int or (low is not None and v < low):
        want = "an integer" + (f" >= {low}" if low is not None else "")
        raise UsageError(f"{where}: request {rec.id!r} has {key} {v!r}: expected {want}")
    return v


def _output_len(rec: Request, where: str) -> int | None:
    # A cancelled request stopped at its cancel, not at its length: it asks for max_tokens
    # again, and the recorded cancel plan (run_spec) cancels it at the same point.
    if rec.error is None and rec.output_tokens and not rec.cancelled:
        return _int_field(rec, "output_tokens", rec.output_tokens, where, 1)
    if rec.max_tokens:
        return _int_field(rec, "max_tokens", rec.max_tokens, where, 1)
    return None


def _check_run_fields(config: Config, where: str) -> None:
    """The recorded run's fields run_spec reads, of their kinds."""
    seed, rate, burst = config.seed, config.request_rate, config.burstiness
    extra = config.model_extra or {}
    cancel, after = extra.get("cancel_rate"), extra.get("cancel_after")
    problems = [
        ("cancel_rate", cancel) if cancel is not None and not (
            is_finite(cancel) and 0 <= cancel <= 1) else None,
        ("cancel_after", after) if cancel is not None and type(after) is not str else None,
        ("seed", seed) if seed is not None and (type(seed) is not int or seed < 0) else None,
        ("request_rate", rate) if rate not in (None, "inf") and not (is_finite(rate) and rate > 0) else None,
        ("burstiness", burst) if burst is not None and not (is_finite(burst) and burst > 0) else None,
    ]
    for key, v in filter(None, problems):
        raise UsageError(f"{where}: config has {key} {v!r}: not a value a run records")


def replayed_requests(result: RunResult | dict,
                      where: str) -> tuple[list[WorkloadRequest], np.ndarray, int]:
    """(requests, arrival times, requests left out for want of an output length)."""
    records = as_run(result).requests
    if not records:
        raise UsageError(f"{where} has no per-request records to replay (--summary-only?)")
    # The records count a request's images, not the images: a replay would send text alone.
    if any(rec.images for rec in records):
        raise UsageError(f"{where}: its requests carried images, which a replay cannot send "
                         "(the records count them only): re-run its config.command")
    reqs, arrivals, unknown = [], [], 0
    for rec in records:
        out = _output_len(rec, where)
        if out is None:
            unknown += 1
            continue
        t = rec.intended_start_s
        if t is None or not math.isfinite(t) or t < 0:
            raise UsageError(f"{where}: request {rec.id} has no intended start time")
        priority = rec.priority if "priority" in rec.model_fields_set else 0
        reqs.append(WorkloadRequest(_int_field(rec, "id", rec.id, where, 0),
                                    _int_field(rec, "prompt_tokens", rec.prompt_tokens, where, 1),
                                    out, arrival_s=float(t),
                                    priority=_int_field(rec, "priority", priority, where, None)))
        arrivals.append(float(t))
    if not reqs:
        raise UsageError(f"{where}: no request with a known output length to replay")
    return reqs, np.array(arrivals, dtype=np.float64), unknown


def _same_device(args: EngineArgs, config: Config) -> bool:
    """Whether the replay runs on the device the recorded run measured (then its KV capacity
    is the recorded one, not an estimate)."""
    recorded = "cpu" if config.device == "cpu" else config.gpu
    if args.gpu_profile is not None:
        from cbbench.engine.args import EngineArgsError
        from cbbench.engine.build_common import load_device_profile

        try:
            return load_device_profile(args).device == recorded
        except EngineArgsError:
            return False  # the engine build reports it
    return args.gpu is not None and args.gpu.lower() == recorded


def replay_engine_args(args: EngineArgs, config: Config | dict) -> EngineArgs:
    c = Config.model_validate(config)
    if c.target != "engine":
        log.info("replaying an endpoint run: the engine options are the command line's")
        return args
    # The recorded options as written (their kinds are EngineArgs.validate's to check): the
    # scheduling ones by name, from the fields the file has.
    written = {**c.model_dump(include=c.model_fields_set), **(c.model_extra or {})}
    kept = {EngineArgs.field_of(k): written[k] for k in SCHEDULING_FIELDS if k in written}
    for f in UNSET_DEFAULT_FIELDS:
        if getattr(args, f) is None and written.get(f) is not None:
            kept[f] = written[f]
    blocks = written.get("num_kv_blocks")
    if args.num_kv_blocks is None and blocks and _same_device(args, c):
        kept["num_kv_blocks"] = blocks
    if written.get("enable_prefix_caching") is True:
        log.info("the recorded run used prefix caching; a replay has no token ids to match")
    return dataclasses.replace(args, **kept)


def load_replay(path: str, args: EngineArgs) -> Replay:
    from cbbench.schema import read_run

    run = read_run(Path(path))
    if run.interrupted:
        raise UsageError(f"{path} is an interrupted run: its request set is incomplete")
    _check_run_fields(run.config, path)
    reqs, arrivals, unknown = replayed_requests(run, path)
    if unknown:
        log.info(f"{unknown} failed request(s) in {path} record no output length; left out")
    try:
        engine = replay_engine_args(args, run.config).validate()
    except UsageError as e:  # a recorded value this cbbench rejects: say which file
        raise UsageError(f"{path}: {e}") from None
    return Replay(path, run.config, reqs, arrivals, engine)
