"""Multi-turn sessions on the in-process engine: the JSONL schema, the growing prompts (turn
k + 1 starts with turn k's prompt and reply), closed-loop turns with think times, open-loop
sessions, prefix-cache hits computed by hand, by-turn and per-session metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import invoke_app, run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs
from cbbench.errors import UsageError
from cbbench.load.delays import parse_delay
from cbbench.load.session_plan import SessionPlan
from cbbench.load.sessions import Session, Turn, first_prompt_len, next_prompt_len, prompt_lens
from cbbench.load.workload import load_workload
from cbbench.schema.run import RunResult

SIM = dict(engine="sim", gpu="h200", model="llama-3-8b")
BLOCK = 16


def _write(tmp_path: Path, sessions: list[dict], name: str = "s.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return path


def _run(path_or_name: str, **kw) -> RunResult:
    engine = EngineArgs(**{**SIM, **kw.pop("engine", {})})
    spec = run_spec(workload=str(path_or_name), engine=engine, **kw)
    return execute_run(spec)


THREE_TURNS = {"session_id": "alice", "turns": [
    {"user_len": 40, "output_len": 30},
    {"user_len": 25, "output_len": 50, "think_time_ms": 500},
    {"user_len": 60, "output_len": 20, "think_time_ms": 1500},
]}


# ---- the schema ------------------------------------------------------------------------------
def test_jsonl_sessions_parse(tmp_path):
    path = _write(tmp_path, [THREE_TURNS, {"turns": [{"user": "hello there", "output_len": 4}]}])
    w = load_workload(str(path))
    assert w.is_sessions and w.requests == [] and len(w.sessions) == 2
    a, b = w.sessions
    assert a.name == "alice" and [t.user_len for t in a.turns] == [40, 25, 60]
    assert [t.think_time_s for t in a.turns] == [None, 0.5, 1.5]
    assert b.name is None and b.turns[0].user_text == "hello there"


@pytest.mark.parametrize("bad,match", [
    ({"turns": []}, "'turns' must be a non-empty list"),
    ({"turns": [{"user_len": 3}]}, "missing 'output_len'"),
    ({"turns": [{"output_len": 3}]}, "needs one of"),
    ({"turns": [{"user_len": 3, "output_len": 3, "temperature": 1}]}, "unknown turn field"),
    ({"turns": [{"user_len": 3, "output_len": 3, "think_time_ms": -1}]}, "think_time_ms"),
    ({"turns": [{"user_len": 3, "output_len": 3}], "extra": 1}, "unknown session field"),
])
def test_bad_sessions_are_usage_errors(tmp_path, bad, match):
    with pytest.raises(UsageError, match=match):
        load_workload(str(_write(tmp_path, [bad])))


def test_requests_and_sessions_do_not_mix(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"prompt_len": 5, "output_len": 2}) + "\n"
                    + json.dumps(THREE_TURNS) + "\n")
    res = invoke_app(["run", "--engine", "sim", "--workload", str(path),
                      "--output", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "either requests or sessions" in res.output


def test_template_lengths():
    # BOS + header(4) + user + eot + assistant header(4)
    assert first_prompt_len(40) == 50
    # previous prompt + reply + eot + header + user + eot + assistant header
    assert next_prompt_len(50, 30, 25) == 50 + 30 + 1 + 4 + 25 + 1 + 4
    s = Session(0, (Turn(40, 30), Turn(25, 50), Turn(60, 20)))
    assert prompt_lens(s) == [50, 115, 235]


def test_prompt_ids_grow_by_prefix():
    plan = SessionPlan([Session(0, (Turn(40, 30), Turn(25, 50)))], np.zeros(1))
    p1 = plan.first_prompt_ids(0, 1000)
    reply = plan.reply_ids(0, 0, 1000)
    p2 = plan.next_prompt_ids(p1, reply, 0, 1, 1000)
    assert len(p1) == 50 and len(reply) == 30 and len(p2) == next_prompt_len(50, 30, 25)
    assert p2[:80] == p1 + reply



LLAMA31 = next((p / "llama-3.1" for p in (Path(__file__).resolve().parents[n] / "shared" / "tokenizers"
                                           for n in (3, 4)) if (p / "llama-3.1").is_dir()), None)


def _template_len(messages: list[dict]) -> int:
    """Hugging Face's apply_chat_template(..., add_generation_prompt=True) length with the
    Llama-3.1 tokenizer: what a chat server prefills."""
    from tokenizers import Tokenizer

    from cbbench.load.chat_template import load_chat_template

    assert LLAMA31 is not None
    template = load_chat_template(str(LLAMA31))
    assert template is not None
    text = template.render(messages)
    return len(Tokenizer.from_file(str(LLAMA31 / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids)


@pytest.mark.skipif(LLAMA31 is None, reason="the Llama-3.1 tokenizer is not at shared/tokenizers")
@pytest.mark.parametrize("reply, reason", [
    ([40, 41, 300], "stop"), ([40, 41], "length"),
    ([40, 41, 300], "length"),  # the EOS sampled as the max_tokens-th token: still not text
])
def test_a_reply_ended_by_eos_is_not_sent_back_twice(reply, reason):
    """Turn 2 on the torch engine holds turn 1's reply and ONE end-of-turn tag, as a chat server
    prefills it: the EOS that ended a reply is not content (the server returns the text before
    it; the template writes <|eot_id|>). It was prefilled as EOS + end tag, one token over."""
    from cbbench.engine.core.request import Request, RequestStatus, SamplingParams
    from cbbench.targets.engine_feed import SessionFeed

    user1, content, user2 = "hello there", "hi friend", "and in French?"  # 2, 2, 4 tokens
    truth = _template_len([{"role": "user", "content": user1},
                           {"role": "assistant", "content": content},
                           {"role": "user", "content": user2}])
    plan = SessionPlan([Session(0, (Turn(2, len(reply)), Turn(4, 5)))], np.zeros(1),
                       think_time=parse_delay("0", "--think-time"))
    feed = SessionFeed(plan, lambda rid, p, o, t, ids: Request(
        rid, p, o, t, ids, SamplingParams(ignore_eos=False), eos_token_ids=(300,)),
        keep_ids=True, scripted_replies=False, vocab=512)
    first = feed.created[0]
    assert first.num_prompt_tokens == _template_len([{"role": "user", "content": user1}])
    first.output_token_ids, first.num_output_tokens = list(reply), len(reply)
    first.status, first.finish_time, first.finish_reason = RequestStatus.FINISHED, 1.0, reason
    feed.finished(first)
    second = feed.created[1]
    assert second.num_prompt_tokens == len(second.prompt_token_ids) == truth
    # What turn 1 computed (its prompt and the reply's content) is turn 2's prefix.
    assert second.prompt_token_ids[:first.num_prompt_tokens + 2] == first.prompt_token_ids + [40, 41]

@pytest.mark.skipif(LLAMA31 is None, reason="the Llama-3.1 tokenizer is not at shared/tokenizers")
def test_a_turns_text_is_counted_as_the_template_trims_it(tmp_path):
    """Llama-3's template writes each message's ``content | trim``: a user text's surrounding
    spaces and newlines are not prefilled. They were counted: turn 1 read 14 tokens where
    apply_chat_template gives 12, turn 2 32 for 28."""
    from tokenizers import Tokenizer

    from cbbench.load.prompts import count_tokens

    assert LLAMA31 is not None
    tok = Tokenizer.from_file(str(LLAMA31 / "tokenizer.json"))
    users, reply = ["  hello there \n\n", "\n and in French?  "], "Bonjour."
    reply_len = count_tokens(tok, reply)
    path = _write(tmp_path, [{"turns": [{"user": u, "output_len": reply_len} for u in users]}])
    (session,) = load_workload(str(path), lambda t: count_tokens(tok, t)).sessions or []
    history = [{"role": "user", "content": users[0]}]
    truth = [_template_len(history)]
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": users[1]}]
    truth.append(_template_len(history))
    assert prompt_lens(session) == truth == [12, 28]
    assert session.turns[0].user_text == users[0]  # sent as written: the server trims it


# ---- on the engine ----------------------------------------------------------------------------
def test_turns_follow_finish_plus_think_time(tmp_path):
    result = _run(_write(tmp_path, [THREE_TURNS]), num_requests=None)
    reqs = sorted(result.requests, key=lambda r: r.turn)
    assert [r.turn for r in reqs] == [1, 2, 3]
    assert {r.session_id for r in reqs} == {"alice"}
    assert [r.prompt_tokens for r in reqs] == [50, 115, 235]
    assert [r.output_tokens for r in reqs] == [30, 50, 20]
    detailed = _run(_write(tmp_path, [THREE_TURNS]), num_requests=None, save_detailed=True)
    reqs = sorted(detailed.requests, key=lambda r: r.turn)
    for prev, nxt, think in zip(reqs, reqs[1:], (0.5, 1.5)):
        # Closed loop: the next turn is intended a think time after the reply's last token.
        assert nxt.intended_start_s == pytest.approx(prev.token_times_s[-1] + think)
    s = detailed.summary
    assert [t.turn for t in s.by_turn] == [1, 2, 3]
    assert all(t.completed == 1 and t.ttft_ms.count == 1 for t in s.by_turn)
    assert s.by_turn[1].ttft_ms.p50 == pytest.approx(reqs[1].ttft_ms)
    ses = s.sessions
    assert (ses.count, ses.completed, ses.turns_planned, ses.turns_sent) == (1, 1, 3, 3)
    assert ses.duration_s.p50 == pytest.approx(reqs[2].token_times_s[-1])


def test_prefix_cache_hits_what_the_previous_turn_computed(tmp_path):
    """Turn k + 1 finds every full block of turn k's prompt and reply: turn k computed
    prompt + reply - 1 tokens (the last sampled token never is), all with known ids."""
    result = _run(_write(tmp_path, [THREE_TURNS]), num_requests=None,
                  engine={"enable_prefix_caching": True, "block_size": BLOCK})
    computed = [50 + 30 - 1, 115 + 50 - 1]
    expected = sum(BLOCK * (c // BLOCK) for c in computed)
    assert result.summary.engine.prefix_cache_hit_tokens == expected


def test_torch_engine_feeds_its_own_replies_back(tmp_path):
    """On the torch engine the history is the model's real output: the next turn still finds
    it all cached."""
    session = {"turns": [{"user_len": 20, "output_len": 12},
                         {"user_len": 9, "output_len": 5, "think_time_ms": 0}]}
    result = _run(_write(tmp_path, [session]), num_requests=None,
                  engine={"engine": "torch", "device": "cpu", "model": "tiny", "gpu": None,
                          "enable_prefix_caching": True, "block_size": BLOCK})
    assert result.summary.completed == 2
    assert result.summary.engine.prefix_cache_hit_tokens == BLOCK * ((30 + 12 - 1) // BLOCK)


def test_sessions_arrive_open_loop(tmp_path):
    sessions = [{"turns": [{"user_len": 10, "output_len": 5}, {"user_len": 10, "output_len": 5}]}
                for _ in range(4)]
    result = _run(_write(tmp_path, sessions), num_requests=None, request_rate=2.0,
                  arrival="constant", think_time="0")
    firsts = sorted(r.intended_start_s for r in result.requests if r.turn == 1)
    assert firsts == pytest.approx([0.0, 0.5, 1.0, 1.5])
    assert result.config.sessions == {"sessions": 4, "turns": 8, "think_time": "0"}
    assert result.config.num_requests == 4


def test_a_rejected_turn_ends_its_session(tmp_path):
    long = {"turns": [{"user_len": 10, "output_len": 5}, {"user_len": 9000, "output_len": 5},
                      {"user_len": 10, "output_len": 5}]}
    ok = {"turns": [{"user_len": 10, "output_len": 5}]}
    result = _run(_write(tmp_path, [long, ok]), num_requests=None)
    s = result.summary
    assert (s.completed, s.failed, s.not_sent) == (2, 1, 1)
    assert s.sessions.ended_early == 1 and s.sessions.completed == 1


def test_think_time_draws_are_seeded_per_turn():
    plan = SessionPlan([Session(0, (Turn(1, 1),) * 3)], np.zeros(1), parse_delay("exp:800", ""),
                       seed=3)
    again = SessionPlan(plan.sessions, np.zeros(1), parse_delay("exp:800", ""), seed=3)
    assert plan.think_time_s(0, 2) == again.think_time_s(0, 2) != plan.think_time_s(0, 1)


def test_builtin_multiturn_draws_sessions(tmp_path):
    result = _run("sharegpt-multiturn", num_requests=20, request_rate=1.0,
                  engine={"enable_prefix_caching": True})
    s = result.summary
    assert s.sessions.count == 20 and s.failed == 0
    assert s.completed == s.sessions.turns_planned > 20
    assert s.by_turn[0].turn == 1 and s.by_turn[0].completed == 20
    assert s.engine.prefix_cache_hit_rate > 0.5


@pytest.mark.parametrize("args,match", [
    (["--workload", "sharegpt", "--think-time", "100"], "--think-time applies to multi-turn"),
    (["--workload", "sharegpt-multiturn", "--think-time", "soon"], "invalid --think-time"),
    (["--workload", "sharegpt-multiturn", "--think-time", "exp:-5"], "invalid --think-time"),
])
def test_think_time_errors(tmp_path, args, match):
    res = invoke_app(["run", "--engine", "sim", "--num-requests", "2", *args,
                      "--output", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and match in res.output
    assert len(res.output.strip().splitlines()) == 1
