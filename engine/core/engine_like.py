"""What a run asks of the thing it drives: one engine (core/engine.py), a set of data-parallel
replicas (sim/replicas.py) or a disaggregated prefill/decode pair (sim/disaggregated.py). The
loops and the benchmark target (cbbench/targets/engine.py) read all three through this one
protocol, so none of them asks which of the three it holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .engine import Engine
    from .iteration import IterationRecord
    from .request import Request


class EngineLike(Protocol):
    @property
    def engines(self) -> list[Engine]:
        """The engines it is made of (an engine: itself alone)."""
        ...

    @property
    def records(self) -> Sequence[IterationRecord]: ...

    @property
    def rejected(self) -> list[Request]: ...

    def has_unfinished(self) -> bool: ...

    def add_request(self, req: Request) -> str | None: ...

    def abort_request(self, req: Request) -> None: ...
