"""Several endpoints without a gateway (issue 27, Build 7): `--endpoint URL1,URL2` with a
client-side `--balance`, and `--lora-modules NAME=SHARE,...` (which model each request asks for).

- round-robin: the i-th request sent goes to endpoint i mod N (in send order);
- least-in-flight: to the endpoint with the fewest of this client's requests in flight at the
  send (ties: the lowest index), as a gateway's least-request policy would choose.

The choice is made at the send (after a --max-concurrency slot), on the event loop: a counter
and, for least-in-flight, a scan of N counts, so the per-request cost stays a few hundred ns.
Each endpoint has its own RequestContext (the URL is fixed in it); the session and connection
pool are shared.

The adapter of each request is drawn from the run's seed and the request's id alone
(PCG64 stream LORA_RNG_STREAM), so the same run sends the same request to the same adapter in
one process or split over workers. Shares may sum to less than 1: the rest asks for the served
(base) model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from cbbench.errors import UsageError

BALANCES = ("round-robin", "least-in-flight")
LORA_RNG_STREAM = 11  # apart from the prompts' (7) and the sampler's streams
SHARE_SUM_TOLERANCE = 1e-9


def parse_lora_modules(text: str | None) -> dict[str, float] | None:
    """'a=0.5,b=0.5' -> {"a": 0.5, "b": 0.5}; one-line UsageError on anything else."""
    if text is None:
        return None
    usage = "use NAME=SHARE,... with shares in (0, 1] summing to at most 1, e.g. a=0.5,b=0.5"
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        try:
            share = float(value)
        except ValueError:
            share = float("nan")
        if not sep or not name or not (0 < share <= 1):
            raise UsageError(f"invalid --lora-modules {part.strip()!r}: {usage}")
        if name in shares:
            raise UsageError(f"--lora-modules names {name!r} twice")
        shares[name] = share
    if sum(shares.values()) > 1 + SHARE_SUM_TOLERANCE:
        raise UsageError(f"--lora-modules shares sum to {sum(shares.values()):g}, above 1: {usage}")
    return shares


def lora_models(ids: Sequence[int | str], shares: dict[str, float], seed: int,
                base: str | None) -> list[str | None]:
    """The model each request asks for: an adapter name with its share's probability, else
    ``base``. Drawn per request id, so the choice does not depend on the order or the worker."""
    names = list(shares)
    edges = np.cumsum([shares[n] for n in names])
    out: list[str | None] = []
    for rid in ids:
        key = rid if isinstance(rid, int) else int.from_bytes(str(rid).encode()[:8], "little")
        u = np.random.default_rng([seed, key, LORA_RNG_STREAM]).random()
        i = int(np.searchsorted(edges, u, side="right"))
        out.append(names[i] if i < len(names) else base)
    return out


class Balancer:
    """Picks a RequestContext (one per endpoint) for each send; `release` after the request."""

    def __init__(self, contexts: Sequence, urls: Sequence[str], policy: str):
        if policy not in BALANCES:
            raise UsageError(f"unknown --balance {policy!r}: use {' or '.join(BALANCES)}")
        self.contexts = list(contexts)
        self.urls = list(urls)
        self.least = policy == "least-in-flight"
        self.in_flight = [0] * len(self.contexts)
        self.sent = [0] * len(self.contexts)
        self._next = 0

    def acquire(self) -> int:
        if self.least:
            counts = self.in_flight
            i = counts.index(min(counts))
        else:
            i = self._next
            self._next = (i + 1) % len(self.contexts)
        self.in_flight[i] += 1
        self.sent[i] += 1
        return i

    def release(self, i: int) -> None:
        self.in_flight[i] -= 1


def endpoint_contexts(ctx, urls: Sequence) -> list:
    """One RequestContext per endpoint URL (a yarl URL each), sharing ``ctx``'s session."""
    return [dataclasses.replace(ctx, url=u) for u in urls]


def tag_records(records: Sequence, endpoint: str | None, model: str | None) -> None:
    """Per request ``endpoint`` and ``model`` where the send did not set them (one endpoint,
    no adapter): after the run, so nothing is added to a request's path."""
    for rec in records:
        if rec.endpoint is None:
            rec.endpoint = endpoint
        if rec.model is None:
            rec.model = model
