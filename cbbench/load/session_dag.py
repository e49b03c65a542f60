"""A session as a DAG (issue 24): the main agent's turns, and sub-agents a turn fans out to.

A turn with ``fan_out`` starts each named sub-agent when its reply has finished: each is a
conversation of its own (its own history, from its first turn's message), and they run in
parallel. The fanning agent's next turn waits for all of them -- every sub-agent's last turn
finished -- and then for its own wait (``tool_time_ms`` for a tool turn, else its think time),
so its intended start is ``max(reply end, sub-agents' ends) + wait``. A sub-agent's first turn
waits its ``think_time_ms`` (default 0: a program starts it, not a person). Sub-agents may fan
out in turn (a tree of agents; the nodes are turns, so the session is a DAG).

The turns are numbered flat, session by session: the main agent's turns, then each sub-agent's,
in the order the fan-outs reach them (depth first). Request ids, seeded draws and records use
that flat index; a record's ``turn`` is the turn's position within its own agent.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.errors import UsageError

MAIN_AGENT = 0


@dataclass(frozen=True, slots=True)
class TurnNode:
    """One turn of a session's DAG, by its flat index."""

    agent: int  # MAIN_AGENT, or a >= 1: the session's subagents[a - 1]
    index: int  # the turn's position in its agent's conversation (0-based)
    prev: int | None  # the turn before it in its agent (its history); None: a first turn
    parent: int | None  # a sub-agent's first turn: the turn that fanned out to it
    joins: tuple[int, ...]  # the sub-agents' last turns it waits for (prev's fan-out)
    children: tuple[int, ...]  # the first turns of the sub-agents it fans out to

    @property
    def waits_on(self) -> tuple[int, ...]:
        """Every turn that must have finished before this one's wait begins."""
        if self.prev is not None:
            return (self.prev, *self.joins)
        return () if self.parent is None else (self.parent,)


def order_subagents(
    main: list, subagents: dict[str, list], fan_out_of, where: str
) -> list[str]:
    """The sub-agents' names in the order the fan-outs reach them (depth first from the main
    agent), checked: every name a fan-out gives is defined, each sub-agent has exactly one
    parent, and every one is reached (a sub-agent unreached from the main agent is on a cycle).
    ``fan_out_of(turn)``: the names a turn fans out to."""
    parent: dict[str, str] = {}
    for owner, turns in [("the main agent", main), *subagents.items()]:
        for k, turn in enumerate(turns):
            for name in fan_out_of(turn):
                at = f"{where} {_agent_where(owner)}turn {k + 1}"
                if name not in subagents:
                    known = ", ".join(sorted(subagents)) or "none"
                    raise UsageError(f"{at}: 'fan_out' names an unknown sub-agent {name!r} "
                                     f"(the session's 'subagents': {known})")
                if name in parent:
                    raise UsageError(f"{at}: sub-agent {name!r} is fanned out to twice (it "
                                     f"already has parent {parent[name]}); give each its own name")
                parent[name] = owner
    order: list[str] = []

    def names(turns: list):
        return (name for turn in turns for name in fan_out_of(turn))

    # Depth first with a stack of its own, not recursion: a 2,000-deep chain of sub-agents
    # raised RecursionError (in-process and over HTTP, both parse here).
    stack = [names(main)]
    while stack:
        name = next(stack[-1], None)
        if name is None:
            stack.pop()
            continue
        order.append(name)
        stack.append(names(subagents[name]))
    for name in subagents:
        if name not in parent:
            raise UsageError(f"{where}: sub-agent {name!r} is never fanned out to")
        if name not in order:
            raise UsageError(f"{where}: the fan-outs form a cycle: {_cycle(name, parent)}")
    return order


def _agent_where(owner: str) -> str:
    return "" if owner == "the main agent" else f"sub-agent {owner!r} "


def _cycle(start: str, parent: dict[str, str]) -> str:
    """The cycle above ``start``, in fan-out order (a -> b: a fans out to b)."""
    path = [start]
    while parent[path[-1]] not in path:
        path.append(parent[path[-1]])
    loop = path[path.index(parent[path[-1]]):]
    return " -> ".join([*reversed(loop), loop[-1]])


def build_nodes(agents: list[tuple], fan_out: list[list[tuple[int, ...]]]) -> tuple[TurnNode, ...]:
    """The flat DAG of a session whose agents (main first, then the sub-agents in order) have
    ``agents[a]`` turns and whose turn (a, j) fans out to the agents ``fan_out[a][j]``."""
    first = [0]
    for turns in agents[:-1]:
        first.append(first[-1] + len(turns))
    parent_of: dict[int, int] = {}
    for a, turns in enumerate(agents):
        for j in range(len(turns)):
            for child in fan_out[a][j]:
                parent_of[child] = first[a] + j
    nodes = []
    for a, turns in enumerate(agents):
        for j in range(len(turns)):
            prev = first[a] + j - 1 if j else None
            joins = tuple(first[c] + len(agents[c]) - 1 for c in fan_out[a][j - 1]) if j else ()
            nodes.append(TurnNode(
                agent=a, index=j, prev=prev, parent=parent_of.get(a) if j == 0 else None,
                joins=joins, children=tuple(first[c] for c in fan_out[a][j]),
            ))
    return tuple(nodes)
