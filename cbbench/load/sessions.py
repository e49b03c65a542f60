"""Multi-turn sessions: one user's conversation, sent one turn at a time.

Turn k sends the whole history (every earlier user message and reply) plus the new user
message; turn k + 1 is sent only after turn k's reply has finished, plus a think time. Sessions
arrive open-loop (their first turns follow the arrival process); the turns within a session
are closed-loop, as a person at a chat window is.

Lengths count content tokens; a chat server wraps every message in its template. The engine
target models Llama-3's template (what a vLLM server running Llama-3 would prefill):

    <|begin_of_text|>
    <|start_header_id|>user<|end_header_id|>\\n\\n {user_1} <|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\\n\\n {reply_1} <|eot_id|>
    ...
    <|start_header_id|>user<|end_header_id|>\\n\\n {user_k} <|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\\n\\n          <- turn k's prompt ends here

so turn k + 1's prompt is turn k's prompt, then turn k's reply, then the new message: its
prefix is exactly what turn k computed, and a prefix cache can reuse it.

User sessions come from JSONL, one session per line:

    {"session_id": "u1", "arrival_s": 0.0, "turns": [
        {"user_len": 120, "output_len": 80},
        {"user": "and in French?", "output_len": 60, "think_time_ms": 4000}]}

A turn's user message is one of ``user`` (text), ``user_token_ids`` or ``user_len``;
``output_len`` is required; ``think_time_ms`` (the wait before this turn) overrides
``--think-time``. ``session_id`` and ``arrival_s`` are optional.

Agent sessions (docs/streaming.md): a session's ``tools`` are offered on every turn; a turn's
``tool_choice`` asks the model for a call; the next turn may then be a tool turn,
``{"tool_result_len": N, "tool_time_ms": T, "output_len": M}``: after the tool's latency T it
sends the assistant's tool call and a ``role: tool`` result of N tokens. A tool turn without
tools, or after a turn that asked for no call, is refused. A turn's ``fan_out`` starts the
session's named ``subagents`` in parallel, and the agent's next turn waits for them all: the
session is then a DAG (load/session_dag.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import TypeVar

import numpy as np

from cbbench.errors import UsageError
from cbbench.load.delays import MAX_DELAY_MS
from cbbench.load.jsonl import json_ids, json_int, json_number, json_object
from cbbench.load.output_kinds import check_tools
from cbbench.load.session_dag import TurnNode, build_nodes, order_subagents

# ---- Llama-3's chat template, in tokens -------------------------------------------------------
BOS_TOKENS = 1  # <|begin_of_text|>
MESSAGE_HEADER_TOKENS = 4  # <|start_header_id|> role <|end_header_id|> "\n\n"
MESSAGE_END_TOKENS = 1  # <|eot_id|>
GENERATION_PROMPT_TOKENS = MESSAGE_HEADER_TOKENS  # the assistant header that asks for a reply

SESSION_FIELDS = {"session_id", "arrival_s", "turns", "tools", "subagents"}
TURN_FIELDS = {
    "user", "user_token_ids", "user_len", "output_len", "think_time_ms", "tool_choice",
    "tool_result_len", "tool_time_ms", "fan_out",
}
USER_TURN = "user"
TOOL_TURN = "tool"
MS = 1000.0

MULTITURN_CSV = "sharegpt_multiturn.csv"


@dataclass(frozen=True, slots=True)
class Turn:
    user_len: int  # content tokens of the new user message
    output_len: int  # content tokens of the reply
    user_text: str | None = None
    user_token_ids: tuple[int, ...] | None = None
    think_time_s: float | None = None  # wait after the previous reply; None: --think-time
    # Agent sessions (issue 24): a "tool" turn sends the previous reply's tool call and a
    # role-tool result of user_len tokens after the tool's latency (think_time_s); a turn's
    # tool_choice asks the model for a call (None: the session's tools are offered with
    # tool_choice "none", or not at all).
    kind: str = USER_TURN
    tool_choice: str | dict | None = None
    # The sub-agents (1-based: the session's subagents[a - 1]) started when this turn's reply
    # finished; the agent's next turn waits for them all (load/session_dag.py).
    fan_out: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SubAgent:
    name: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Session:
    id: int  # 0-based index in the workload
    turns: tuple[Turn, ...]  # the main agent's
    arrival_s: float | None = None
    name: str | None = None  # the file's session_id, when it gives one
    tools: tuple[dict, ...] | None = None  # OpenAI tool definitions every turn offers
    subagents: tuple[SubAgent, ...] = ()  # in the order the fan-outs reach them
    # Every turn, flat (the main agent's, then each sub-agent's), and the DAG over them.
    all_turns: tuple[Turn, ...] = field(default=(), init=False, compare=False, repr=False)
    nodes: tuple[TurnNode, ...] = field(default=(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        agents = [self.turns, *(a.turns for a in self.subagents)]
        object.__setattr__(self, "all_turns", tuple(t for turns in agents for t in turns))
        fan = [[t.fan_out for t in turns] for turns in agents]
        object.__setattr__(self, "nodes", build_nodes(agents, fan))

    @property
    def session_id(self) -> int | str:
        return self.name if self.name is not None else self.id

    @property
    def num_turns(self) -> int:
        return len(self.all_turns)

    def agent_name(self, k: int) -> str | None:
        """The sub-agent flat turn k belongs to; None: the main agent."""
        a = self.nodes[k].agent
        return self.subagents[a - 1].name if a else None


def first_prompt_len(user_len: int) -> int:
    """Turn 1's prompt: BOS, the user message in its template, the generation prompt."""
    return BOS_TOKENS + MESSAGE_HEADER_TOKENS + user_len + MESSAGE_END_TOKENS + (
        GENERATION_PROMPT_TOKENS
    )


def next_prompt_len(prev_prompt_len: int, reply_len: int, user_len: int) -> int:
    """Turn k + 1's prompt from turn k's: its reply (and end tag), then the new message."""
    return (
        prev_prompt_len + reply_len + MESSAGE_END_TOKENS
        + MESSAGE_HEADER_TOKENS + user_len + MESSAGE_END_TOKENS + GENERATION_PROMPT_TOKENS
    )


def prompt_lens(session: Session) -> list[int]:
    """Each turn's prompt length (flat order) when every earlier reply ran to its full length:
    a first turn (of the main agent or a sub-agent) starts a history, a later one extends its
    agent's previous turn."""
    out: list[int] = []
    turns = session.all_turns
    for t, node in zip(turns, session.nodes):
        if node.prev is None:
            out.append(first_prompt_len(t.user_len))
        else:
            out.append(next_prompt_len(out[node.prev], turns[node.prev].output_len, t.user_len))
    return out


# ---- the built-in sharegpt-multiturn ---------------------------------------------------------
def parse_multiturn_csv(text: str) -> list[Session]:
    """Rows of alternating (user_len, output_len) pairs, one conversation per row, after a
    header line. Built by workloads/build_sharegpt_multiturn.py."""
    sessions: list[Session] = []
    for line in text.splitlines()[1:]:
        if not line.strip():
            continue
        nums = [int(x) for x in line.split(",")]
        turns = tuple(Turn(u, a) for u, a in zip(nums[::2], nums[1::2]))
        sessions.append(Session(len(sessions), turns))
    return sessions


def sharegpt_multiturn() -> list[Session]:
    text = resources.files("cbbench.workloads").joinpath(MULTITURN_CSV).read_text()
    return parse_multiturn_csv(text)


# ---- JSONL user sessions --------------------------------------------------------------------
def _parse_turn(obj: object, where: str, count_tokens: Callable[[str], int]) -> Turn:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: a turn must be a JSON object")
    obj = json_object(obj, TURN_FIELDS, where, "turn ")
    if "output_len" not in obj:
        raise UsageError(f"{where}: missing 'output_len'")
    output_len = json_int(obj, "output_len", where, 1)
    choice = obj.get("tool_choice")
    _fan_out_names(obj, where)
    if "tool_result_len" in obj:
        if {"user", "user_token_ids", "user_len", "think_time_ms"} & set(obj):
            raise UsageError(f"{where}: a tool turn ('tool_result_len') has no user message "
                             "or think time ('tool_time_ms' is its wait)")
        wait = _delay_ms(obj, "tool_time_ms", where) / MS if "tool_time_ms" in obj else 0.0
        return Turn(json_int(obj, "tool_result_len", where, 1), output_len, think_time_s=wait,
                    kind=TOOL_TURN, tool_choice=choice)
    if "tool_time_ms" in obj:
        raise UsageError(f"{where}: 'tool_time_ms' belongs to a tool turn ('tool_result_len')")
    # The request file's checks: one message field, and a length that agrees with the ids
    # (a turn's `user` or `user_len` beside its ids was silently ignored).
    given = [k for k in ("user", "user_token_ids") if k in obj]
    if len(given) > 1:
        raise UsageError(f"{where}: give 'user' or 'user_token_ids', not both")
    if "user" in obj and "user_len" in obj:
        raise UsageError(
            f"{where}: give 'user' or 'user_len', not both (a text message's length is counted "
            "from the text: exactly with --tokenizer)"
        )
    text = ids = None
    if "user_token_ids" in obj:
        ids = json_ids(obj, "user_token_ids", where)
        user_len = len(ids)
        if "user_len" in obj and obj["user_len"] != user_len:
            raise UsageError(f"{where}: 'user_len' disagrees with len(user_token_ids)")
    elif "user" in obj:
        text = obj["user"]
        if not isinstance(text, str) or not text:
            raise UsageError(f"{where}: 'user' must be a non-empty string")
        check_unicode(text, "user", where)
        # Llama-3's template (the one modelled above) writes `message['content'] | trim`:
        # the text's surrounding whitespace is never prefilled, so it is not counted.
        user_len = count_tokens(text.strip())
    elif "user_len" in obj:
        user_len = json_int(obj, "user_len", where, 1)
    else:
        raise UsageError(f"{where}: a turn needs one of 'user', 'user_token_ids' or 'user_len'")
    think = _delay_ms(obj, "think_time_ms", where) / MS if "think_time_ms" in obj else None
    return Turn(user_len, output_len, text, ids, think, tool_choice=choice)


def _delay_ms(obj: dict, key: str, where: str) -> float:
    """A turn's wait in ms, within --think-time's own limit (1e15 ms crashed a torch run
    midway): think_time_ms and a tool turn's tool_time_ms alike."""
    ms = json_number(obj, key, where)
    if ms > MAX_DELAY_MS:
        raise UsageError(f"{where}: '{key}' must be at most {MAX_DELAY_MS:.0f} ms (30 days), got {ms:g}")
    return ms


def check_unicode(text: str, key: str, where: str) -> None:
    """JSON's \\ud800 escape gives a lone surrogate, which json.loads accepts and no encoder
    (a tokenizer, an HTTP body) does: refuse it where it is read."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(
            f"{where}: {key!r} is not valid Unicode text ({e.reason} at character {e.start})"
        ) from None


def _fan_out_names(obj: dict, where: str) -> tuple[str, ...]:
    """A turn's ``fan_out``: the sub-agents it starts, a non-empty list of distinct names."""
    if "fan_out" not in obj:
        return ()
    names = obj["fan_out"]
    if not isinstance(names, list) or not names:
        raise UsageError(f"{where}: 'fan_out' must be a non-empty list of sub-agent names "
                         "(a fan-out without sub-agents)")
    if not all(isinstance(n, str) and n for n in names):
        raise UsageError(f"{where}: 'fan_out' must list sub-agent names (non-empty strings)")
    if len(set(names)) < len(names):
        raise UsageError(f"{where}: 'fan_out' names a sub-agent twice")
    return tuple(names)


def _parse_turns(raw: object, where: str, count_tokens: Callable[[str], int]) -> tuple[Turn, ...]:
    if not isinstance(raw, list) or not raw:
        raise UsageError(f"{where}: 'turns' must be a non-empty list")
    turns = tuple(_parse_turn(t, f"{where}turn {k + 1}", count_tokens) for k, t in enumerate(raw))
    if "fan_out" in raw[-1]:
        raise UsageError(f"{where}turn {len(raw)}: a fan-out on the agent's last turn (the next "
                         "turn is what waits for the sub-agents: give the agent one more turn)")
    return turns


def _raw_subagents(obj: dict, where: str) -> dict[str, list]:
    subs = obj.get("subagents", {})
    if not isinstance(subs, dict) or ("subagents" in obj and not subs):
        raise UsageError(f"{where}: 'subagents' must be a non-empty object of name -> turns")
    for name, turns in subs.items():
        if not name:
            raise UsageError(f"{where}: a sub-agent's name must be a non-empty string")
        if not isinstance(turns, list) or not turns:
            raise UsageError(f"{where} sub-agent {name!r}: its turns must be a non-empty list")
    return subs


def parse_session(
    obj: object, index: int, where: str, count_tokens: Callable[[str], int]
) -> Session:
    obj = json_object(obj, SESSION_FIELDS, where, "session ")
    main_raw = obj.get("turns")
    parsed = _parse_turns(main_raw, f"{where} ", count_tokens)
    assert isinstance(main_raw, list)  # _parse_turns refused anything else
    subs_raw = _raw_subagents(obj, where)
    subs = {name: _parse_turns(turns, f"{where} sub-agent {name!r} ", count_tokens)
            for name, turns in subs_raw.items()}
    order = order_subagents(main_raw, subs_raw, lambda t: t.get("fan_out", ()), where)
    number = {name: a + 1 for a, name in enumerate(order)}

    def wired(turns: tuple[Turn, ...], raw: list) -> tuple[Turn, ...]:
        return tuple(replace(t, fan_out=tuple(number[n] for n in r.get("fan_out", ())))
                     for t, r in zip(turns, raw))

    parsed = wired(parsed, main_raw)
    tools = _check_tool_turns(obj.get("tools"), parsed, where)
    subagents = tuple(SubAgent(n, wired(subs[n], subs_raw[n])) for n in order)
    for sub in subagents:
        _check_tool_turns(tools, sub.turns, f"{where} sub-agent {sub.name!r}")
    arrival = json_number(obj, "arrival_s", where) if "arrival_s" in obj else None
    name = None
    if "session_id" in obj:
        sid = obj["session_id"]
        if isinstance(sid, bool) or not isinstance(sid, (str, int)):
            raise UsageError(f"{where}: 'session_id' must be a string or an integer")
        name = str(sid)
    return Session(index, parsed, arrival, name, tools, subagents)


def _check_tool_turns(tools: object, turns: tuple[Turn, ...], where: str):
    """The session's tools, checked with its turns: a turn's tool_choice and a tool turn need
    tools, and a tool turn answers the call the turn before it asked for."""
    checked, _ = check_tools(tools, None, where)
    for k, t in enumerate(turns):
        at = f"{where} turn {k + 1}"
        if t.tool_choice is not None:
            check_tools(checked, t.tool_choice, at)
        if t.kind == TOOL_TURN:
            if not checked:
                raise UsageError(f"{at}: a tool turn without tools (give the session 'tools')")
            prev = turns[k - 1].tool_choice if k else None
            if prev is None or prev == "none":
                raise UsageError(f"{at}: a tool turn must follow a turn whose 'tool_choice' "
                                 "asks for a call")
    return checked


# ---- sampling -------------------------------------------------------------------------------
T = TypeVar("T")


def draw(items: Sequence[T], num: int | None, seed: int, timed: bool, source: str,
         noun: str) -> tuple[list[T], bool]:
    """Draw ``num`` of ``items`` (requests or sessions, ``noun``) with ``seed``; the same seed
    gives the same draw on every target: a permutation when there are enough, else with
    replacement. ``timed`` (``source`` replays its own arrivals): its first ``num``, in
    order. None keeps them all, in order. Returns (drawn, drawn_with_replacement)."""
    if num is None:
        return list(items), False
    if num < 1:
        raise UsageError(f"--num-requests must be >= 1, got {num}")
    if timed:
        if num > len(items):
            raise UsageError(f"{source} has {len(items)} timed {noun}; --num-requests {num} "
                             "is more")
        return list(items[:num]), False
    rng = np.random.default_rng(seed)
    if num <= len(items):
        return [items[i] for i in rng.permutation(len(items))[:num]], False
    return [items[i] for i in rng.integers(0, len(items), num)], True


def sample_sessions(
    sessions: Sequence[Session], num: int | None, seed: int
) -> tuple[list[Session], bool]:
    """Draw ``num`` sessions with ``seed``, as sample_requests draws requests."""
    timed = all(s.arrival_s is not None for s in sessions)
    return draw(sessions, num, seed, timed, "the file", "sessions")


def session_stats(sessions: Sequence[Session]) -> dict:
    turns = np.array([s.num_turns for s in sessions])
    # The longest history any of its agents reaches (the main agent's last turn, when it has
    # no sub-agents).
    last = np.array([max(p + t.output_len for p, t in zip(prompt_lens(s), s.all_turns))
                     for s in sessions])
    return {
        "sessions": len(sessions),
        "turns": int(turns.sum()),
        "turns_per_session": {"mean": float(turns.mean()), "max": int(turns.max())},
        "final_context_len": {
            "mean": float(last.mean()),
            "p50": float(np.percentile(last, 50)),
            "max": int(last.max()),
        },
    }


def check_session_tokens(sessions: Sequence[Session]) -> None:
    """Every turn's prompt is made whole when it is sent (the engine's token ids, an
    endpoint's synthetic text), and a session run holds them all: the drawn sessions' prompt
    tokens are checked against the memory available before the run, as --input-len's are (a
    turn's `user_len: 10**12` asked for 7 TiB midway through a run)."""
    from cbbench.load.limits import check_token_ids

    total = sum(sum(prompt_lens(s)) for s in sessions)
    check_token_ids(total, f"the sessions' turns ({total:.3g} prompt tokens in all)")

