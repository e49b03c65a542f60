"""Metrics with vLLM's benchmark definitions, so numbers compare across tools.

TTFT and E2EL are measured from the request's *intended* start (the open-loop arrival schedule),
so a client that falls behind cannot hide server queueing (no coordinated omission); the send
lag (actual send - when the client was ready to send) is reported beside them. Under
--max-concurrency the wait for a slot is part of the intended-start figures and is reported on
its own (slot_wait_ms), with TTFT/E2EL from the send beside them (vLLM's benchmark measures
from the send). TPOT per request is (E2EL - TTFT) / (output - 1)
over requests with more than one output token; ITL pools the per-token gaps of every request
(an event of k tokens after a gap g counts k gaps of g/k; event_gap_ms is the gap per event).
TTFT counts to the first token of any kind (vLLM), TTFOT to the first answer or tool-call
token (reasoning left out). Distributions use numpy.percentile (linear interpolation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cbbench.analysis.records import RequestRecord
from cbbench.analysis.server_side.server_cache import server_prefix_cache
from cbbench.analysis.summary.columns import (
    MS,
    NOT_ASKED,
    RequestColumns,
    as_columns,
    token_gaps_s,
)
from cbbench.analysis.summary.histogram import log_histogram
from cbbench.analysis.summary.percentiles import DEFAULT_PERCENTILES, percentile_key
from cbbench.analysis.summary.token_counts import short_output_figures
from cbbench.engine.sim.gpu_specs import GPUSpec
from cbbench.errors import UsageError

LATENCY_NAMES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "event_gap_ms", "tokens_per_event",
                 "ttfot_ms", "reasoning_time_ms", "reasoning_tokens", "reasoning_share")


def distribution(values_ms: Sequence[float] | np.ndarray, percentiles=DEFAULT_PERCENTILES) -> dict:
    a = np.asarray(values_ms, dtype=np.float64)
    if a.size == 0:
        return {"mean": None, "std": None, **{percentile_key(p): None for p in percentiles}, "count": 0}
    pct = np.percentile(a, percentiles)
    return {
        "mean": float(a.mean()),
        "std": float(a.std()),
        **{percentile_key(p): float(v) for p, v in zip(percentiles, pct)},
        "count": int(a.size),
    }


def weighted_distribution(
    values_ms: np.ndarray, weights: np.ndarray, percentiles=DEFAULT_PERCENTILES
) -> dict:
    """``distribution`` of the multiset in which ``values_ms[j]`` occurs ``weights[j]`` times,
    without expanding it (a million-request run pools ~200M per-token gaps from ~4M step
    gaps). The percentiles are bit-identical to numpy.percentile on the expanded array (the
    same two order statistics, found by cumulative weight, and numpy's own interpolation);
    mean and std are weighted sums, equal to the expanded ones to float rounding (the order of
    summation differs: numpy sums the expanded array pairwise)."""
    v = np.asarray(values_ms, dtype=np.float64)
    w = np.asarray(weights, dtype=np.int64)
    keep = w > 0
    if not keep.all():
        v, w = v[keep], w[keep]
    n = int(w.sum())
    if n == 0:
        return distribution([], percentiles)
    wf = w.astype(np.float64)
    mean = float(np.dot(v, wf) / n)
    dev = v - mean
    std = float(np.sqrt(np.dot(np.square(dev, out=dev), wf) / n))
    del dev
    pct = weighted_percentiles(v, w, percentiles)
    return {
        "mean": mean,
        "std": std,
        **{percentile_key(p): float(x) for p, x in zip(percentiles, pct)},
        "count": n,
    }


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, percentiles) -> np.ndarray:
    """numpy.percentile's default (linear, Hyndman & Fan's 7th) of the expanded multiset
    (``weights`` > 0). Each step is numpy's (numpy/lib/_function_base_impl.py: virtual index
    (n - 1) q, its floor and the next index, clamped at the last, then ``_lerp``), so the
    result is the same float."""
    n = int(weights.sum())
    q = np.true_divide(np.asarray(percentiles), 100)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    above = virtual >= n - 1  # numpy takes the last value twice there (then b - a == 0)
    lo = np.where(above, n - 1, prev).astype(np.int64)
    hi = np.where(above, n - 1, prev + 1).astype(np.int64)
    ranks = np.unique(np.concatenate((lo, hi)))
    at = dict(zip(ranks.tolist(), weighted_order_statistics(values, weights, ranks).tolist()))
    a = np.array([at[r] for r in lo.tolist()])
    b = np.array([at[r] for r in hi.tolist()])
    t = virtual - prev
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


# Radix selection: a non-negative double's bits, read as an unsigned integer, order as the
# double does; their top 64 - SHIFT bits (sign, exponent, 8 mantissa bits) name a bucket.
_BUCKET_SHIFT = np.uint64(44)


def weighted_order_statistics(values: np.ndarray, weights: np.ndarray,
                              ranks: np.ndarray) -> np.ndarray:
    """The values at 0-based ``ranks`` of the expanded multiset. Non-negative values: each
    rank's bucket by cumulative bucket weight, then that bucket's few values sorted (no sort
    of the whole array: argsort of 4M gaps costs ~1 s); otherwise one argsort."""
    v = np.asarray(values, dtype=np.float64)
    if not (np.isfinite(v).all() and (v >= 0).all()):
        order = np.argsort(v, kind="stable")
        cum = np.cumsum(weights[order])
        return v[order][np.searchsorted(cum, ranks, side="right")]
    # + 0.0: no -0.0 (its sign bit would sort it last); the keys are < 2^20: int64 as they are.
    keys = ((v + 0.0).view(np.uint64) >> _BUCKET_SHIFT).view(np.int64)
    cum_bucket = np.cumsum(np.bincount(keys, weights=weights.astype(np.float64)))
    bucket = np.searchsorted(cum_bucket, ranks, side="right")
    out = np.empty(len(ranks))
    for b in np.unique(bucket).tolist():
        mine = keys == b
        vb, wb = v[mine], weights[mine]
        order = np.argsort(vb, kind="stable")
        before = int(cum_bucket[b - 1]) if b else 0
        cum = before + np.cumsum(wb[order])
        sel = bucket == b
        out[sel] = vb[order][np.searchsorted(cum, ranks[sel], side="right")]
    return out


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=500,tpot=50' -> {'ttft': 500.0, 'tpot': 50.0} (milliseconds): the limits of the one
    SLO grammar (cbbench.analysis.summary.slo). Goodput judges each request against every limit, so a
    _pNN attainment suffix, which judges a whole run, is refused here rather than ignored."""
    from cbbench.analysis.summary.slo import parse_attainment_slo

    spec = parse_attainment_slo(text)
    if spec is None:
        return {}
    if spec.source == "suffix":
        raise UsageError(
            f"invalid SLO {(text or '').strip()!r}: a _pNN suffix sets an attainment, which sweep and "
            "capacity judge; goodput counts each request against KEY=MS, e.g. --slo "
            "ttft=500,tpot=50"
        )
    return dict(spec.limits_ms)


def meets_slo(cols: RequestColumns, slo: dict[str, float]) -> np.ndarray:
    """Per request: completed, and every limit met (a request with no TPOT passes it).

    A request that waited for a --max-concurrency slot is judged on its TTFT and E2EL from
    the send: the wait is the client's own closed loop, not the server's latency, and counted
    from the intended start a closed loop would miss any SLO whatever the server does (vLLM's
    --goodput times TTFT inside its concurrency semaphore; AIPerf and GuideLLM likewise).
    Open-loop requests keep the intended start (no coordinated omission). TPOT has no start."""
    meets = cols.ok.copy()
    capped = ~np.isnan(cols.slot_s) & cols.sent
    ttft_ms = np.where(capped, (cols.first_token_s - cols.send_s) * MS, cols.ttft_ms)
    e2el_ms = np.where(capped, (cols.last_token_s - cols.send_s) * MS, cols.e2el_ms)
    checks = {"ttft": (ttft_ms, cols.ok), "tpot": (cols.tpot_ms, cols.has_tpot),
              "e2el": (e2el_ms, cols.ok)}
    for key, limit_ms in slo.items():
        values, known = checks[key]
        meets &= ~(known & (values > limit_ms))
    return meets


def itl_values_s(records: Sequence[RequestRecord]) -> np.ndarray:
    """Per-token inter-token latencies, pooled over the completed requests."""
    gaps = [token_gaps_s(r)[0] for r in records if r.ok and len(r.token_times_s) > 1]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def pooled_distribution(pooled: tuple[np.ndarray, np.ndarray | None],
                        percentiles=DEFAULT_PERCENTILES) -> dict:
    """``distribution`` of a TokenTimes pool: expanded (numpy's own), or weighted."""
    values, weights = pooled
    if weights is None:
        return distribution(values, percentiles)
    return weighted_distribution(values, weights, percentiles)


def itl_histogram(cols: RequestColumns,
                  pooled: tuple[np.ndarray, np.ndarray | None] | None = None) -> dict:
    """summary.itl_histogram: the completed requests' pooled per-token gaps."""
    values, weights = pooled if pooled is not None else cols.tokens.pooled_gaps_ms(
        np.flatnonzero(cols.ok))
    return log_histogram(values, weights)


def latency_distributions(cols: RequestColumns, rows: np.ndarray,
                          percentiles=DEFAULT_PERCENTILES, names: Sequence[str] = LATENCY_NAMES,
                          pooled: tuple[np.ndarray, np.ndarray | None] | None = None) -> dict:
    """TTFT, TPOT, ITL and E2EL of the completed requests ``rows`` (ascending), in ms (vLLM's
    definitions); ITL per token, with the per-event gap and tokens per event beside it; TTFOT
    and the reasoning figures (analysis/records.py). ``pooled``: the rows' per-token gaps,
    if they are at hand."""
    tokens = cols.tokens
    out: dict = {}
    if "ttft_ms" in names:
        out["ttft_ms"] = distribution(cols.ttft_ms[rows], percentiles)
    if "tpot_ms" in names:
        out["tpot_ms"] = distribution(cols.tpot_ms[rows[cols.has_tpot[rows]]], percentiles)
    if "itl_ms" in names:
        out["itl_ms"] = pooled_distribution(
            pooled if pooled is not None else tokens.pooled_gaps_ms(rows), percentiles)
    if "e2el_ms" in names:
        out["e2el_ms"] = distribution(cols.e2el_ms[rows], percentiles)
    if "event_gap_ms" in names:
        out["event_gap_ms"] = (dict(out["itl_ms"]) if tokens.one_token_per_event
                               else pooled_distribution(tokens.event_gaps_ms(rows), percentiles))
    if "tokens_per_event" in names:
        out["tokens_per_event"] = pooled_distribution(tokens.tokens_per_event(rows), percentiles)
    ttfot_s = cols.ttfot_s[rows]
    known = ~np.isnan(ttfot_s)
    if "ttfot_ms" in names:
        out["ttfot_ms"] = distribution(ttfot_s[known] * MS, percentiles)
    reasoning = cols.reasoning_tokens[rows]
    said = ~np.isnan(reasoning)
    if "reasoning_time_ms" in names:
        # From the first token to the first output token: requests that reasoned, then answered.
        both = said & (reasoning != 0) & known
        ttft_s = cols.first_token_s[rows] - cols.intended_start_s[rows]
        out["reasoning_time_ms"] = distribution((ttfot_s[both] - ttft_s[both]) * MS, percentiles)
    if "reasoning_tokens" in names:
        out["reasoning_tokens"] = distribution(reasoning[said], percentiles)
    if "reasoning_share" in names:
        n = cols.output_tokens[rows]
        share = said & (n > 0)
        out["reasoning_share"] = distribution(reasoning[share] / n[share], percentiles)
    return out


def summarize(
    run: RequestColumns | Sequence[RequestRecord],
    duration_s: float,
    slo: dict[str, float] | None = None,
    percentiles=DEFAULT_PERCENTILES,
    pooled: tuple[np.ndarray, np.ndarray | None] | None = None,
) -> dict:
    """The run's summary (records are converted: columns.request_columns). ``pooled``: the
    completed requests' per-token gaps, if they are at hand."""
    cols = as_columns(run)
    done = np.flatnonzero(cols.ok)
    failed = np.flatnonzero(cols.failed)
    out_tokens = int(cols.output_tokens[done].sum())
    in_tokens = int(cols.prompt_tokens[done].sum())
    dur = duration_s if duration_s > 0 else float("inf")  # nothing ran: rates are 0
    # The client's own lag: from when it was ready to send (a freed slot under a cap).
    sent = cols.sent
    slot = ~np.isnan(cols.slot_s)
    ready = np.where(slot, cols.slot_s, cols.intended_start_s)
    cancelled = int(cols.cancelled.sum())
    summary = {
        # Cancelled: apart, neither completed nor failed.
        **run_totals(len(done), len(failed), cancelled,
                     cols.error_types_of(failed), duration_s, in_tokens, out_tokens),
        **latency_distributions(cols, done, percentiles, pooled=pooled),
        "send_lag_ms": distribution((cols.send_s[sent] - ready[sent]) * MS, percentiles),
    }
    if cancelled:
        summary["cancelled_work"] = cancelled_work(cols)
    cache = (server_prefix_cache(cols.records) if cols.records is not None else None)
    if cache is not None:  # the server's own count (usage.prompt_tokens_details)
        summary["server_prefix_cache"] = cache
    if slot.any():  # closed loop: both latency bases
        summary["latency_basis"] = "intended_start"
        summary["slot_wait_ms"] = distribution(
            (cols.slot_s[slot] - cols.intended_start_s[slot]) * MS, percentiles)
        summary["from_send"] = {
            "ttft_ms": distribution((cols.first_token_s[done] - cols.send_s[done]) * MS,
                                    percentiles),
            "e2el_ms": distribution((cols.last_token_s[done] - cols.send_s[done]) * MS,
                                    percentiles),
        }
    if (cols.max_tokens != NOT_ASKED).any():
        summary["short_outputs"] = short_output_figures(cols).to_dict()
    priorities = np.unique(cols.priority)
    if len(priorities) > 1:
        summary["per_priority"] = per_priority(cols, priorities.tolist(), percentiles)
    if slo:
        from cbbench.analysis.summary.slo import SLO_BASIS_SEND, attainment

        meets = meets_slo(cols, slo)
        summary["slo"] = dict(slo)
        summary["goodput"] = int(meets.sum()) / dur
        summary["slo_attainment"] = attainment(meets, cols.cancelled)  # cancels apart
        if slot.any():  # closed loop: judged from the send (meets_slo)
            summary["slo_basis"] = SLO_BASIS_SEND
    return summary


def run_totals(completed: int, failed: int, cancelled: int, error_types: dict[str, int],
               duration_s: float, in_tokens: int, out_tokens: int) -> dict:
    """The summary's counts, token totals and throughputs (a run of no time: rates 0)."""
    dur = duration_s if duration_s > 0 else float("inf")
    return {
        "completed": completed,
        "failed": failed,
        "cancelled": cancelled,
        "error_types": error_types,
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": completed / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
    }


def cancelled_work(cols: RequestColumns) -> dict:
    """What the server did for requests the client cancelled: their prompts (sent) and the
    output tokens streamed before the cancel. Part of the server's load, in no latency."""
    gone = cols.cancelled
    return {
        "requests": int(gone.sum()),
        "prompt_tokens": int(cols.prompt_tokens[gone].sum()),
        "output_tokens": int(cols.output_tokens[gone].sum()),
        "with_first_token": int((gone & cols.has_tokens).sum()),
    }


PER_PRIORITY_PERCENTILES = (50, 99)  # the table's short form of the default list


def per_priority(cols: RequestColumns, priorities: Sequence[int],
                 percentiles=DEFAULT_PERCENTILES) -> dict:
    """TTFT and TPOT per priority class (keys are the priorities as strings, as JSON has
    them), for runs whose requests carry more than one priority: mean and the run's
    percentiles (--percentiles); under the default list its short form, mean, p50 and p99."""
    if tuple(map(float, percentiles)) == tuple(map(float, DEFAULT_PERCENTILES)):
        percentiles = PER_PRIORITY_PERCENTILES
    stats = ("mean", *map(percentile_key, percentiles))

    def short(values_ms: np.ndarray) -> dict:
        d = distribution(values_ms, percentiles)
        return {k: d[k] for k in stats}

    out = {}
    for p in priorities:
        mine = cols.priority == p
        done = mine & cols.ok
        out[str(p)] = {
            "completed": int(done.sum()),
            "failed": int((mine & cols.failed).sum()),
            "ttft_ms": short(cols.ttft_ms[done]),
            "tpot_ms": short(cols.tpot_ms[done & cols.has_tpot]),
        }
    return out


# The iteration fields the engine summary (and the steady state's running count: start_s)
# reads: always there, and added later (0 in results from before they existed;
# emitted_tokens and num_sampled_reqs: None rates instead).
ENGINE_FIELDS = ("num_prefill_tokens", "num_decode_tokens", "token_budget", "kv_blocks_used",
                 "kv_blocks_total", "start_s", "duration_s", "num_running", "num_preempted")
ENGINE_LATER_FIELDS = ("bytes_moved", "flops", "num_swapped_out_blocks",
                       "num_swapped_in_blocks", "swap_time_s", "num_cached_tokens",
                       "num_prefix_queried_tokens", "num_preempted_cached_tokens",
                       "num_preempted_queried_tokens")
RATE_FIELDS = ("emitted_tokens", "num_sampled_reqs")


def engine_columns(iterations: Sequence[dict]) -> dict[str, np.ndarray]:
    """The columns summarize_engine_columns and steady_state read, from iteration dicts."""
    cols = {k: np.array([it[k] for it in iterations]) for k in ENGINE_FIELDS}
    cols |= {k: np.array([it.get(k, 0) for it in iterations]) for k in ENGINE_LATER_FIELDS}
    if iterations and "emitted_tokens" in iterations[0]:
        cols |= {k: np.array([it[k] for it in iterations]) for k in RATE_FIELDS}
    # The engine that ran each (a data-parallel replica, a disaggregated pool): the steady
    # state's running count sums the engines' own counts.
    if any("replica" in it for it in iterations):
        cols["replica"] = np.array([-1 if it.get("replica") is None else it["replica"]
                                    for it in iterations])
    if any("pool" in it for it in iterations):
        cols["pool"] = np.array([str(it.get("pool") or "") for it in iterations])
    return cols


def gpu_of(gpu_spec: dict | None) -> GPUSpec | None:
    """The engine's GPU (EngineInfo.gpu_spec, a GPUSpec's dict) as its spec; None when the
    engine ran on no known GPU."""
    return GPUSpec(**gpu_spec) if gpu_spec else None


def add_utilization(it: dict, gpu: GPUSpec, dtype: str = "bf16") -> None:
    """An iteration row's MBU and MFU: analytic bytes (FLOPs) over its time, over the GPU's
    peak, the FLOP peak the run's dtype's (fp32: the FP32 peak; gpu_specs.peak_flops) (the
    object path's rows and a compact run's, compact_rows)."""
    d = it["duration_s"]
    peak = gpu.peak_flops(dtype)
    it["mbu"] = it["bytes_moved"] / d / gpu.hbm_bandwidth if d > 0 else None
    it["mfu"] = it["flops"] / d / peak if d > 0 and peak else None


def summarize_engine(iterations: Sequence[dict], gpu_spec: dict | None = None,
                     dtype: str = "bf16") -> dict:
    """Engine facts from the per-iteration records (as dicts, the result's form)."""
    return summarize_engine_columns(engine_columns(iterations), gpu_spec, dtype)


def _total(col: np.ndarray):
    """A column's sum as the dict path took it: exact for integers; for floats, Python's
    sum over the values in order (numpy sums pairwise: another rounding)."""
    return col.sum().item() if col.dtype.kind in "iub" else sum(col.tolist())


def summarize_engine_columns(cols, gpu_spec: dict | None = None, dtype: str = "bf16") -> dict:
    """Engine facts from the iteration records' columns (``engine_columns``, or a compact
    run's StepTable). With a GPU spec, also MBU/MFU: time-weighted (total analytic bytes or
    FLOPs over busy time, over peak: the FLOP peak ``dtype``'s)."""
    if len(cols["duration_s"]) == 0:
        return {"num_iterations": 0}

    def f(name: str) -> np.ndarray:
        col = np.asarray(cols[name])
        if col.ndim == 1 and col.size and col.strides[0] == 0:  # one value throughout
            return np.broadcast_to(np.float64(col[0]), col.shape)
        return col.astype(np.float64, copy=False)

    # One column or two at a time (a million-request run has ~4M iterations: 32 MB each).
    dur = f("duration_s")
    busy = float(dur.sum())
    pre, dec = f("num_prefill_tokens"), f("num_decode_tokens")
    batch = pre + dec
    batch_stats = {
        "mean_batch_tokens": float(batch.mean()),
        "token_budget_utilization": float((batch / f("token_budget")).mean()),
    }
    del batch
    def time_mean(col: np.ndarray) -> float:
        # A gauge's mean (vLLM's kv_cache_usage_perc, num_requests_running): each step's value
        # held for its duration, over busy time, as a scrape or the steady-state level reads
        # it; per step, a 5 ms decode step would weigh as much as a 50 ms prefill.
        return float((col * dur).sum() / busy) if busy > 0 else float(col.mean())

    kv_usage = f("kv_blocks_used") / f("kv_blocks_total")
    kv_stats = {"peak_kv_usage": float(kv_usage.max()), "mean_kv_usage": time_mean(kv_usage)}
    del kv_usage
    nbytes = f("bytes_moved")
    util = {}
    gpu = gpu_of(gpu_spec)
    if gpu is not None and busy > 0:
        util = {
            "mbu": float(nbytes.sum() / busy / gpu.hbm_bandwidth),
            "mfu": (float(f("flops").sum() / busy / peak)
                    if (peak := gpu.peak_flops(dtype)) else None),
        }
        decode_only = (pre == 0) & (dec > 0)
        if decode_only.any():
            util["decode_mbu"] = float(
                nbytes[decode_only].sum() / dur[decode_only].sum() / gpu.hbm_bandwidth
            )
    return {
        "num_iterations": len(dur),
        "busy_time_s": busy,
        "mean_iteration_ms": float(dur.mean() * MS),
        "mean_prefill_tokens": float(pre.mean()),
        "mean_decode_tokens": float(dec.mean()),
        **batch_stats,
        "mean_running": time_mean(f("num_running")),
        **kv_stats,
        "num_preemptions": int(_total(np.asarray(cols["num_preempted"]))),
        "total_prefill_tokens": int(pre.sum()),
        **_token_rates(cols, len(dur)),
        **_policy_totals(cols),
        # Time-weighted: total analytic bytes over total busy time.
        "mean_achieved_bw_gbps": float(nbytes.sum() / busy / 1e9) if busy > 0 else 0.0,
        **util,
    }


def _token_rates(cols, n: int) -> dict:
    """Output tokens per step: per iteration, and per request that gained tokens in it (1.0
    without speculative decoding; 1 + accepted drafts per step with it). None for results
    from before these fields existed."""
    if "emitted_tokens" not in cols:
        return {"mean_emitted_tokens": None, "tokens_per_request_step": None}
    emitted = _total(np.asarray(cols["emitted_tokens"]))
    sampled = _total(np.asarray(cols["num_sampled_reqs"]))
    return {
        "mean_emitted_tokens": emitted / n,
        "tokens_per_request_step": emitted / sampled if sampled else None,
    }


def _policy_totals(cols) -> dict:
    """Swap traffic and prefix-cache hits summed over the run (0 for results from before these
    fields existed). The hit rate is hit tokens over the tokens looked up at a request's first
    scheduling, as vLLM's vllm:prefix_cache_hits / queries; None when nothing was looked up
    (prefix caching off). Requests resumed after a preemption re-find their own blocks: vLLM
    counts them apart (preempted_hits / preempted_queries), and so do the
    ``prefix_cache_preempted_*`` keys, there only where one was looked up."""

    def total(key: str):
        return _total(np.asarray(cols[key])) if key in cols else 0

    queried = total("num_prefix_queried_tokens")
    hits = total("num_cached_tokens")
    out = {
        "num_swapped_out_blocks": int(total("num_swapped_out_blocks")),
        "num_swapped_in_blocks": int(total("num_swapped_in_blocks")),
        "swap_time_s": float(total("swap_time_s")),
        "prefix_cache_hit_tokens": int(hits),
        "prefix_cache_hit_rate": hits / queried if queried else None,
    }
    preempted_queried = total("num_preempted_queried_tokens")
    if preempted_queried:
        preempted_hits = total("num_preempted_cached_tokens")
        out["prefix_cache_preempted_hit_tokens"] = int(preempted_hits)
        out["prefix_cache_preempted_hit_rate"] = preempted_hits / preempted_queried
    return out
