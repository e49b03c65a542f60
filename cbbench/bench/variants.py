"""Engine variants for `cbbench compare --variants`: each names a value on one or more axes
(batching, KV allocation, preemption, queue policy, prefix caching), and every variant runs on the
identical request set (same workload, seed and arrivals)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cbbench.analysis.comparison.compare import Labeled
from cbbench.analysis.result import check_writable, write_result
from cbbench.bench.runner import RunSpec, execute_run
from cbbench.engine.args import KV_ALLOCATIONS, PREEMPTION_MODES, QUEUE_POLICIES, EngineArgs
from cbbench.errors import UsageError

log = logging.getLogger(__name__)

# Batching axis: (scheduler, chunked prefill). Static batching runs without chunked prefill.
BATCHING = {
    "static": ("static", False),
    "continuous": ("continuous", False),
    "continuous-chunked": ("continuous", True),
}
# The KV allocation, preemption and queue-policy axes take the engine options' own values;
# prefix caching is named (name -> the option's value).
PREFIX_CACHING = {"prefix-cache": True, "no-prefix-cache": False}
VARIANT_JOIN = "+"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    batching: str | None = None  # None: keep the command's --scheduler
    chunked_prefill: bool | None = None
    kv_allocation: str | None = None
    preemption: str | None = None
    queue_policy: str | None = None
    enable_prefix_caching: bool | None = None

    def apply(self, opts: EngineArgs) -> EngineArgs:
        changes: dict[str, Any] = {}
        if self.batching is not None:
            changes.update(batching=self.batching, chunked_prefill=self.chunked_prefill)
        for key in ("kv_allocation", "preemption", "queue_policy", "enable_prefix_caching"):
            value = getattr(self, key)
            if value is not None:
                changes[key] = value
        return dataclasses.replace(opts, **changes)


def parse_variant(name: str) -> Variant:
    axes = (BATCHING, KV_ALLOCATIONS, PREEMPTION_MODES, QUEUE_POLICIES, PREFIX_CACHING)
    valid = (
        f"{', '.join(n for axis in axes for n in axis)} (combine one of each axis with "
        f"'{VARIANT_JOIN}', e.g. continuous-chunked+reserved or swap+priority+prefix-cache)"
    )
    chosen: list[str | None] = [None] * len(axes)
    for part in name.split(VARIANT_JOIN):
        axis = next((i for i, names in enumerate(axes) if part in names), None)
        if axis is None or chosen[axis] is not None:
            raise UsageError(f"invalid variant {name!r}: use {valid}")
        chosen[axis] = part
    batching, kv, preemption, policy, caching = chosen
    sched, chunked = BATCHING[batching] if batching else (None, None)
    return Variant(
        name,
        sched,
        chunked,
        kv,
        preemption,
        policy,
        PREFIX_CACHING[caching] if caching else None,
    )


def parse_variants(text: str) -> list[Variant]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise UsageError(f"--variants lists a variant twice: {text!r}")
    if len(names) < 2:
        raise UsageError("--variants needs two or more variants, e.g. static,continuous")
    return [parse_variant(n) for n in names]



def variant_paths(variants: Sequence[Variant], folder: Path) -> list[Path]:
    """Where each variant's result is saved: FOLDER/NAME.json."""
    return [folder / f"{v.name}.json" for v in variants]


def run_variants(
    variants: Sequence[Variant], base: RunSpec, folder: Path,
    should_stop: Callable[[], bool] | None = None,
) -> list[Labeled]:
    """Run each variant on the base spec's request set; each result is saved as soon as it
    is done, so an interrupted comparison keeps the variants that finished. Once
    ``should_stop`` is set no further variant starts, and the one in progress stops its
    dispatch and is saved marked interrupted."""
    paths = variant_paths(variants, folder)
    for p in paths:
        check_writable(p)
    results = []
    for i, (v, path) in enumerate(zip(variants, paths), 1):
        if should_stop is not None and should_stop():
            break
        log.info(f"variant {v.name} ({i}/{len(variants)})")
        spec = dataclasses.replace(base, engine=v.apply(base.engine))
        result = execute_run(spec, should_stop=should_stop)
        write_result(path, result)
        log.info(f"saved {path}")
        results.append(Labeled(v.name, result))
    return results

