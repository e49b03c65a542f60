"""The summary table printed after a run (tabulate)."""

from __future__ import annotations

from tabulate import tabulate

LATENCY_KEYS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2EL", "e2el_ms"))
STATS = ("mean", "p50", "p90", "p99")
# Shown when any request reasoned (TTFT counts to the first token of any kind).
REASONING_ROWS = (
    ("TTFOT (ms)", "ttfot_ms"), ("reasoning time (ms)", "reasoning_time_ms"),
    ("reasoning tokens", "reasoning_tokens"), ("reasoning share", "reasoning_share"),
)


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


CLIENT_BOUND_MARK = " *"


def latency_table(summary: dict, stats: tuple[str, ...] = STATS) -> str:
    """The latency distributions' rows; ``stats`` the columns (--percentiles, else STATS)."""
    rows = []
    bound = (summary.get("client_bound") or {}).get("metrics") or ()
    for label, key in LATENCY_KEYS:
        d = summary.get(key) or {}
        mark = CLIENT_BOUND_MARK if key in bound else ""
        rows.append([f"{label} (ms){mark}", *(_fmt(d.get(s)) for s in stats)])
    tpe = summary.get("tokens_per_event") or {}
    if (tpe.get("mean") or 1) > 1:  # several tokens per event: the per-event gap beside ITL
        d = summary.get("event_gap_ms") or {}
        rows.append(["event gap (ms)", *(_fmt(d.get(s)) for s in stats)])
        rows.append(["tokens / event", *(_fmt(tpe.get(s)) for s in stats)])
    if (summary.get("reasoning_tokens") or {}).get("p99"):  # a request reasoned
        for label, key in REASONING_ROWS:
            d = summary.get(key) or {}
            rows.append([label, *(_fmt(d.get(s)) for s in stats)])
    from_send = summary.get("from_send")
    if from_send:  # --max-concurrency: both bases, labelled
        rows.append(["slot wait (ms)", *(_fmt(summary["slot_wait_ms"].get(s)) for s in stats)])
        for label, key in (("TTFT", "ttft_ms"), ("E2EL", "e2el_ms")):
            d = from_send.get(key) or {}
            rows.append([f"{label} from send (ms)", *(_fmt(d.get(s)) for s in stats)])
    table = tabulate(rows, headers=["", *stats], tablefmt="simple", disable_numparse=True)
    if from_send:
        table += (
            "\nTTFT and E2EL count from the intended start (the wait for a --max-concurrency "
            "slot included);\nthe 'from send' rows leave that wait out (as vLLM's benchmark)."
        )
    if bound:
        table += "\n* client-bound: " + " ".join(summary["client_bound"].get("reasons") or [])
    return table


def workers_table(workers: list[dict] | None) -> str:
    """One row per load-generator worker, when there are several or one did not finish."""
    if not workers or (len(workers) == 1 and workers[0].get("status") == "done"):
        return ""
    rows = []
    # --cancel-rate: sent = ok + failed + cancelled, so the column shows when any were.
    cancelled = any(w.get("cancelled") for w in workers)
    for w in workers:
        cpu = w.get("client_cpu_util")
        rows.append([
            w["worker"], w["status"], w.get("host") or "-", w["sent"], w["completed"],
            w["failed"], *([w["cancelled"]] if cancelled else []), w["not_sent"],
            _fmt(w.get("send_lag_p50_ms")),
            _fmt(w.get("send_lag_p99_ms")), _fmt(w.get("loop_lag_p99_ms")),
            "-" if cpu is None else f"{cpu:.0%}",
            "-" if w.get("clock_uncertainty_ms") is None else _fmt(w["clock_uncertainty_ms"], 3),
        ])
    headers = ["worker", "status", "host", "sent", "ok", "failed",
               *(["cancelled"] if cancelled else []), "not sent", "lag p50 ms",
               "lag p99 ms", "loop p99 ms", "CPU", "clock ± ms"]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def throughput_table(summary: dict) -> str:
    rows = [
        ["completed / failed", f"{summary['completed']} / {summary['failed']}"]
        if not summary.get("cancelled") else
        ["completed / failed / cancelled",
         f"{summary['completed']} / {summary['failed']} / {summary['cancelled']}"],
        ["duration (s)", _fmt(summary["duration_s"], 3)],
        ["request throughput (req/s)", _fmt(summary["request_throughput"])],
        ["output throughput (tok/s)", _fmt(summary["output_throughput"], 1)],
        ["total token throughput (tok/s)", _fmt(summary["total_token_throughput"], 1)],
    ]
    rows += input_rows(summary)
    short = summary.get("short_outputs")
    if short and short["checked"]:
        rows.append(
            ["short outputs (< max_tokens)", f"{short['count']} / {short['checked']} "
             f"(mean shortfall {short['mean_shortfall']:.1f} tok)"]
        )
    cache = summary.get("server_prefix_cache")
    if cache and cache.get("hit_rate") is not None:
        rows.append(["server prefix cache hit rate", f"{cache['hit_rate']:.1%} "
                     f"({cache['cached_tokens']:,} / {cache['prompt_tokens']:,} tok)"])
    if "goodput" in summary:
        rows.append(["goodput (req/s)", _fmt(summary["goodput"])])
        rows.append(["SLO attainment", f"{summary['slo_attainment']:.1%}"])
    return tabulate(rows, tablefmt="simple", disable_numparse=True)


def input_rows(summary: dict) -> list[list[str]]:
    """Embeddings/rerank input throughput, images and payload bytes (analysis/summary/inputs.py)."""
    rows = []
    if "input_throughput" in summary:
        rows.append(["input throughput (tok/s)", _fmt(summary["input_throughput"], 1)])
        rows.append(["inputs sent", _fmt(summary.get("inputs"))])
    im = summary.get("images")
    if im:
        split = ("" if im.get("image_tokens") is None else
                 f"; prompt tokens {im['image_tokens']:,} image / {im['text_tokens']:,} text")
        rows.append(["images", f"{im['images']:,} in {im['requests']:,} requests{split}"])
    payload = summary.get("request_bytes")
    if payload and payload.get("mean") is not None:
        rows.append(["request payload (bytes, mean)", _fmt(payload["mean"], 0)])
    return rows


def engine_table(eng: dict) -> str:
    if not eng or not eng.get("num_iterations"):
        return ""
    rows = [
        ["iterations", _fmt(eng["num_iterations"])],
        ["mean iteration (ms)", _fmt(eng["mean_iteration_ms"], 3)],
        ["mean prefill tokens / iter", _fmt(eng["mean_prefill_tokens"], 1)],
        ["mean decode tokens / iter", _fmt(eng["mean_decode_tokens"], 1)],
        ["token budget use", f"{eng['token_budget_utilization']:.1%}"],
        ["mean running requests", _fmt(eng["mean_running"], 1)],
        ["peak / mean KV use", f"{eng['peak_kv_usage']:.1%} / {eng['mean_kv_usage']:.1%}"],
        ["preemptions", _fmt(eng["num_preemptions"])],
        ["analytic bandwidth (GB/s)", _fmt(eng["mean_achieved_bw_gbps"], 1)],
    ]
    if eng.get("prefix_cache_hit_rate") is not None:
        rows.append(["prefix cache hit rate", f"{eng['prefix_cache_hit_rate']:.1%}"])
    if eng.get("mbu") is not None:
        rows.append(["analytic MBU / MFU", f"{eng['mbu']:.1%} / {eng['mfu']:.1%}"])
    return tabulate(rows, tablefmt="simple", disable_numparse=True)


def speculative_line(spec: dict | None) -> str:
    """summary.speculative in one line (engine or scraped counters)."""
    if not spec:
        return ""
    rate, length = spec.get("acceptance_rate"), spec.get("mean_acceptance_length")
    k = f", K={spec['speculative_tokens']}" if spec.get("speculative_tokens") else ""
    return (
        f"speculative decoding ({spec.get('source')}{k}): acceptance rate "
        f"{'-' if rate is None else f'{rate:.1%}'}, mean acceptance length "
        f"{'-' if length is None else f'{length:.2f}'}"
    )


TURN_ROWS_SHOWN = 8  # the first turns; the result file holds them all


def by_turn_table(summary: dict) -> str:
    """TTFT and TPOT by turn index, for multi-turn runs."""
    turns = summary.get("by_turn") or []
    if not turns:
        return ""
    rows = [
        [t["turn"], t["completed"], _fmt(t.get("mean_prompt_tokens"), 0),
         *(_fmt(t["ttft_ms"].get(s)) for s in ("p50", "p99")),
         *(_fmt(t["tpot_ms"].get(s)) for s in ("p50", "p99"))]
        for t in turns[:TURN_ROWS_SHOWN]
    ]
    table = tabulate(
        rows, headers=["turn", "completed", "prompt", "TTFT p50", "TTFT p99", "TPOT p50",
                       "TPOT p99"],
        tablefmt="simple", disable_numparse=True,
    )
    if len(turns) > TURN_ROWS_SHOWN:
        table += f"\n(turns {TURN_ROWS_SHOWN + 1}-{turns[-1]['turn']}: see summary.by_turn)"
    ses = summary.get("sessions")
    if ses:
        table += (
            f"\nsessions: {ses['completed']} of {ses['count']} completed, "
            f"{ses['turns_sent']} of {ses['turns_planned']} turns sent"
        )
        split = [(label, (ses.get(key) or {}).get("p50")) for label, key in (
            ("end to end", "duration_s"), ("in the model", "time_in_model_s"),
            ("in tools", "time_in_tools_s"), ("in sub-agents", "time_in_subagents_s"))]
        if any(v for label, v in split[2:]):  # an agent workload: where its time went
            table += "\nper session, p50 (s): " + ", ".join(
                f"{label} {v:.3f}" for label, v in split if v is not None)
    return table


def server_latency_table(http: dict | None) -> str:
    """The server's own p50 (vLLM's histograms) beside the client's, with the difference, and
    the difference of the two means (exact on the server's side, unlike its p50)."""
    lat = (http or {}).get("server_latency")
    if not lat:
        return ""
    rows = []
    for label, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"),
                       ("E2EL", "e2el_ms")):
        d = lat.get(key)
        if d:
            lo, hi = d.get("server_p50_bucket") or (None, None)
            diff = _fmt(d["diff_p50"])
            if d.get("client_within_bucket"):  # below the histogram's resolution
                diff = f"within bucket {_fmt(lo, 0)}-{_fmt(hi, 0)}"
            rows.append([
                f"{label} p50 (ms)", _fmt(d["server_p50"]), _fmt(d["client_p50"]), diff,
                _fmt(d.get("diff_mean")),  # absent from results written before it existed
            ])
    return tabulate(
        rows,
        headers=["", "server", "client (from send)", "client - server", "diff of means"],
        tablefmt="simple", disable_numparse=True,
    )


# How the steady window was chosen, in words (summary.steady_state.method).
STEADY_HOW = {
    "running_requests": "the engine ran a steady ~{level:g} requests",
    "in_flight_requests": "a steady ~{level:g} requests were in flight",
    "warmup_cooldown": "--warmup and --cooldown left out",
}


def steady_state_line(summary: dict) -> str:
    """The steady-state window and its headline figures, under the whole-run ones, in words:
    the span the run held its load, its ramp-up and drain left out."""
    ss = summary.get("steady_state")
    if not ss:
        return ""
    if not ss.get("window_s"):
        return f"steady state: none ({ss.get('note', ss.get('method'))})"
    a, b = ss["window_s"]
    ttft, tpot = ss["ttft_ms"], ss["tpot_ms"]
    how = STEADY_HOW.get(ss["method"], ss["method"])
    if "{level" in how:
        how = how.format(level=round(ss["level"], 1)) if ss.get("level") is not None else \
            how.split(" ~")[0].replace("a steady", "steady") + " requests"
    if ss["method"] != "warmup_cooldown":
        how += "; ramp-up and drain left out"
    if "input_throughput" in summary:  # embeddings / rerank: inputs, no output tokens
        rate = f"{_fmt(ss['total_token_throughput'] - ss['output_throughput'], 1)} input tok/s"
    else:
        rate = f"{_fmt(ss['output_throughput'], 1)} output tok/s"
    line = (
        f"steady state, {a:.2f}-{b:.2f} s of the run ({how}): {ss['requests']} requests, "
        f"TTFT p50 {_fmt(ttft.get('p50'))} / p99 {_fmt(ttft.get('p99'))} ms, "
        f"TPOT p50 {_fmt(tpot.get('p50'))} / p99 {_fmt(tpot.get('p99'))} ms, {rate}"
    )
    return line + (f"\n  note: {ss['note']}" if ss.get("note") else "")


def telemetry_line(tel: dict | None) -> str:
    """Measured HBM utilization, to read beside the analytic MBU above."""
    if not tel:
        return ""
    if not tel.get("available"):
        return f"GPU telemetry: unavailable ({tel.get('reason')})"
    run = (tel.get("summary") or {}).get("steady") or {}
    bw = run.get("dram_bw_util_pct") or {}
    sm = run.get("sm_util_pct") or {}
    metric = tel.get("metric")
    fmt = lambda v: "-" if v is None else f"{v:.1f}%"  # noqa: E731
    return (
        f"GPU telemetry ({metric}, steady state): HBM util mean {fmt(bw.get('mean'))}, "
        f"p90 {fmt(bw.get('p90'))}; SM util mean {fmt(sm.get('mean'))}"
    )


def header_lines(cfg: dict, summary: dict) -> list[str]:
    """What was run, before its figures: the target (engine, model, GPU, scheduler, or the
    endpoint and its model), the cluster (replicas, router, disaggregation) and the arrivals."""
    label = f"{cfg['label']} · " if cfg.get("label") else ""
    title = f"cbbench · {label}{cfg.get('workload')} · "
    if cfg.get("target") == "engine":
        title += f"engine {cfg.get('engine')} · {cfg.get('model')}"
        if cfg.get("gpu"):
            title += f" on {cfg.get('gpu')}"
        sched = str(cfg.get("scheduler"))
        if cfg.get("chunked_prefill") and sched == "continuous":
            sched += " + chunked prefill"
        title += f" · {sched}"
    elif cfg.get("target") == "http":
        model = cfg.get("served_model") or cfg.get("model") or "(the server's default)"
        title += f"endpoint {_endpoints(cfg)} · model {model}"
        if cfg.get("api"):
            title += f" · --api {cfg.get('api')}"
    else:
        title += str(cfg.get("target"))
    lines = [title]
    cluster = cluster_line(cfg)
    if cluster:
        lines.append(cluster)
    arrivals = arrivals_line(cfg)
    if arrivals:
        lines.append(arrivals)
    return lines


def _endpoints(cfg: dict) -> str:
    eps = cfg.get("endpoints")
    if eps and len(eps) > 1:
        return f"{', '.join(eps)} (--balance {cfg.get('balance')})"
    return str(cfg.get("endpoint") or "(not recorded)")


def cluster_line(cfg: dict) -> str:
    """Data-parallel replicas and their router, disaggregated prefill/decode: blank for one
    engine."""
    bits = []
    dp = cfg.get("data_parallel_size") or 1
    if dp > 1:
        bits.append(f"{dp} data-parallel replicas, router {cfg.get('router')}")
    if cfg.get("tensor_parallel_size", 1) > 1:
        bits.append(f"tensor parallel {cfg['tensor_parallel_size']}")
    if cfg.get("disaggregate"):
        bits.append(f"disaggregated prefill:decode {cfg['disaggregate']} instances, KV "
                    f"over {cfg.get('kv_link')}")
    return f"cluster: {'; '.join(bits)}" if bits else ""


def arrivals_line(cfg: dict) -> str:
    """How the requests arrive; with --request-rate inf, what that means for TTFT."""
    noun = "sessions" if cfg.get("sessions") else "requests"  # a multi-turn run counts sessions
    n = f"{cfg['num_requests']} {noun}" if cfg.get("num_requests") else noun
    rate = cfg.get("request_rate")
    if cfg.get("replay"):
        return f"arrivals: replayed from {cfg['replay']}"
    if rate == "inf" and not cfg.get("ramp") and not cfg.get("sessions"):
        return (f"arrivals: all {n} at t=0 (--request-rate inf): TTFT includes each "
                "request's wait behind the others; --request-rate N spreads them")
    if isinstance(rate, (int, float)):
        process = ("Poisson" if cfg.get("arrival") == "gamma" and cfg.get("burstiness") == 1.0
                   else str(cfg.get("arrival")))
        per = "sessions/s" if cfg.get("sessions") else "req/s"
        return f"arrivals: {n} at {rate:g} {per} ({process})"
    return ""


def kv_transfer_line(cfg: dict, summary: dict) -> str:
    """A disaggregated run's prefill-to-decode KV transfer per request."""
    kv = summary.get("kv_transfer_ms")
    if not kv or not kv.get("count"):
        return ""
    return (f"KV transfer prefill -> decode over {cfg.get('kv_link')} (ms per request): mean "
            f"{_fmt(kv.get('mean'))}, p50 {_fmt(kv.get('p50'))}, p99 {_fmt(kv.get('p99'))} "
            f"({kv['count']} requests)")


def render_summary(result: dict) -> str:
    s = result["summary"]
    cfg = result["config"]
    parts_title = header_lines(cfg, s)
    from cbbench.analysis.table_views import breakdown_table, slices_table, stats_of

    stats = stats_of(cfg, STATS)
    parts = [*parts_title, "", throughput_table(s), "", latency_table(s, stats)]
    for extra in (breakdown_table(s, stats), slices_table(s)):
        if extra:
            parts += ["", extra]
    steady = steady_state_line(s)
    if steady:
        parts += ["", steady]
    turns = by_turn_table(s)
    if turns:
        parts += ["", turns]
    server = server_latency_table(s.get("http"))
    if server:
        parts += ["", server]
    workers = workers_table(s.get("workers"))
    if workers:
        parts += ["", workers]
    eng = engine_table(s.get("engine", {}))
    if eng:
        parts += ["", eng]
    kv = kv_transfer_line(cfg, s)
    if kv:
        parts += ["", kv]
    spec = speculative_line(s.get("speculative"))
    if spec:
        parts += ["", spec]
    tel = telemetry_line(result.get("telemetry"))
    if tel:
        parts += ["", tel]
    if result.get("interrupted"):
        parts += ["", "INTERRUPTED: the figures cover only what finished."]
    return "\n".join(parts)
