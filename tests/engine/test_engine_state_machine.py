"""A hypothesis state machine over the engine: add / abort / step / interrupt-drain, with small
KV pools and budgets, across every scheduler option (continuous and static batching, chunked
prefill on and off, paged and reserved KV, recompute and swap preemption, fcfs and priority
queues, prefix caching on and off).

The engine is the real ``Engine`` on a ``VirtualClock`` with a trivial executor (1 ms per
iteration; token ids either None, as the simulator returns, or a deterministic id so prefix
caching and EOS stops have something to work with). After every rule:

- no KV block is leaked or held twice (``check_invariants`` on the GPU pool, and on the CPU
  pool of swap preemption), and a request that has ended holds no block;
- every live request sits in exactly one queue with a status that matches it;
- every request ends exactly once: finished (in exactly one step's ``finished``), aborted, or
  rejected with a reason; once ended, its status, reason and finish time never change;
- a rejection happens exactly when the request can never fit (lengths < 1, beyond the context,
  beyond the whole KV pool, or beyond the token budget with chunking off);

and inside every iteration (checked by the executor, before the engine advances the requests):
the token budget and max_num_seqs hold, rows are distinct and decodes come first, every row has
its KV slots, preempted requests are not scheduled, and a static batch admits nobody while
members still run.

Liveness: while no request arrives, every request that stays RUNNING gets tokens within
``stall_bound`` steps, and the teardown drains everything within ``drain_bound`` steps (both
derived below), with no iteration that schedules nothing while work remains.

CBBENCH_FUZZ_EXAMPLES sets the number of examples (default 150: ~5 s here, well under 40 s on 2
CI cores; 10,000 under the thorough hypothesis profile); a long campaign needs pytest-timeout off:
``CBBENCH_FUZZ_EXAMPLES=10000 CBBENCH_FUZZ_REPORT=1 pytest -s -o timeout=0
tests/engine/test_engine_state_machine.py`` (CBBENCH_FUZZ_REPORT prints the worst figures seen).
"""

from __future__ import annotations

import dataclasses
import os

from helpers import examples
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cbbench.engine.core.block_manager import cdiv
from cbbench.engine.core.clock import VirtualClock
from cbbench.engine.core.engine import Engine, EngineConfig
from cbbench.engine.core.request import Request, RequestStatus, SamplingParams
from cbbench.engine.core.scheduler import SchedulerConfig
from cbbench.engine.core.scheduler_output import ExecutorOutput, SchedulerOutput
from cbbench.targets.engine import _drain

EXAMPLES = int(os.environ.get("CBBENCH_FUZZ_EXAMPLES", examples(150)))
STEPS_PER_EXAMPLE = int(os.environ.get("CBBENCH_FUZZ_STEPS", "60"))

# Options this machine drives. A new SchedulerConfig / EngineConfig field that is a bool is
# fuzzed automatically; any other new field fails test_every_option_is_fuzzed until it is added.
SCHEDULER_FIELDS = {
    "max_model_len", "batching", "max_num_seqs", "max_num_batched_tokens", "chunked_prefill",
    "preemption_mode", "queue_policy",
}
ENGINE_FIELDS = {
    "scheduler", "num_kv_blocks", "block_size", "kv_allocation", "num_cpu_blocks",
    "enable_prefix_caching",
}
_SCHED_FIELDS = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
_ENGINE_FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}
EXTRA_BOOL_SCHED = sorted(
    n for n, f in _SCHED_FIELDS.items()
    if n not in SCHEDULER_FIELDS and f.type in (bool, "bool")
)
EXTRA_BOOL_ENGINE = sorted(
    n for n, f in _ENGINE_FIELDS.items() if n not in ENGINE_FIELDS and f.type in (bool, "bool")
)

# Prompts share leading tokens so that prefix caching finds hits.
SHARED = [i % 7 for i in range(256)]
EOS = 0
DONE = (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.REJECTED)
WAITING_STATES = {RequestStatus.WAITING, RequestStatus.PREEMPTED}
if hasattr(RequestStatus, "SWAPPED"):
    WAITING_STATES.add(RequestStatus.SWAPPED)


def never_fits(prompt: int, max_tokens: int, cfg: SchedulerConfig, num_blocks: int,
               block_size: int, reserved: bool) -> bool:
    """An independent statement of the rejection rule (engine/core/scheduler.py rejection_reason)."""
    if prompt < 1 or max_tokens < 1:
        return True
    total = prompt + max_tokens
    if total > cfg.max_model_len:
        return True
    # The last output token's KV is never written: paged needs one token fewer than reserved.
    if cdiv(total if reserved else total - 1, block_size) > num_blocks:
        return True
    return not cfg.chunked_prefill and total - 1 > cfg.max_num_batched_tokens


def stall_bound(num_live: int, max_model_len: int, num_preemptions: int) -> int:
    """Steps a RUNNING request may go without tokens while nothing arrives.

    Every iteration schedules at least one token (checked: no empty step while work remains).
    A running request r is skipped only while the budget goes to other requests ahead of it
    (older decodes; any decode or older prefill when r is a prefill; with chunking off, newer
    requests admitted into budget too small for r's whole prompt) or while its KV is short. Each
    other live request can stand ahead of r only until it finishes, which takes it at most
    max_model_len iterations in which it is scheduled (each gives it >= 1 token, and it needs
    at most max_model_len); a preempted request starts over, so each preemption in the window
    adds one more such life. Hence (live requests + preemptions) * max_model_len, plus one."""
    return (num_live + num_preemptions) * max_model_len + 1


def drain_bound(num_live: int, max_model_len: int, num_preemptions: int) -> int:
    """Iterations to finish everything once nothing arrives: each iteration gives >= 1 token to
    some request, each request needs at most max_model_len tokens computed plus outputs
    (prompt + output <= max_model_len, so < 2 * max_model_len iterations each even at one token
    an iteration), and each preemption throws back at most max_model_len computed tokens."""
    return (2 * num_live + num_preemptions) * max_model_len + 1


class _Executor:
    """Checks the iteration against the engine's state (before the engine advances anything),
    then takes 1 ms and returns token ids or None."""

    def __init__(self, machine: EngineMachine, sample_ids: bool) -> None:
        self.m = machine
        self.sample_ids = sample_ids

    def execute(self, so: SchedulerOutput) -> ExecutorOutput:
        self.m.check_iteration(so)
        ids = None
        if self.sample_ids:
            # Deterministic, varied ids; id 0 is EOS for the requests that honour it.
            ids = [(r.request_id * 7 + r.num_output_tokens * 3 + 1) % 11 for r in so.scheduled_reqs]
        return ExecutorOutput(sampled_token_ids=ids, duration_s=1e-3)


class EngineMachine(RuleBasedStateMachine):
    # Worst observed figures across examples, for the report (not asserted).
    observed = {"stall": 0, "stall_bound": 0, "drain": 0, "drain_bound": 0, "preemptions": 0,
                "examples_with_preemption": 0, "swap_out_steps": 0, "swap_in_steps": 0,
                "iterations": 0, "cached_tokens": 0, "finished": 0, "aborted": 0, "rejected": 0,
                "examples": 0}

    @initialize(
        policy=st.sampled_from(["continuous", "static"]),
        chunked=st.booleans(),
        allocation=st.sampled_from(["paged", "reserved"]),
        preemption=st.sampled_from(["recompute", "swap"]),
        queue_policy=st.sampled_from(["fcfs", "priority"]),
        caching=st.booleans(),
        num_cpu_blocks=st.integers(0, 12),
        block_size=st.sampled_from([1, 2, 4, 8, 16]),
        num_blocks=st.integers(1, 24),
        budget=st.integers(1, 64),
        max_num_seqs=st.integers(1, 8),
        max_model_len=st.integers(4, 64),
        sample_ids=st.booleans(),
        extra=st.fixed_dictionaries(
            {n: st.booleans() for n in EXTRA_BOOL_SCHED + EXTRA_BOOL_ENGINE}
        ),
    )
    def setup(self, policy, chunked, allocation, preemption, queue_policy, caching,
              num_cpu_blocks, block_size, num_blocks, budget, max_num_seqs, max_model_len,
              sample_ids, extra):
        self.cfg = SchedulerConfig(
            max_model_len=max_model_len, batching=policy, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget, chunked_prefill=chunked, preemption_mode=preemption,
            queue_policy=queue_policy, **{n: extra[n] for n in EXTRA_BOOL_SCHED},
        )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserved = allocation == "reserved"
        self.caching = caching
        self.engine = Engine(
            EngineConfig(
                self.cfg, self.num_blocks, block_size, allocation,
                num_cpu_blocks=num_cpu_blocks if preemption == "swap" else 0,
                enable_prefix_caching=caching,
                **{n: extra[n] for n in EXTRA_BOOL_ENGINE},
            ),
            _Executor(self, sample_ids),
            VirtualClock(),
        )
        self.sample_ids = sample_ids
        self.reqs: list[Request] = []
        self.ended: dict[int, tuple] = {}  # request_id -> (status, reason, finish_time)
        self.finished_in_steps: dict[int, int] = {}  # request_id -> times seen in step.finished
        self.prev_running: set[int] = set()
        # Liveness over the current window without arrivals.
        self.stall: dict[int, int] = {}
        self.window_live = 0
        self.window_preemptions = 0
        type(self).observed["examples"] += 1

    # ---- helpers ----------------------------------------------------------------------------
    @property
    def sched(self):
        return self.engine.scheduler

    def live(self) -> list[Request]:
        return list(self.sched.running) + list(self.sched.waiting)

    def _reset_window(self) -> None:
        self.stall = {}
        self.window_live = len(self.live())
        self.window_preemptions = 0

    def check_iteration(self, so: SchedulerOutput) -> None:
        cfg = self.cfg
        s = self.sched
        bs = self.block_size
        assert so.total_tokens <= cfg.max_num_batched_tokens, "token budget exceeded"
        assert sum(so.num_scheduled_tokens) == so.total_tokens
        assert so.token_budget == cfg.max_num_batched_tokens
        assert len(so.scheduled_reqs) <= cfg.max_num_seqs, "max_num_seqs exceeded (batch)"
        assert len(s.running) <= cfg.max_num_seqs, "max_num_seqs exceeded (running)"
        assert len({id(r) for r in so.scheduled_reqs}) == len(so.scheduled_reqs), "a row twice"
        running = {id(r) for r in s.running}
        nd = so.num_decode_reqs
        for i, (req, n) in enumerate(zip(so.scheduled_reqs, so.num_scheduled_tokens)):
            assert req.status == RequestStatus.RUNNING and id(req) in running, req
            assert 1 <= n <= req.num_tokens - req.num_computed_tokens, (req, n)
            is_decode = (
                req.num_computed_tokens >= req.num_prompt_tokens
                and req.num_tokens - req.num_computed_tokens == 1
            )
            assert is_decode == (i < nd), ("decodes first", i, nd, req)
            if not cfg.chunked_prefill:
                assert n == req.num_tokens - req.num_computed_tokens, "a chunk with chunking off"
            assert len(req.block_table) * bs >= req.num_computed_tokens + n, "no KV slot"
            if self.reserved:
                assert len(req.block_table) * bs >= req.max_total_tokens, "reservation short"
        scheduled = {id(r) for r in so.scheduled_reqs}
        for req in so.preempted:
            assert id(req) not in scheduled, "a preempted request is scheduled"
            assert req.block_table == [], ("a preempted request keeps GPU blocks", req)
        if cfg.batching == "static" and self.prev_running:
            assert running <= self.prev_running, "static admitted into a running batch"
        self.check_pools()

    def check_pools(self) -> None:
        live = self.live()
        self.engine.block_manager.check_invariants(live)
        cpu = self.engine.cpu_block_manager
        if cpu is not None:
            cpu.check_invariants(live, cpu=True)

    def _record_endings(self, finished: list[Request] = ()) -> None:
        for r in finished:
            assert r.status == RequestStatus.FINISHED, r
            self.finished_in_steps[r.request_id] = self.finished_in_steps.get(r.request_id, 0) + 1
        for r in self.reqs:
            if r.status in DONE:
                now = (r.status, r.finish_reason, r.finish_time)
                before = self.ended.setdefault(r.request_id, now)
                assert before == now, f"request {r.request_id} ended twice: {before} then {now}"
            else:
                assert r.request_id not in self.ended, f"request {r.request_id} came back to life"

    def _one_step(self) -> bool:
        """Run one iteration; returns whether one ran. Tracks stalls of RUNNING requests."""
        before = {
            id(r): (r.num_computed_tokens, r.num_output_tokens) for r in self.sched.running
        }
        out = self.engine.step()
        if out is None:
            assert not self.engine.has_unfinished(), (
                f"stall: nothing scheduled while {self.live()} wait"
            )
            return False
        self.window_preemptions += len(out.scheduled.preempted)
        type(self).observed["preemptions"] += out.record.num_preempted
        if getattr(out.record, "num_swapped_out_blocks", 0):
            type(self).observed["swap_out_steps"] += 1
        if getattr(out.record, "num_swapped_in_blocks", 0):
            type(self).observed["swap_in_steps"] += 1
        type(self).observed["iterations"] += 1
        type(self).observed["cached_tokens"] += getattr(out.record, "num_cached_tokens", 0)
        self._record_endings(out.finished)
        self.prev_running = {id(r) for r in self.sched.running}
        bound = stall_bound(self.window_live, self.cfg.max_model_len, self.window_preemptions)
        for r in self.sched.running:
            key = before.get(id(r))
            if key is None or (r.num_computed_tokens, r.num_output_tokens) > key:
                self.stall[id(r)] = 0
            else:
                self.stall[id(r)] = self.stall.get(id(r), 0) + 1
                type(self).observed["stall"] = max(type(self).observed["stall"], self.stall[id(r)])
                type(self).observed["stall_bound"] = max(type(self).observed["stall_bound"], bound)
                assert self.stall[id(r)] <= bound, (
                    f"livelock: {r!r} got no tokens for {self.stall[id(r)]} steps "
                    f"(bound {bound})"
                )
        return True

    # ---- rules ------------------------------------------------------------------------------
    @rule(
        data=st.data(),
        shared=st.integers(0, 64),
        priority=st.integers(0, 2),
        honour_eos=st.booleans(),
        with_ids=st.booleans(),
    )
    def add(self, data, shared, priority, honour_eos, with_ids):
        self._add(data, shared, priority, honour_eos, with_ids)

    @rule(data=st.data(), k=st.integers(2, 8))
    def burst(self, data, k):
        """Several arrivals at once: what makes requests compete for KV and get preempted."""
        for _ in range(k):
            self._add(
                data, data.draw(st.integers(0, 64)), data.draw(st.integers(0, 2)),
                data.draw(st.booleans()), data.draw(st.booleans()),
            )

    def _add(self, data, shared, priority, honour_eos, with_ids):
        # Mostly lengths that can run (so requests compete for KV and budget and get
        # preempted), sometimes any lengths (most of which can never fit), zero included.
        cap = min(
            self.cfg.max_model_len,
            self.num_blocks * self.block_size + (0 if self.reserved else 1),
            self.cfg.max_num_batched_tokens + 1 if not self.cfg.chunked_prefill else 1 << 30,
        )
        if cap >= 2 and data.draw(st.integers(0, 4)):
            # Half of them near the largest that fits: a few of those fill the pool.
            low = max(2, cap // 2) if data.draw(st.booleans()) else 2
            total = data.draw(st.integers(low, cap))
            prompt = data.draw(st.integers(1, total - 1))
            out = total - prompt
        else:
            prompt = data.draw(st.integers(0, 2 * self.cfg.max_model_len))
            out = data.draw(st.integers(0, self.cfg.max_model_len))
        i = len(self.reqs)
        ids = None
        if self.caching or with_ids:
            k = min(shared, prompt)
            ids = SHARED[:k] + [100 + i] * (prompt - k)
        req = Request(
            i, prompt, out, arrival_time=self.engine.clock.now(), prompt_token_ids=ids,
            sampling=SamplingParams(ignore_eos=not honour_eos), priority=priority,
            eos_token_ids=(EOS,),
        )
        self.reqs.append(req)
        expected = never_fits(prompt, out, self.cfg, self.num_blocks, self.block_size,
                              self.reserved)
        reason = self.engine.add_request(req)
        assert (reason is not None) == expected, (prompt, out, reason)
        if reason is not None:
            assert isinstance(reason, str) and reason and req.finish_reason == reason
            assert req.status == RequestStatus.REJECTED and req.block_table == []
            assert req not in self.sched.running and req not in self.sched.waiting
            assert self.engine.rejected.count(req) == 1
        else:
            assert req.status == RequestStatus.WAITING and req in self.sched.waiting
        self._record_endings()
        self._reset_window()  # new work arrived

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def abort(self, data):
        # Any request, live or ended: aborting an ended one must change nothing.
        req = data.draw(st.sampled_from(self.reqs))
        was_done = req.status in DONE
        snapshot = (req.status, req.finish_reason, req.finish_time)
        free_before = self.engine.block_manager.num_free_blocks
        self.engine.abort_request(req)
        if was_done:
            assert (req.status, req.finish_reason, req.finish_time) == snapshot
            assert self.engine.block_manager.num_free_blocks == free_before
        else:
            assert req.status == RequestStatus.ABORTED and req.block_table == []
            assert req not in self.sched.running and req not in self.sched.waiting
        self.prev_running = {id(r) for r in self.sched.running}
        self._record_endings()

    @rule()
    def step(self):
        self._one_step()

    @rule(n=st.integers(2, 40))
    def steps(self, n):
        for _ in range(n):
            if not self._one_step():
                break

    @rule(roll=st.integers(0, 7))
    def interrupt(self, roll):
        """The first Ctrl-C with no grace left: everything live is aborted (engine_target).
        Rare (1 in 8), so that most examples build up load."""
        if roll:
            return
        live = self.live()
        _drain(self.engine, grace_s=0.0)
        assert not self.engine.has_unfinished()
        for r in live:
            assert r.status == RequestStatus.ABORTED and r.block_table == [], r
        self.prev_running = set()
        self._record_endings()

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        if not hasattr(self, "engine"):
            return
        self.check_pools()
        running, waiting = list(self.sched.running), list(self.sched.waiting)
        assert len(running) <= self.cfg.max_num_seqs
        ids = [id(r) for r in running + waiting]
        assert len(ids) == len(set(ids)), "a request is queued twice"
        for r in running:
            assert r.status == RequestStatus.RUNNING, r
        for r in waiting:
            assert r.status in WAITING_STATES, r
            assert r.block_table == [], ("a waiting request holds GPU blocks", r)
            if r.status == RequestStatus.PREEMPTED:
                assert r.num_computed_tokens == 0, r
        queued = set(ids)
        for r in self.reqs:
            assert 0 <= r.num_output_tokens <= max(r.max_tokens, 0), r
            assert r.num_computed_tokens <= r.num_tokens, r
            if r.status in DONE:
                assert id(r) not in queued, f"ended request still queued: {r!r}"
                assert r.block_table == [], f"ended request holds blocks: {r!r}"
                assert not getattr(r, "cpu_block_table", []), f"ended request holds CPU blocks: {r!r}"
                assert r.finish_reason, r
            else:
                assert id(r) in queued, f"live request lost by the scheduler: {r!r}"
            if r.status == RequestStatus.FINISHED:
                assert self.finished_in_steps.get(r.request_id) == 1, r
                if r.finish_reason == "length":
                    assert r.num_output_tokens == r.max_tokens, r
                else:
                    assert r.finish_reason == "stop" and not r.sampling.ignore_eos, r
                    assert r.output_token_ids and r.output_token_ids[-1] == EOS, r
            else:
                assert r.request_id not in self.finished_in_steps, r

    # ---- teardown: drain everything -----------------------------------------------------------
    def teardown(self):
        if not hasattr(self, "engine"):
            return
        self._reset_window()
        bound = drain_bound(len(self.live()), self.cfg.max_model_len, 0)
        n = 0
        while self.engine.has_unfinished():
            assert self._one_step(), "stall while draining"
            n += 1
            bound = drain_bound(self.window_live, self.cfg.max_model_len, self.window_preemptions)
            assert n <= bound, f"drain did not finish in {bound} iterations: {self.live()}"
        obs = type(self).observed
        obs["drain"] = max(obs["drain"], n)
        obs["examples_with_preemption"] += any(r.num_preemptions for r in self.reqs)
        obs["drain_bound"] = max(obs["drain_bound"], bound)
        self.consistent()
        for r in self.reqs:
            assert r.status in DONE, f"never ended: {r!r}"
            obs[r.status.name.lower()] += 1
        assert self.engine.block_manager.num_free_blocks == self.num_blocks
        cpu = self.engine.cpu_block_manager
        if cpu is not None:
            assert cpu.num_free_blocks == cpu.num_blocks


TestEngineStateMachine = EngineMachine.TestCase
TestEngineStateMachine.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS_PER_EXAMPLE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
    # No explain phase: hypothesis 6.170 crashes in it on some stateful failures.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


def test_every_option_is_fuzzed():
    """A new scheduler or engine option must be driven by the machine above: bools are picked
    up automatically, anything else has to be added by hand."""
    missing = sorted(
        {n for n in _SCHED_FIELDS if n not in SCHEDULER_FIELDS and n not in EXTRA_BOOL_SCHED}
        | {n for n in _ENGINE_FIELDS if n not in ENGINE_FIELDS and n not in EXTRA_BOOL_ENGINE}
    )
    assert not missing, f"options the engine state machine does not fuzz yet: {missing}"


def teardown_module(module):
    if os.environ.get("CBBENCH_FUZZ_REPORT"):
        print("\nengine state machine, worst figures:", EngineMachine.observed)
