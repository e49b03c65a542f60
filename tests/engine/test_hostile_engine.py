"""Hostile values inside the engine (issue 19): one request's sampling values, or an exception
raised while one batch runs, must fail that request at most, never the engine.

- Sampling values a float32 sampler cannot use are normalized where a request is made
  (SamplingParams): a top-k beyond any vocabulary is off, a temperature or top-p below
  SAMPLING_EPS is greedy (vLLM's rule), a seed of any size is folded into 63 bits.
- An exception raised by the executor fails the requests of that step (the engine cannot tell
  which one caused it), frees their KV, and the engine goes on with the rest: in the CLI's
  loop (engine/core/feed.py), the in-process target, and the server's engine thread.
"""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import sim_options, start_server

from cbbench.engine.core.request import Request, RequestStatus, SamplingParams

HUGE_TOP_K = 2**63  # does not fit an int64: "Overflow when unpacking long long"
POISON = 7  # a prompt starting with this token id makes the poisoned executor raise


# ---- sampling values ---------------------------------------------------------------------------
def _sample(params: SamplingParams, vocab: int = 32, seed: int = 0) -> tuple[int, int]:
    """(sampled token, argmax) for one request's row of random logits."""
    torch = pytest.importorskip("torch")
    from cbbench.engine.torch.sampler import Sampler

    torch.manual_seed(seed)
    logits = torch.randn(1, vocab) * 3
    req = Request(0, 3, 4, prompt_token_ids=[1, 2, 3], sampling=params)
    token = int(Sampler()(logits, [req])[0])
    return token, int(logits.argmax())


@pytest.mark.parametrize("top_k", [HUGE_TOP_K, 2**64 + 5, 10**30])
def test_a_top_k_beyond_int64_with_top_p_samples_a_token(top_k):
    token, _ = _sample(SamplingParams(temperature=1.0, top_p=0.5, top_k=top_k))
    assert 0 <= token < 32


@pytest.mark.parametrize("seed", [2**63, 2**100, -(2**70)])
def test_a_seed_of_any_size_samples_a_token(seed):
    token, _ = _sample(SamplingParams(temperature=1.0, top_p=0.9, seed=seed))
    assert 0 <= token < 32


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1e-46),  # float32 0: logits / 0
        SamplingParams(temperature=1e-39),  # float32 subnormal: logits / t overflows to inf
        SamplingParams(temperature=1.0, top_p=1e-46),  # float32 0: every token dropped
        SamplingParams(temperature=1.0, top_p=1e-46, top_k=5),
    ],
    ids=["temperature-underflows", "temperature-subnormal", "top-p-underflows", "top-p-top-k"],
)
def test_tiny_temperature_or_top_p_is_greedy(params):
    for seed in range(5):  # token 0 every time was the old symptom: vary the logits
        token, best = _sample(params, seed=seed)
        assert token == best


def test_sampling_params_normalize_what_a_sampler_cannot_use():
    assert SamplingParams(temperature=1e-46).greedy
    assert SamplingParams(temperature=1.0, top_p=1e-9).greedy
    assert SamplingParams(temperature=1.0, top_k=HUGE_TOP_K).top_k == 0  # beyond any vocab: off
    assert 0 <= SamplingParams(seed=2**100).seed < 2**63
    # Ordinary values are left alone.
    p = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, seed=3)
    assert (p.temperature, p.top_p, p.top_k, p.seed) == (0.7, 0.9, 50, 3)


def test_cli_run_with_a_huge_top_k_completes(tmp_path):
    """`run --engine torch --top-k 9223372036854775808 --top-p 0.5` was a traceback."""
    pytest.importorskip("torch")
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    w = tmp_path / "w.jsonl"
    w.write_text("".join(json.dumps({"prompt_len": 6, "output_len": 3}) + "\n" for _ in range(2)))
    opts = EngineArgs(engine="torch", device="cpu", model="tiny", num_kv_blocks=32,
                      temperature=1.0, top_p=0.5, top_k=HUGE_TOP_K).validate()
    result = execute_run(run_spec(workload=str(w), num_requests=2, engine=opts))
    assert result.summary.completed == 2 and result.summary.failed == 0


# ---- an exception in one step fails that step's requests, not the engine -----------------------
class PoisonedExecutor:
    """Wraps an executor; raises when a scheduled request's prompt starts with POISON, or its
    id is one of ``ids``."""

    def __init__(self, inner, ids=()) -> None:
        self.inner = inner
        self.ids = set(ids)
        self.raised = 0

    def execute(self, sched):
        for req in sched.scheduled_reqs:
            ids = req.prompt_token_ids
            if (ids and ids[0] == POISON) or req.request_id in self.ids:
                self.raised += 1
                raise ValueError("Overflow when unpacking long long")
        return self.inner.execute(sched)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _sim_engine(ids=(), **kw):
    from cbbench.engine.build import build_engine

    engine, info = build_engine(sim_options(**kw))
    engine.executor = PoisonedExecutor(engine.executor, ids)
    return engine, info


def test_a_step_that_raises_fails_its_requests_and_the_engine_goes_on():
    from cbbench.engine.core.engine import StepFailed

    engine, _ = _sim_engine(max_num_seqs=1)  # one request per step: the poison runs alone
    poison = Request(0, 3, 4, prompt_token_ids=[POISON, 1, 2])
    good = [Request(i, 3, 4, prompt_token_ids=[1, 2, 3]) for i in (1, 2)]
    for r in (poison, *good):
        assert engine.add_request(r) is None
    with pytest.raises(StepFailed) as err:
        while engine.has_unfinished():
            engine.step()
    assert err.value.requests == [poison]
    assert poison.status == RequestStatus.FAILED and poison.status.is_done
    assert "Overflow" in poison.finish_reason
    while engine.has_unfinished():  # the rest are served
        engine.step()
    assert all(r.status == RequestStatus.FINISHED and r.num_output_tokens == 4 for r in good)
    assert engine.block_manager.num_used_blocks == 0  # the failed request's KV came back


def test_run_feed_goes_on_after_a_failed_step():
    from cbbench.engine.core.feed import ListFeed, run_feed

    engine, _ = _sim_engine()
    reqs = [Request(i, 3, 4, arrival_time=0.01 * i,
                    prompt_token_ids=[POISON if i == 2 else 1, 2, 3]) for i in range(5)]
    failures = []
    assert run_feed(engine, ListFeed(reqs), on_step_failed=failures.append)
    assert [r.status for r in reqs].count(RequestStatus.FAILED) >= 1
    assert reqs[2].status == RequestStatus.FAILED
    assert reqs[4].status == RequestStatus.FINISHED  # arrived after the failure: served
    assert len(failures) >= 1 and engine.block_manager.num_used_blocks == 0


def test_in_process_run_records_the_failed_requests_and_finishes(tmp_path, monkeypatch, notices):
    """The CLI's in-process target: the failed request is an `engine_error`, the rest of the
    run completes and the result is whole."""
    from helpers import run_spec

    import cbbench.targets.engine as target
    from cbbench.bench.runner import execute_run

    monkeypatch.setattr(target, "build_engine", lambda opts: _sim_engine(ids={1}))
    w = tmp_path / "w.jsonl"
    lines = [{"prompt_len": 3, "output_len": 3, "arrival_s": 0.05 * i} for i in range(4)]
    w.write_text("".join(json.dumps(x) + "\n" for x in lines))
    notes = notices  # the logged notices (conftest)
    spec = run_spec(workload=str(w), num_requests=4, engine=sim_options())
    result = execute_run(spec)
    s = result.summary
    assert s.error_types == {"engine_error": 1}
    assert s.completed == 3
    bad = next(r for r in result.requests if r.id == 1)
    assert "Overflow" in bad.error
    assert any("engine step failed" in n for n in notes)


def test_serve_fails_the_poisoned_request_and_keeps_serving():
    from cbbench.cli.serve import build_serving_engine

    def build():
        engine, info = build_serving_engine(sim_options())
        engine.executor = PoisonedExecutor(engine.executor)
        return engine, info

    run = start_server(build)
    try:
        with httpx.Client(base_url=run.url, timeout=20.0) as c:
            r = c.post("/v1/completions", json={"prompt": [POISON, 1, 2], "max_tokens": 3})
            assert r.status_code == 500, r.text
            assert "Overflow" in r.json()["error"]["message"]
            r = c.post("/v1/completions",
                       json={"prompt": [POISON, 1, 2], "max_tokens": 3, "stream": True})
            assert r.status_code == 200 and "Overflow" in r.text and "[DONE]" in r.text
            assert c.get("/health").status_code == 200
            r = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3
        assert run.engine.snapshot().kv_blocks_used == 0
    finally:
        run.stop()


def test_serve_survives_an_exception_admitting_one_request():
    """Found in this round: the engine thread took requests in with a bare add_request; an
    exception there (one request's values) ended the thread, every later request 503."""
    from cbbench.cli.serve import build_serving_engine

    def build():
        engine, info = build_serving_engine(sim_options())
        reason = engine.scheduler.rejection_reason

        def picky(req):
            if req.prompt_token_ids and req.prompt_token_ids[0] == POISON:
                raise OverflowError("int too large to convert")
            return reason(req)

        engine.scheduler.rejection_reason = picky
        return engine, info

    run = start_server(build)
    try:
        with httpx.Client(base_url=run.url, timeout=20.0) as c:
            r = c.post("/v1/completions", json={"prompt": [POISON, 1, 2], "max_tokens": 3})
            assert r.status_code == 500 and "int too large" in r.json()["error"]["message"]
            assert c.get("/health").status_code == 200
            r = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3})
            assert r.status_code == 200, r.text
    finally:
        run.stop()


def test_an_exception_admitting_one_request_fails_it_in_the_cli_too(tmp_path, monkeypatch):
    """The engine itself fails the request it could not take, so every loop (run_feed, session
    feeds, the server) goes on."""
    from helpers import run_spec

    import cbbench.targets.engine as target
    from cbbench.bench.runner import execute_run

    def build(opts):
        engine, info = _sim_engine()
        reason = engine.scheduler.rejection_reason

        def picky(req):
            if req.request_id == 2:
                raise OverflowError("int too large to convert")
            return reason(req)

        engine.scheduler.rejection_reason = picky
        return engine, info

    monkeypatch.setattr(target, "build_engine", build)
    w = tmp_path / "w.jsonl"
    w.write_text("".join(json.dumps({"prompt_len": 3, "output_len": 2}) + "\n" for _ in range(4)))
    result = execute_run(run_spec(workload=str(w), num_requests=4, engine=sim_options()))
    s = result.summary
    assert s.completed == 3 and s.error_types == {"engine_error": 1}
