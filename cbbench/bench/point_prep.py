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
- **A warm-up sized to the point.** Against an endpoint, each point first sends as many
  requests as it expects to have in flight (Little's law: its rate x the previous point's
  median E2EL; a rate-inf point, all of its requests; the first finite point, one), all at
  once, with prompts of their own (never the point's), their results discarded: the server's
  connections, batch shapes and allocator are warm at the point's concurrency, not at a fixed
  count. It runs before the prefix-cache reset, so the reset still leaves the cache empty.
  ``--skip-warmup`` leaves it out. The bundled engine starts a fresh engine per point (its
  torch engine warms itself up): no warm-up there.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np

from cbbench.analysis.summary.percentiles import percentile_key
from cbbench.errors import UsageError
from cbbench.schema.run import RunResult

log = logging.getLogger(__name__)

RESET_PATH = "/reset_prefix_cache"
RESET_TIMEOUT_S = 30.0  # the server finishes its current step first: seconds at the most
SEED_BITS = 31  # point seeds stay positive 32-bit ints, as a user's --seed is
# A warm-up past this many requests warms nothing more (the server's batch is full long before)
# and would cost as much as the point.
MAX_WARMUP_REQUESTS = 256
WARMUP_STREAM = 1 << 20  # warm-up seeds: point_seed(seed, WARMUP_STREAM + i), apart from points'


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

    def __init__(self, reuse_prompts: bool = False, reset_prefix_cache: bool = False,
                 warmup: bool = True) -> None:
        self.reuse_prompts = reuse_prompts
        self.reset_prefix_cache = reset_prefix_cache
        self.warmup = warmup
        self.points = 0
        self._reset_worked = False
        self._last_e2el_s: float | None = None  # the previous point's median E2EL

    def check(self, base) -> None:
        if self.reset_prefix_cache and base.endpoint is None:
            raise UsageError("--reset-prefix-cache empties a server's prefix cache: give "
                             "--endpoint (the bundled engine starts each point empty)")

    def to_dict(self) -> dict:
        return {"fresh_prompts": not self.reuse_prompts,
                "reset_prefix_cache": self.reset_prefix_cache,
                "warmup": "sized to each point's concurrency" if self.warmup else None}

    def warmup_size(self, rate: float, planned: int) -> tuple[int, str]:
        """How many warm-up requests a point at ``rate`` sends (``planned``: its own count),
        and on what basis."""
        if math.isinf(rate):
            n, basis = planned, "rate inf: every request in flight at once"
        elif self._last_e2el_s is None:
            n, basis = 1, "no latency measured yet: one request"
        else:
            n = math.ceil(rate * self._last_e2el_s)
            basis = (f"Little's law: {rate:.4g} req/s x the previous point's median E2EL "
                     f"{self._last_e2el_s:.3g} s")
        return max(1, min(n, planned, MAX_WARMUP_REQUESTS)), basis

    def warm_up(self, spec, should_stop=None) -> dict | None:
        """Send the point's warm-up (endpoint runs); what was sent, or None when none is."""
        if not self.warmup or spec.endpoint is None:
            return None
        from cbbench.bench.runner import execute_run
        from cbbench.options.load import RATE_INF

        n, basis = self.warmup_size(spec.request_rate, spec.load.num_requests or 1)
        seed = point_seed(spec.load.seed, WARMUP_STREAM + self.points)
        warm = dataclasses.replace(
            spec,
            load=dataclasses.replace(spec.load, num_requests=n, request_rate=RATE_INF,
                                     seed=seed, duration=None, ramp=None),
            output=dataclasses.replace(spec.output, gpu_metrics=None, slice=None,
                                       server_log=None, label=None),
            endpoint=dataclasses.replace(spec.endpoint, seed=seed, scrape_metrics=False,
                                         scrape_metrics_filter=None))
        s = execute_run(warm, should_stop=should_stop, records=False).summary
        return {"requests": n, "basis": basis, "completed": s.completed,
                "failed": s.failed, "duration_s": s.duration_s}

    def after(self, result: RunResult) -> None:
        """Remember the point's median E2EL: the next point's warm-up is sized by it."""
        dist = result.summary.e2el_ms
        e2el = (dist.model_extra or {}).get(percentile_key(50)) if dist is not None else None
        if e2el is not None and math.isfinite(e2el) and e2el > 0:
            self._last_e2el_s = e2el / 1000.0

    def spec_for(self, spec):
        """``spec`` for the next point: its own seed (the endpoint's prompt text too)."""
        index = self.points
        self.points += 1
        if self.reuse_prompts:
            return spec
        seed = point_seed(spec.load.seed, index)
        spec = spec.with_load(seed=seed)
        if spec.endpoint is not None:
            spec = dataclasses.replace(spec, endpoint=dataclasses.replace(spec.endpoint, seed=seed))
        return spec

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
