"""What a session run sends, the same for every target: sessions, their first turns' intended
starts (the arrival process), each later turn's think time, request ids, and token ids.

Request ids run session by session in the drawn order: session i's turn k (0-based) is request
``first_id[i] + k``. Every random draw is seeded by (seed, stream, session position, turn), so
a turn's think time or its ids do not depend on the order in which turns happen to finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cbbench.load.delays import Delay, parse_delay
from cbbench.load.sessions import (
    MESSAGE_END_TOKENS,
    MESSAGE_HEADER_TOKENS,
    TOOL_TURN,
    Session,
)

# ShareGPT records no timing: a one-second mean keeps runs short while still spreading the
# sessions' turns apart. Real readers and typers take longer; set --think-time for them.
DEFAULT_THINK_TIME = "exp:1000"
THINK_STREAM = 21
USER_IDS_STREAM = 22
REPLY_IDS_STREAM = 23
# Token ids for the engine target's template (any vocabulary has them) and the range content
# ids are drawn from when the model's vocabulary is unknown (the simulator).
BOS_ID = 1
HEADER_START_ID = 2
HEADER_END_ID = 3
EOT_ID = 4
USER_ROLE_ID = 5
ASSISTANT_ROLE_ID = 6
NEWLINES_ID = 7
FIRST_CONTENT_ID = 8
DEFAULT_VOCAB = 32000


def _header(role_id: int) -> list[int]:
    ids = [HEADER_START_ID, role_id, HEADER_END_ID, NEWLINES_ID]
    assert len(ids) == MESSAGE_HEADER_TOKENS
    return ids


USER_HEADER = _header(USER_ROLE_ID)
ASSISTANT_HEADER = _header(ASSISTANT_ROLE_ID)
END = [EOT_ID] * MESSAGE_END_TOKENS


@dataclass
class SessionPlan:
    sessions: list[Session]
    starts: np.ndarray  # intended start of each session's first turn (s)
    think_time: Delay = field(default_factory=lambda: parse_delay(DEFAULT_THINK_TIME, ""))
    seed: int = 0
    # The sessions (positions in `sessions`) this process runs; None: all. A load-generator
    # worker runs its share of a plan that is otherwise the whole run's, so request ids, labels
    # and every seeded draw are the same as in one process.
    active: list[int] | None = None
    tool_time_scale: float = 1.0  # --tool-time-scale: every tool turn's tool_time_ms times X

    def __post_init__(self) -> None:
        sizes = [s.num_turns for s in self.sessions]
        self.first_id = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(int).tolist()
        self.num_turns = int(sum(sizes))
        # The records' session_id: the file's names when every drawn session has a distinct
        # one, else the session's position in this run (a session drawn twice is two users).
        names = [s.name for s in self.sessions]
        unique = None not in names and len(set(names)) == len(names)
        self.labels: list[int | str] = (
            [n for n in names if n is not None] if unique else list(range(len(self.sessions))))

    @property
    def active_sessions(self) -> list[int]:
        return list(range(len(self.sessions))) if self.active is None else list(self.active)

    @property
    def active_turns(self) -> int:
        return sum(self.sessions[i].num_turns for i in self.active_sessions)

    def session_of(self) -> list[int]:
        """Each request id's session position."""
        return [i for i, s in enumerate(self.sessions) for _ in s.all_turns]

    def planned_turns(self) -> dict:
        return {label: s.num_turns for label, s in zip(self.labels, self.sessions)}

    def request_id(self, i: int, k: int) -> int:
        return self.first_id[i] + k

    def think_time_s(self, i: int, k: int) -> float:
        """The wait before flat turn k of session i once every turn it waits on finished
        (its agent's previous turn and that turn's sub-agents; a sub-agent's first turn: the
        turn that fanned out to it). A sub-agent starts without a think time of its own
        unless its turn gives one: a program starts it, not a person."""
        turn = self.sessions[i].all_turns[k]
        own = turn.think_time_s
        if own is not None:
            return own * self.tool_time_scale if turn.kind == TOOL_TURN else own
        if self.sessions[i].nodes[k].prev is None:
            return 0.0
        return self.think_time.sample_s(np.random.default_rng([self.seed, THINK_STREAM, i, k]))

    # ---- token ids (the engine target) ------------------------------------------------------
    def user_ids(self, i: int, k: int, vocab: int) -> list[int]:
        turn = self.sessions[i].all_turns[k]
        if turn.user_token_ids is not None:
            return list(turn.user_token_ids)
        rng = np.random.default_rng([self.seed, USER_IDS_STREAM, i, k])
        return rng.integers(FIRST_CONTENT_ID, vocab, turn.user_len).tolist()

    def reply_ids(self, i: int, k: int, vocab: int) -> list[int]:
        """The reply the simulator "generates" for turn k: it samples lengths, not ids, and a
        prefix cache can only reuse a reply whose ids are known."""
        rng = np.random.default_rng([self.seed, REPLY_IDS_STREAM, i, k])
        return rng.integers(FIRST_CONTENT_ID, vocab, self.sessions[i].all_turns[k].output_len).tolist()

    def first_prompt_ids(self, i: int, vocab: int, k: int = 0) -> list[int]:
        """A first turn's prompt (the main agent's, k = 0, or a sub-agent's)."""
        return [BOS_ID, *USER_HEADER, *self.user_ids(i, k, vocab), *END, *ASSISTANT_HEADER]

    def next_prompt_ids(
        self, prev_prompt: Sequence[int], reply: list[int], i: int, k: int, vocab: int
    ) -> list[int]:
        """Turn k's prompt: turn k - 1's, its reply as generated, then the new message."""
        return [
            *prev_prompt, *reply, *END, *USER_HEADER, *self.user_ids(i, k, vocab), *END,
            *ASSISTANT_HEADER,
        ]

    def to_config(self) -> dict:
        return {
            "sessions": len(self.sessions),
            "turns": self.num_turns,
            "think_time": self.think_time.text(),
            **({"tool_time_scale": self.tool_time_scale} if self.tool_time_scale != 1.0 else {}),
        }
