"""The array simulator: a simulated run held in counts and arrays, for millions of requests.

The object path (Engine + Scheduler + SimExecutor on a VirtualClock, stepped by run_replicas or
run_feed) visits every running request on every step: ~100 us a step at 50 rows, and every
request and iteration kept as objects. This module runs the same engines' semantics with no
request objects, where every running request gains a token on every step (the decode phase
never runs out of budget or KV blocks). Then a replica's state is counts:

- decode rows' keys grow by one per row per step: their sum is a running total;
- a decode row needs a new KV block when its context reaches a block boundary, i.e. at the
  steps s with s = (start step - prompt) mod block_size: a counter per residue says how many
  rows cross at each step;
- a decode row's finish step is known when its prompt completes (its output length is fixed,
  the simulator has no EOS): a bucket per step;
- prefill chunks, admissions, arrivals and finishes are handled one by one (each happens
  once per request).

So a step costs O(1) plus its events. The same order of everything the object path orders
(replicas by clock then index, admissions head first within the budget, chunks in admission
order, the roofline's sums in operator order: cost_model.flat_roofline) gives the same run bit
for bit: tests/engine/test_array_sim.py compares every per-request token time and every iteration
record with the object path's on runs with DP 1 and DP 8, each router it serves, chunked and
unchunked prefill, and a rejected request.

Where the model does not hold it says so, before the run (``unsupported``: another batching
mode or policy, prefix caching, speculative decoding, disaggregation, sessions, cancels,
reasoning splits, a profile's step factors) or during it (``NeedsStepping``: a step that would
preempt); the caller then runs the object path. ``--no-fast-forward`` always steps the objects
(the reference).

Output: a CompactRun (cbbench/analysis/compact/compact_run.py): per-request columns, each replica's step
end times (a request's tokens are a slice of them), the iteration records as columns.
"""

from __future__ import annotations

import array
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from ..args import EngineArgs
from ..core.engine import Engine
from ..core.request import Request
from .cost_model import BatchShape, CostModel

ROUTERS = ("round-robin", "least-requests", "least-kv")
# How often (steps) the run checks its stop signal and reports progress.
CHECK_EVERY_STEPS = 4096
INTERRUPTED = ("cancelled by the interrupt", "interrupted")

# Float and int columns of each replica's steps, as the iteration record names them.
FLOAT_COLUMNS = ("start_s", "end_s", "predicted_s", "bytes_moved", "flops", "attn_key_pairs",
                 "attn_keys_read", "attn_decode_keys")
# Not kept: the tokens a step emits and the requests that gain them are its sampled rows
# (num_logits: every decode row and every prefill row that completes its prompt gains one).
INT_COLUMNS = ("num_prefill_tokens", "num_decode_reqs", "num_prefill_reqs", "num_running",
               "num_waiting", "kv_blocks_used", "num_logits")


class NeedsStepping(Exception):
    """The run reached what the array simulator does not model (a preemption): step the
    object engine instead."""


def unsupported(args: EngineArgs) -> str | None:
    """Why these simulator options need the object path, or None (the engine kind is the
    caller's to check: targets/engine_compact.compact_unsupported resolves it)."""
    checks = [
        (not args.fast_forward, "--no-fast-forward steps every request"),
        (args.batching != "continuous", "static batching"),
        (args.queue_policy != "fcfs", "a priority queue"),
        (args.kv_allocation != "paged", "reserved KV allocation"),
        (args.enable_prefix_caching, "prefix caching"),
        (bool(args.speculative_tokens), "speculative decoding"),
        (args.disaggregate is not None, "disaggregated prefill"),
        (args.data_parallel_size > 1 and args.router not in ROUTERS, f"--router {args.router}"),
    ]
    for bad, why in checks:
        if bad:
            return why
    return None


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Replica:
    """One engine replica's state, as counts."""

    def __init__(self, index: int, engine: Engine) -> None:
        cfg = engine.scheduler.config
        if cfg.max_num_seqs >= cfg.max_num_batched_tokens:
            raise NeedsStepping("max_num_seqs reaches the token budget: decodes could be skipped")
        self.index = index
        self.engine = engine  # for its configuration and its rejection messages only
        self.budget = cfg.max_num_batched_tokens
        self.max_seqs = cfg.max_num_seqs
        self.chunked = cfg.chunked_prefill
        self.bs = engine.block_manager.block_size
        self.total_blocks = engine.block_manager.num_blocks
        cm = engine.cost_model
        assert isinstance(cm, CostModel)  # a simulated engine has the simulator's
        self.cost_model = cm
        self.cost = cm.flat or self._object_cost
        self.clock = 0.0
        self.nsteps = 0
        self.waiting: deque[int] = deque()
        self.prefilling: list[list[int]] = []  # [request, computed tokens], admission order
        self.nd = 0  # decode rows
        self.decsum = 0  # their computed tokens, summed
        self.used = 0  # KV blocks held
        self.crossing = [0] * self.bs  # decode rows by (start step - prompt) mod block_size
        self.finishing: dict[int, list[tuple[int, int, int]]] = {}  # step -> (req, c, residue)
        self.cols: dict[str, array.array] = {n: array.array("d") for n in FLOAT_COLUMNS}
        self.cols.update({n: array.array("i") for n in INT_COLUMNS})  # int32: a step's counts
        self._append = tuple(self.cols[n].append for n in FLOAT_COLUMNS + INT_COLUMNS)

    def _object_cost(self, tokens, logits, pairs, keys_read, reqs, prefill_reqs, decode_keys):
        c = self.cost_model.cost(BatchShape(tokens, logits, pairs, keys_read, reqs,
                                            prefill_reqs, decode_keys))
        return c.time_s, c.bytes, c.flops

    @property
    def busy(self) -> bool:
        return bool(self.nd or self.prefilling or self.waiting)

    @property
    def num_unfinished(self) -> int:
        return self.nd + len(self.prefilling) + len(self.waiting)

    def step(self, sim: ArraySim) -> None:
        """One iteration: schedule (decodes, chunks, admissions), price, advance."""
        prompt = sim.prompt
        s = self.nsteps
        start = self.clock
        nd = self.nd
        used = self.used
        budget = self.budget - nd
        if nd:  # 1. every decode row; those at a block boundary take a block
            need = self.crossing[s % self.bs]
            if need > self.total_blocks - used:
                raise NeedsStepping(f"replica {self.index}, step {s}: a decode preempts")
            used += need
        rows: list[tuple[list[int], int, int]] = []  # prefill rows: (entry, tokens, computed)
        if self.prefilling:
            used, budget = self._chunks(prompt, s, used, budget, rows)
        if self.waiting:
            used, budget = self._admit(sim, start, used, budget, rows)
        prefill_tokens = self.budget - budget - nd
        dec_keys = self.decsum + nd
        dk = float(dec_keys)
        pairs = keys_read = dk
        logits = nd
        for e, n, c in rows:  # BatchShape.from_scheduler_output's sums, in its order
            pairs += n * c + n * (n + 1) / 2
            keys_read += c + n
            if c + n == prompt[e[0]]:
                logits += 1
        nrows = len(rows)
        t, nbytes, flops = self.cost(nd + prefill_tokens, logits, pairs, keys_read,
                                     nd + nrows, nrows, dk)
        end = start + t
        if end < start:
            end = start
        self.clock = end
        (a_start, a_end, a_pred, a_bytes, a_flops, a_pairs, a_read, a_dec, a_pre, a_nd,
         a_npre, a_run, a_wait, a_kv, a_logits) = self._append
        a_start(start)
        a_end(end)
        a_pred(t)
        a_bytes(nbytes)
        a_flops(flops)
        a_pairs(pairs)
        a_read(keys_read)
        a_dec(dk)
        a_pre(prefill_tokens)
        a_nd(nd)
        a_npre(nrows)
        a_run(nd + len(self.prefilling))
        a_wait(len(self.waiting))
        a_kv(used)
        a_logits(logits)
        # Post-process: every decode row gains a token (those at their length finish); a
        # prefill row that completes its prompt gains its first.
        self.decsum += nd
        done = self.finishing.pop(s, None)
        if done:
            used -= self._finish_decodes(done, sim, end)
        if rows:
            used -= self._first_tokens(rows, sim, s, end)
        self.used = used
        self.nsteps = s + 1

    def _chunks(self, prompt: list[int], s: int, used: int, budget: int,
                rows: list) -> tuple[int, int]:
        """2. Unfinished prefill chunks, in admission order."""
        bs = self.bs
        for e in self.prefilling:
            if budget <= 0:
                break
            c = e[1]
            n = prompt[e[0]] - c
            if n > budget:
                if not self.chunked:
                    continue
                n = budget
            need = cdiv(c + n, bs) - cdiv(c, bs)
            if need > self.total_blocks - used:
                raise NeedsStepping(f"replica {self.index}, step {s}: a prefill chunk preempts")
            used += need
            rows.append((e, n, c))
            budget -= n
        return used, budget

    def _admit(self, sim: ArraySim, now: float, used: int, budget: int,
               rows: list) -> tuple[int, int]:
        """3. Admissions, head first, while the budget, sequence slots and KV blocks allow."""
        waiting = self.waiting
        nrun = self.nd + len(self.prefilling)
        bs = self.bs
        while waiting and budget > 0 and nrun < self.max_seqs:
            i = waiting[0]
            n = sim.prompt[i]
            if n > budget:
                if not self.chunked:
                    break
                n = budget
            need = cdiv(n, bs)
            if need > self.total_blocks - used:
                break
            waiting.popleft()
            sim.first_scheduled[i] = now
            e = [i, 0]
            self.prefilling.append(e)
            nrun += 1
            used += need
            rows.append((e, n, 0))
            budget -= n
        return used, budget

    def _finish_decodes(self, done: list[tuple[int, int, int]], sim: ArraySim,
                        end: float) -> int:
        """Decode rows at their length: out of the counts. Returns the blocks they free."""
        bs = self.bs
        crossing = self.crossing
        freed = 0
        for _, c, residue in done:
            freed += cdiv(c, bs)
            self.decsum -= c
            crossing[residue] -= 1
        self.nd -= len(done)
        sim.finished(len(done), end)
        if sim.ended is not None:
            ends = self.cols["end_s"]
            for i, _, _ in done:
                sim.ended.append((i, ends[sim.first_step[i]], end))
        return freed

    def _first_tokens(self, rows: list, sim: ArraySim, s: int, end: float) -> int:
        """Prefill rows: a completed prompt gains its first token and decodes from the next
        step (or finishes, at one token). Returns the blocks finished ones free."""
        bs = self.bs
        freed = first = 0
        for e, n, c in rows:
            c += n
            e[1] = c
            i = e[0]
            p = sim.prompt[i]
            if c < p:
                continue  # a partial chunk
            first += 1
            sim.first_step[i] = s
            m = sim.max_tokens[i]
            if m <= 1:
                freed += cdiv(p, bs)
                sim.finished(1, end)
                if sim.ended is not None:
                    sim.ended.append((i, end, end))
                continue
            self.nd += 1
            self.decsum += p
            residue = (s + 1 - p) % bs
            self.crossing[residue] += 1
            self.finishing.setdefault(s + m - 1, []).append((i, p + m - 1, residue))
        if first:
            self.prefilling = [e for e in self.prefilling if e[1] < sim.prompt[e[0]]]
        return freed

    def abort_all(self, sim: ArraySim) -> None:
        """The interrupt's end: every request still here is aborted (tokens so far kept)."""
        last = self.nsteps - 1
        for i in self.waiting:
            sim.errors[i] = INTERRUPTED
        for e in self.prefilling:
            sim.errors[e[0]] = INTERRUPTED
        for bucket in self.finishing.values():
            for i, _, _ in bucket:
                sim.errors[i] = INTERRUPTED
                sim.tokens_at_abort[i] = last - sim.first_step[i] + 1
        self.waiting.clear()
        self.prefilling = []
        self.finishing = {}
        self.nd = self.decsum = self.used = 0


class ArraySim:
    """The replica loop (run_replicas' order: an arrival no later than every busy replica's
    clock first, else the busy replica furthest behind, ties to the lowest index)."""

    def __init__(self, engines: Sequence[Engine], router: str, prompt: list[int],
                 max_tokens: list[int], arrival: list[float]) -> None:
        self.replicas = [_Replica(k, e) for k, e in enumerate(engines)]
        self.router = router
        self.prompt, self.max_tokens, self.arrival = prompt, max_tokens, arrival
        n = len(prompt)
        self.first_scheduled = array.array("d", [math.nan]) * n
        self.first_step = array.array("q", [-1]) * n
        self.replica_of = array.array("q", [0]) * n
        self.errors: dict[int, tuple[str, str]] = {}
        self.tokens_at_abort: dict[int, int] = {}
        # A live view's feed (targets/live.py), when one listens: (request, first token time,
        # last token time) of each finished request, in finishing order.
        self.ended: list[tuple[int, float, float]] | None = None
        self.num_done = 0  # finished or rejected
        self.last_finish = -math.inf
        self.arrived = 0
        self._rr = 0

    def finished(self, n: int, t: float) -> None:
        self.num_done += n
        if t > self.last_finish:
            self.last_finish = t

    def _route(self) -> int:
        reps = self.replicas
        if self.router == "round-robin" or len(reps) == 1:
            k = self._rr % len(reps)
            self._rr += 1
            return k
        if self.router == "least-requests":
            return min(range(len(reps)), key=lambda k: (reps[k].num_unfinished, k))
        return min(range(len(reps)), key=lambda k: (
            reps[k].used / reps[k].total_blocks, reps[k].num_unfinished, k))

    def _arrive(self, i: int, heap: list) -> None:
        k = self._route()
        rep = self.replicas[k]
        self.replica_of[i] = k
        t = self.arrival[i]
        if t > rep.clock:
            rep.clock = t
        p, m = self.prompt[i], self.max_tokens[i]
        cfg = rep.engine.scheduler.config
        if (p < 1 or m < 1 or p + m > cfg.max_model_len or cdiv(p + m - 1, rep.bs) >
                rep.total_blocks or (not rep.chunked and p + m - 1 > rep.budget)):
            reason = rep.engine.scheduler.rejection_reason(Request(i, p, m, arrival_time=t))
            assert reason is not None, "the array simulator's admission check is the scheduler's"
            self.errors[i] = (reason, "rejected")
            self.finished(1, rep.clock)
            return
        if not rep.busy:
            heapq.heappush(heap, (rep.clock, k))
        rep.waiting.append(i)

    def run(self, should_stop: Callable[[], bool] | None = None,
            on_progress: Callable[[int], None] | None = None) -> bool:
        """Until every request is done; False when ``should_stop`` ended it early."""
        arrival, n = self.arrival, len(self.arrival)
        replicas = self.replicas
        heap: list[tuple[float, int]] = []
        ai = 0
        steps = 0
        while True:
            if ai < n and (not heap or arrival[ai] <= heap[0][0]):
                t = arrival[ai]
                while ai < n and arrival[ai] <= t:
                    self._arrive(ai, heap)
                    ai += 1
                self.arrived = ai
                continue
            if not heap:
                return True
            k = heap[0][1]
            rep = replicas[k]
            rep.step(self)
            if rep.nd or rep.prefilling or rep.waiting:  # still busy
                heapq.heapreplace(heap, (rep.clock, k))
            else:
                heapq.heappop(heap)
            steps += 1
            if steps % CHECK_EVERY_STEPS == 0:
                if on_progress is not None:
                    on_progress(self.num_done)
                if should_stop is not None and should_stop():
                    return False

    def drain(self, grace_s: float) -> None:
        """After a stop (targets/engine._drain): queued requests are aborted, running ones
        finish for up to ``grace_s`` of wall time per replica, the rest are aborted."""
        for rep in self.replicas:
            for i in rep.waiting:
                self.errors[i] = INTERRUPTED
            rep.waiting.clear()
            deadline = time.monotonic() + grace_s
            while rep.busy and time.monotonic() < deadline:
                rep.step(self)
            rep.abort_all(self)

    def now(self) -> float:
        return max(r.clock for r in self.replicas)

    def live_state(self) -> tuple[float, int, dict]:
        """(clock, requests in flight, the last step's running / token budget use / KV use
        summed over the replicas), as a live view reads an engine's last records."""
        reps = [r for r in self.replicas if r.nsteps and r.cols]
        in_flight = sum(r.num_unfinished for r in self.replicas)
        if not reps:
            return self.now(), in_flight, {}
        budget = sum(r.budget for r in reps)
        kv_total = sum(r.total_blocks for r in reps)
        scheduled = sum(r.cols["num_prefill_tokens"][-1] + r.cols["num_decode_reqs"][-1]
                        for r in reps)
        return self.now(), in_flight, {
            "running": sum(r.cols["num_running"][-1] for r in reps),
            "token_budget_use": scheduled / budget,
            "kv_use": sum(r.cols["kv_blocks_used"][-1] for r in reps) / kv_total,
        }

    # ---- the result as columns ---------------------------------------------------------
    def step_columns(self, replica_field: bool) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """Every replica's steps as one table in the engine's record order (start time, then
        replica), and each replica's end times. Each replica's buffers are released column by
        column as they are merged (a million-request run holds ~3M steps)."""
        reps = self.replicas
        ends = [np.frombuffer(r.cols["end_s"], dtype=np.float64).copy() for r in reps]
        sizes = [len(e) for e in ends]
        rep_col = np.repeat(np.arange(len(reps), dtype=np.int32), sizes)
        start = np.concatenate([np.frombuffer(r.cols["start_s"], dtype=np.float64)
                                for r in reps])
        order = np.lexsort((rep_col, start)) if len(reps) > 1 else None

        def merged(name: str, dtype) -> np.ndarray:
            parts = [np.frombuffer(r.cols.pop(name), dtype=np.float64 if name in FLOAT_COLUMNS
                                   else np.int32) for r in reps]
            col = np.concatenate(parts).astype(dtype, copy=False)
            del parts
            return col[order] if order is not None else col

        index = np.concatenate([np.arange(k, dtype=np.int32) for k in sizes])
        cols: dict[str, np.ndarray] = {"index": index[order] if order is not None else index}
        del index
        cols["start_s"] = start[order] if order is not None else start
        del start
        cols["duration_s"] = merged("end_s", np.float64) - cols["start_s"]
        for name in FLOAT_COLUMNS:
            if name not in ("start_s", "end_s"):
                cols[name] = merged(name, np.float64)
        for name in INT_COLUMNS:
            cols[name] = merged(name, np.int32)
        for r in reps:
            r.cols.clear()
        total = len(cols["index"])
        r0 = reps[0]
        cols["num_decode_tokens"] = cols["num_decode_reqs"]
        cols["emitted_tokens"] = cols["num_sampled_reqs"] = cols["num_logits"]
        const = {"token_budget": r0.budget, "kv_blocks_total": r0.total_blocks,
                 "num_preempted": 0, "num_swapped_out_blocks": 0, "num_swapped_in_blocks": 0,
                 "swap_time_s": 0.0, "num_cached_tokens": 0, "num_prefix_queried_tokens": 0,
                 "num_drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        for name, v in const.items():
            cols[name] = np.broadcast_to(np.asarray(v, dtype=np.float64 if isinstance(v, float)
                                                    else np.int32), (total,))
        if replica_field:
            cols["replica"] = rep_col[order] if order is not None else rep_col
        return cols, ends
