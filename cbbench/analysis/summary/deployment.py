"""summary.gpus, goodput per GPU and the disaggregated pools' figures of an engine run: one
definition for the object path's summary (bench/runner.py) and the column summary
(analysis/compact/compact_summary.py)."""

from __future__ import annotations

from cbbench.analysis.summary.metrics import summarize_engine
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES
from cbbench.engine.args import EngineArgs


def add_deployment(summary: dict, opts: EngineArgs, run, iterations: list[dict],
                   percentiles=DEFAULT_PERCENTILES) -> None:
    """The GPUs the engine run held, goodput per GPU (DistServe's figure of merit), and under
    --disaggregate the KV transfer times (at the run's --percentiles) and each pool's own
    engine summary."""
    from cbbench.analysis.summary.metrics import distribution

    gpus = opts.num_gpus
    summary["gpus"] = gpus
    if "goodput" in summary:
        summary["goodput_per_gpu"] = summary["goodput"] / gpus
    transfers = getattr(run, "kv_transfer_ms", None)
    if transfers is None:
        return
    summary["kv_transfer_ms"] = distribution(transfers, percentiles)
    if "engine" in summary:
        gpu_spec = run.resolved.gpu_spec
        summary["engine"]["pools"] = {
            pool: summarize_engine([it for it in iterations if it.get("pool") == pool], gpu_spec,
                                   run.resolved.dtype)
            for pool in ("prefill", "decode")
        }
