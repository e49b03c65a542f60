"""What each point of a sweep or a capacity search does before it runs, so that points do not
warm each other (issue 40; GuideLLM users hit it: guidellm#460).

- **Fresh prompts.** Point ``i`` draws its requests and its synthetic prompt text with its own
  seed, derived from the run's ``--seed`` and ``i``, so a server's prefix cache never serves one
  point the prompts an earlier point sent. ``--reuse-prompts`` keeps the old behaviour: every
  point sends the same requests (the same draws and text, the arrivals scaled to its rate).
  A dataset workload (sharegpt) is a finite set: a fresh draw may still pick a conversation an
  earlier point sent; synthetic prompts (random, JSONL lengths) never repeat.
- **``--reset-prefix-cache``.** Before each point, ``POST /reset_prefix_cache`` on every
  ``--endpoint`` (vLLM's route: its server needs ``VLLM_SERVER_DEV_MODE=1``; ``cbbench serve``
  has it). The result says what each call answered (``prefix_cache_reset``). A server that
  refuses the first call stops the sweep before anything is measured (exit 2); a later refusal
  is a warning and is recorded, the point runs (its cache figures then say what it met).
"""

from __future__ import annotations

import dataclasses
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np

from cbbench.errors import UsageError

log = logging.getLogger(__name__)

RESET_PATH = "/reset_prefix_cache"
RESET_TIMEOUT_S = 30.0  # the server finishes its current step first: seconds at the most
SEED_BITS = 31  # point seeds stay positive 32-bit ints, as a user's --seed is


def point_seed(seed: int, index: int) -> int:
    """The seed of a sweep's or search's point ``index`` (0: the first point, which keeps the
    run's own seed, so a one-point sweep draws what `run --seed` draws)."""
    if index == 0:
        return seed
    state = np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint32)[0]
    return int(state) >> (32 - SEED_BITS)


@dataclass(frozen=True)
class ResetAnswer:
    url: str
    ok: bool
    status: int | None  # the HTTP status; None: no answer
    error: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def post_reset(base_url: str, headers: dict[str, str], shown_url: str) -> ResetAnswer:
    """POST BASE/reset_prefix_cache; the answer, never an exception."""
    req = urllib.request.Request(base_url.rstrip("/") + RESET_PATH, data=b"", method="POST",
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=RESET_TIMEOUT_S) as resp:  # noqa: S310
            return ResetAnswer(shown_url, True, resp.status)
    except urllib.error.HTTPError as e:
        return ResetAnswer(shown_url, False, e.code, f"HTTP {e.code} {e.reason}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return ResetAnswer(shown_url, False, None, f"{type(e).__name__}: {e}")


class PointPrep:
    """Prepares each point: its spec (its own seed unless ``reuse_prompts``) and, with
    ``reset_prefix_cache``, the servers' prefix caches emptied before it."""

    def __init__(self, reuse_prompts: bool = False, reset_prefix_cache: bool = False) -> None:
        self.reuse_prompts = reuse_prompts
        self.reset_prefix_cache = reset_prefix_cache
        self.points = 0
        self._reset_worked = False

    def check(self, base) -> None:
        if self.reset_prefix_cache and base.endpoint is None:
            raise UsageError("--reset-prefix-cache empties a server's prefix cache: give "
                             "--endpoint (the bundled engine starts each point empty)")

    def to_dict(self) -> dict:
        return {"fresh_prompts": not self.reuse_prompts,
                "reset_prefix_cache": self.reset_prefix_cache}

    def spec_for(self, spec):
        """``spec`` for the next point: its own seed (the endpoint's prompt text too)."""
        index = self.points
        self.points += 1
        if self.reuse_prompts:
            return spec
        seed = point_seed(spec.seed, index)
        changes: dict = {"seed": seed}
        if spec.endpoint is not None:
            changes["endpoint"] = dataclasses.replace(spec.endpoint, seed=seed)
        return dataclasses.replace(spec, **changes)

    def before(self, spec) -> list[dict] | None:
        """Reset every endpoint's prefix cache (with --reset-prefix-cache); what each said."""
        if not self.reset_prefix_cache:
            return None
        from cbbench.targets.options import redact_url

        opts = spec.endpoint
        answers = [post_reset(u, dict(opts.headers), redact_url(u)) for u in opts.endpoints()]
        failed = [a for a in answers if not a.ok]
        if failed and not self._reset_worked:
            a = failed[0]
            raise UsageError(f"--reset-prefix-cache: POST {a.url}{RESET_PATH} failed ({a.error}); "
                             "vLLM serves it with VLLM_SERVER_DEV_MODE=1")
        for a in failed:
            log.info(f"warning: --reset-prefix-cache: POST {a.url}{RESET_PATH} failed "
                     f"({a.error}): this point may meet the last one's cached prefixes")
        self._reset_worked = self._reset_worked or not failed
        return [a.to_dict() for a in answers]
