"""The parent's side of a multi-worker run: collect the workers' streamed records, account for
every request (a worker that dies leaves its requests counted, never dropped), and build one
result of the same form as a one-process run, with summary.workers beside it."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from cbbench.analysis.records import RequestRecord
from cbbench.distributed.messages import Done, Failed, Message, Ready, RecordBatch
from cbbench.distributed.session_share import cut_short, lost_turns
from cbbench.distributed.worker import WARNING_PREFIX
from cbbench.distributed.worker_entry import ClientFigures, WorkerEntry, worker_entry
from cbbench.load.session_plan import SessionPlan
from cbbench.load.workload_types import WorkloadRequest
from cbbench.targets.balance import lora_models, tag_records
from cbbench.targets.checks import StreamNotes
from cbbench.targets.client_health import loop_lag_check, wall_clock_of
from cbbench.targets.http import TOKEN_COUNT_METHODS, HttpRun, finish_http_run
from cbbench.targets.options import EndpointOptions, redact_url

log = logging.getLogger(__name__)

APPROXIMATE_SIZING = "approximate"  # prompt_sizing where a worker's prompts were not all sized
WORKER_LOST = "worker_lost"  # error_type of a request due before its worker died, unreported
# States of a worker, in the order they happen; the last three are final.
STARTING, READY, DONE, DIED, FAILED = "starting", "ready", "done", "died", "failed"
FINAL = (DONE, DIED, FAILED)
# Figures of one client process: summed or pooled over the workers, never taken from one.
PER_WORKER_KEYS = (
    "connection_pool_size",
    "connection_pool_capped",
    "max_in_flight",
    "t0_epoch_s",
    "client_cpu_s",
    "client_cpu_util",
    "loop_lag_p50_ms",
    "loop_lag_p99_ms",
    "loop_lag_max_ms",
    "loop_lag_span_s",
    "client_bound",
    "client_bound_message",
    "client_fell_behind_message",
    "sent_by_endpoint",
    "prompt_sizing",
)


@dataclass
class WorkerState:
    worker: int
    positions: list[int]
    status: str = STARTING
    pid: int | None = None
    host: str | None = None
    done: Done | None = None
    died_at_s: float | None = None  # on the run clock: when the parent saw it gone
    error: str | None = None
    extra: dict = field(default_factory=dict)  # Ray: node, clock offset and uncertainty
    sessions: list[int] = field(default_factory=list)  # multi-turn: its session positions


class Merger:
    def __init__(
        self,
        wreqs: list[WorkloadRequest],
        arrivals: list[float],
        shares: list[list[int]],
        plan: SessionPlan | None = None,
        session_shares: list[list[int]] | None = None,
    ):
        """`plan` and `session_shares` (each worker's session positions): a multi-turn run,
        whose positions are request ids (wreqs and arrivals then empty)."""
        self.wreqs = wreqs
        self.arrivals = arrivals
        self.plan = plan
        self.total = plan.num_turns if plan is not None else len(wreqs)
        self.records: list[RequestRecord | None] = [None] * self.total
        self.methods = dict.fromkeys(TOKEN_COUNT_METHODS, 0)
        self.workers = [
            WorkerState(k, share, sessions=session_shares[k] if session_shares else [])
            for k, share in enumerate(shares)
        ]
        self.finished = 0  # records received, for progress
        self.usage_error: str | None = None  # a worker's UsageError: the run's bad input

    # -- while running --
    def on_message(self, msg: Message, at_s: float | None = None) -> None:
        """`at_s`: now on the run clock (None before the start)."""
        ws = self.workers[msg.worker]
        if isinstance(msg, RecordBatch):
            for pos, rec, method in msg.items:
                if self.records[pos] is not None:  # a bug, never a figure to report
                    raise RuntimeError(f"request at position {pos} reported twice")
                rec.worker = msg.worker
                self.records[pos] = rec
                if rec.error is None:
                    self.methods[method] += 1
            self.finished += len(msg.items)
        elif isinstance(msg, Ready):
            ws.status, ws.pid, ws.host = READY, msg.pid, msg.host
        elif isinstance(msg, Done):
            ws.status, ws.done = DONE, msg
        elif isinstance(msg, Failed):
            ws.status, ws.error = FAILED, msg.message
            ws.died_at_s = at_s  # crashed mid-run: its due requests are lost, as in a death
            if msg.usage and self.usage_error is None:
                self.usage_error = msg.message

    def died(self, worker: int, at_s: float, reason: str) -> None:
        """The worker is gone without its Done (call after reading what it had sent)."""
        ws = self.workers[worker]
        if ws.status in FINAL:
            return
        ws.status, ws.died_at_s, ws.error = DIED, at_s, reason

    @property
    def all_final(self) -> bool:
        return all(ws.status in FINAL for ws in self.workers)

    # -- at the end --
    def _account_lost(self, ws: WorkerState, opts: EndpointOptions) -> tuple[int, int]:
        """A dead (or crashed) worker's unreported requests: those due before it died are
        failed records (sent or about to be, their outcome unknown), holding what one process's
        record would (the length asked for, the --lora-modules adapter, drawn per request id);
        the rest were not sent."""
        died_at = ws.died_at_s if ws.died_at_s is not None else -math.inf
        if self.plan is not None:
            error = (f"worker {ws.worker} died ({ws.error}) at {died_at:.3f} s, after this turn "
                     "was due and before it reported it")
            recs, not_sent = lost_turns(
                self.plan, ws.sessions, self.records, died_at, error, WORKER_LOST, ws.worker
            )
            for rec in recs:
                self.records[rec.id] = rec
            return len(recs), not_sent
        lost = not_sent = 0
        for pos in ws.positions:
            if self.records[pos] is not None:
                continue
            if self.arrivals[pos] <= died_at:
                w = self.wreqs[pos]
                self.records[pos] = RequestRecord(
                    id=w.id,
                    prompt_tokens=w.prompt_len,
                    output_tokens=0,
                    intended_start_s=float(self.arrivals[pos]),
                    error=(
                        f"worker {ws.worker} died ({ws.error}) at {died_at:.3f} s, after this "
                        "request was due and before it reported it"
                    ),
                    error_type=WORKER_LOST,
                    priority=w.priority,
                    worker=ws.worker,
                    max_tokens=w.output_len,
                    model=(lora_models([w.id], opts.lora_modules, opts.seed, None)[0]
                           if opts.lora_modules else None),
                )
                lost += 1
            else:
                not_sent += 1
        return lost, not_sent

    def _worker_entry(self, ws: WorkerState, lost: int, not_sent: int) -> WorkerEntry:
        return worker_entry(
            ws.worker,
            ws.status,
            ws.pid,
            ws.host,
            len(ws.positions),
            [r for p in ws.positions if (r := self.records[p]) is not None],
            ClientFigures.of(ws.done.info) if ws.done is not None else ClientFigures(),
            lost,
            not_sent,
            ws.done.duration_s if ws.done is not None else ws.died_at_s,
            ws.extra,
            ws.error,
        )

    def result(
        self,
        opts: EndpointOptions,
        t0: float,
        stopped: bool,
        parent_cpu_s: float,
        scraped: dict | None = None,
    ) -> HttpRun:
        """`scraped`: the parent's /metrics scrape of the run (parent_scrape.py), if any."""
        entries = []
        for ws in self.workers:
            lost, not_sent = (0, 0)
            if ws.status in (DIED, FAILED):
                lost, not_sent = self._account_lost(ws, opts)
            entries.append((ws, lost, not_sent))
        workers = [self._worker_entry(ws, lost, ns) for ws, lost, ns in entries]
        for ws, e in zip(self.workers, workers):
            if ws.status == DONE:
                e.not_sent = e.assigned - e.sent  # a stopped run's unsent share

        done = [ws.done for ws in self.workers if ws.done is not None]
        # Shared facts (served model, event loop) from the first worker that finished; every per-process figure and count is recomputed over all
        # workers below.
        base = next((d.info for d in sorted(done, key=lambda d: d.worker)), {})
        info = {k: v for k, v in base.items() if k not in PER_WORKER_KEYS}
        pooled_lag = [v for d in done for v in d.loop_lag_ms]
        durations = [d.duration_s for d in done] + [
            ws.died_at_s for ws in self.workers if ws.died_at_s is not None
        ]
        duration = max(durations, default=0.0)
        figures = [ClientFigures.of(d.info) for d in done]
        cpu = sum(f.client_cpu_s or 0.0 for f in figures)
        info.update(
            connection_pool_size=sum(f.connection_pool_size for f in figures),
            connection_pool_capped=any(f.connection_pool_capped for f in figures),
            max_in_flight=_peak_in_flight(self.records, figures),
            t0_epoch_s=wall_clock_of(t0),
            client_cpu_s=cpu,
            client_cpu_util=cpu / duration if duration > 0 else None,  # in cores
            parent_cpu_s=parent_cpu_s,
            **loop_lag_check(
                pooled_lag, max((f.loop_lag_span_s or 0.0 for f in figures), default=0.0)
            ),
            **_shared_counts([d.info for d in done]),
        )
        kinds: dict[str, int] = {}
        for f in figures:
            for k, v in (f.prompt_kinds or {}).items():
                kinds[k] = kinds.get(k, 0) + v
        info.update(scraped or {})
        records = [r for r in self.records if r is not None]
        # Each worker tagged its own records where several URLs or adapters were in play; the
        # rest take the run's one endpoint and served model. A lost request's endpoint, among
        # several, is unknown: left out of by_endpoint (it charged the first URL with them all).
        urls = opts.endpoints()
        tag_records(records, redact_url(urls[0]) if len(urls) == 1 else None,
                    info.get("served_model"))
        _say_workers_notices(done)
        finish_http_run(opts, records, self.methods, kinds, self.total, info)
        for e in workers:
            if e.status == DONE and (e.client_fell_behind or e.client_bound):
                log.info(
                    f"warning: worker {e.worker}: send lag p50 "
                    f"{e.send_lag_p50_ms:.1f} ms, p99 {e.send_lag_p99_ms:.1f} ms; event-loop "
                    f"lag p99 {_ms(e.loop_lag_p99_ms)}; CPU {_pct(e.client_cpu_util)}"
                )
            elif e.status in (DIED, FAILED):
                log.info(
                    f"error: worker {e.worker} {e.status} ({e.error}): "
                    f"{e.sent - e.lost} requests reported, {e.lost} "
                    f"lost (due before it died, counted as failed: {WORKER_LOST}), "
                    f"{e.not_sent} not sent"
                )
        info["workers"] = [e.to_dict() for e in workers]
        interrupted = stopped or any(d.interrupted for d in done)
        not_sent = sum(e.not_sent for e in workers)
        ended_early = sum(d.sessions_ended_early for d in done)
        if self.plan is not None:
            ended_early += sum(cut_short(self.plan, ws.sessions, self.records)
                               for ws in self.workers if ws.status in (DIED, FAILED))
        return HttpRun(records, duration, interrupted, info, not_sent, pooled_lag, ended_early)


def _say_workers_notices(done: list[Done]) -> None:
    """What the workers would have said (worker.Notices), said once, in one process's order:
    each other notice once however many workers said it (every worker probes /tokenize), then
    one line a kind of the streams' notes, counted over every worker's requests."""
    for line in dict.fromkeys(line for d in done for line in d.notices):
        log.info(line)
    notes = StreamNotes()
    for d in done:
        if d.notes is not None:
            notes.absorb(d.notes)
    for line in notes.warnings():
        log.info(WARNING_PREFIX + line)


def _shared_counts(infos: list[dict]) -> dict:
    """The per-worker counts and states of the run's info, over every worker that finished:
    sends by endpoint summed (worker 0's alone read {A: 10, B: 10} of 40 requests), and the
    prompt sizing that held for all of them ('approximate' where one worker's /tokenize
    failed: summary.http.prompt_kinds counts the prompts each way)."""
    out: dict = {}
    sent: dict[str, int] = {}
    for info in infos:
        for url, k in (info.get("sent_by_endpoint") or {}).items():
            sent[url] = sent.get(url, 0) + k
    if sent:
        out["sent_by_endpoint"] = sent
    sizings = list(dict.fromkeys(i["prompt_sizing"] for i in infos if "prompt_sizing" in i))
    if sizings:
        out["prompt_sizing"] = sizings[0] if len(sizings) == 1 else APPROXIMATE_SIZING
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%} of a core"


def peak_in_flight(records) -> int | None:
    """The run's peak of requests open at once, each from its send to its last token (ends
    before starts at a tie); None where a sent request has no token, so its end is unknown."""
    edges: list[tuple[float, int]] = []
    for r in records:
        if r is None or r.send_s is None:
            continue
        if not r.token_times_s:
            return None
        edges += [(r.send_s, 1), (r.token_times_s[-1], -1)]
    level = peak = 0
    for _, step in sorted(edges):
        level += step
        peak = max(peak, level)
    return peak


def _peak_in_flight(records, figures) -> int:
    """The merged run's max_in_flight: its own peak over every worker's records, as one process
    counts it. Summing each worker's peak overstated it (51 open at once read 54 with two
    workers: their peaks fell at different times); the sum stays only where a request's end is
    unknown (one failed before its first token), as an upper bound."""
    peak = peak_in_flight(records)
    return peak if peak is not None else sum(f.max_in_flight or 0 for f in figures)
