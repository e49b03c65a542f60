"""The workload types every workload format builds: a request (prompt tokens, text or length;
output length; arrival time) and a workload (a list of requests, or of multi-turn sessions).
They sit below the formats (load/workload.py's built-ins and JSONL, load/traces.py) so that each
format imports them and none imports another."""

from __future__ import annotations

from dataclasses import dataclass

from cbbench.load.hash_blocks import expand_hash_ids
from cbbench.load.sessions import Session


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    id: int  # 0-based index in the workload file or built-in trace
    prompt_len: int
    output_len: int
    prompt_token_ids: tuple[int, ...] | None = None
    prompt: str | None = None
    arrival_s: float | None = None
    priority: int = 0
    # A trace's prompt as 512-token blocks (Mooncake's hash_ids): ids made on demand.
    hash_ids: tuple[int, ...] | None = None
    # load/output_kinds.py: the first reasoning_len output tokens are reasoning; tools offered.
    reasoning_len: int = 0
    tools: tuple[dict, ...] | None = None
    tool_choice: str | dict | None = None
    # load/images.py: the images the request's chat message carries (paths, URLs, or
    # random-mm's synthetic references); None: text only.
    images: tuple[str, ...] | None = None

    def token_ids(self) -> tuple[int, ...] | None:
        """The prompt's token ids when the workload defines them (explicitly, or as a trace's
        hash blocks); None for text and length-only requests."""
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        if self.hash_ids is not None:
            return expand_hash_ids(self.id, self.hash_ids, self.prompt_len)
        return None


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[WorkloadRequest]
    description: str = ""
    notes: tuple[str, ...] = ()  # what loading it left out, for the run to report
    sessions: list[Session] | None = None  # set: a multi-turn workload (requests is empty)

    @property
    def is_sessions(self) -> bool:
        return self.sessions is not None

    @property
    def has_arrivals(self) -> bool:
        items = self.sessions if self.sessions is not None else self.requests
        return bool(items) and all(r.arrival_s is not None for r in items)
