"""`cbbench calibrate`'s library: real runs' iteration records in, a device profile out.

Each record carries the batch shape the cost model read, so every operator's FLOPs and bytes
are recomputed here from the run's model; analysis/roofline_fit.py fits the device rates
and analysis/roofline_select.py decides which the data determine (see there). The profile
adds the fit's story: each parameter's status (fitted or not identified), relative standard
error and share of time, the residuals per iteration class (the relative errors
summary.engine.sim_error reports) and the iterations used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cbbench.analysis.calibration_inputs import decode_bench
from cbbench.analysis.comparison.sim_error import error_stats, iteration_class
from cbbench.engine.model_config import ModelConfig
from cbbench.engine.sim.cost_model import ATTENTION_OP, BatchShape, CostModel, DeviceRates
from cbbench.engine.sim.device_profile import CPU_DEVICE, DeviceProfile, profile_to_dict
from cbbench.engine.sim.gpu_specs import get_gpu_spec
from cbbench.engine.sim.roofline_fit import (
    BISQUARE_C,
    DISTINCT_DIGITS,
    ED,
    EP,
    HOST_WINSOR_PERCENTILE,
    HUBER_K,
    MAX_RSE,
    PARAMS,
    T0,
    TINY_S,
    TP,
    TR,
    A,
    B,
    Fit,
    FitData,
    finite,
    host_factor,
    times_and_grad,
)
from cbbench.engine.sim.roofline_physics import MIN_SHRINKAGE, PhysicsFit, fit_physics
from cbbench.engine.sim.roofline_select import NEUTRAL_Z, fit_rates
from cbbench.engine.sim.sim_bounds import SPREAD_LEVEL, spread_from_residuals
from cbbench.errors import UsageError
from cbbench.schema.coerce import as_run
from cbbench.schema.run import Config, Iteration, RunResult

# A result as calibrate() is handed it: the run model, or its dict (a file's, or one in memory).
ResultLike = RunResult | Mapping[str, Any]

# A fit residual above these (per iteration class) is large: the profile and the output say so.
WARN_MEDIAN = 0.10
WARN_P90 = 0.25
# A parameter whose posterior is this correlated with another's is not told apart from it.
CONFOUNDED_CORRELATION = 0.95
# A parameter whose prior variance the data cut by less than this is one no iteration shows
# (its class absent: prefill attention in a decode-only trace), said in those words.
NO_DATA_SHARE = 0.01
# Seven parameters need many more points than seven; 50 also keeps one outlier from steering.
MIN_ITERATIONS = 50
SHAPE_FIELDS = ("num_logits", "attn_key_pairs", "attn_keys_read", "attn_decode_keys")
# An iteration record's fields the fit reads: counts (tokens, rows, requests, blocks) and
# amounts (attention's key pairs and keys, the measured time), each with its range. A step
# holds at most 2^31 tokens (an int32 index); its key pairs at most that squared; a step of
# more than a day is no measurement.
MAX_RECORD_COUNT = 2**31 - 1
RECORD_COUNTS = ("num_prefill_tokens", "num_decode_tokens", "num_logits", "num_prefill_reqs",
                 "num_decode_reqs")
RECORD_OPTIONAL_COUNTS = ("num_swapped_out_blocks", "num_swapped_in_blocks")
RECORD_AMOUNTS = {"attn_key_pairs": float(2**62), "attn_keys_read": float(2**62),
                  "attn_decode_keys": float(2**62), "duration_s": 86400.0}


@dataclass
class Source:
    file: str
    workload: str | None
    model: str
    used: int
    excluded: dict[str, int] = field(default_factory=dict)
    selection: dict | None = None  # a decode microbenchmark's: the rows' configuration


# ---- reading results ------------------------------------------------------------------------
def _device_of(config: Config, where: str) -> tuple[str, str]:
    """(profile device, the name the run reported) of a real engine run."""
    if config.target != "engine":
        raise UsageError(f"{where}: an endpoint run has no engine iteration records to fit")
    if config.engine != "torch":
        raise UsageError(
            f"{where}: a simulated run (engine {config.engine!r}); calibrate from real "
            "runs (--engine torch)"
        )
    if config.device == "cpu":
        return CPU_DEVICE, str(config.device_name or "cpu")
    name = str(config.device_name or "?")
    if not config.gpu:
        raise UsageError(f"{where}: the GPU {name!r} has no spec in cbbench, so no profile")
    try:
        get_gpu_spec(config.gpu)  # a tampered name was a KeyError midway
    except ValueError as e:
        raise UsageError(f"{where}: config.gpu: {e}") from None
    return config.gpu, name


def _run_of(result: ResultLike, where: str) -> RunResult:
    """The run, its iteration records checked for the fit. A dict's records are checked
    before the whole is parsed, so a bad one is named by its index (iteration 3), as a file's
    is by read_run (iterations.3)."""
    if isinstance(result, RunResult):
        its: object = result.iterations
    else:
        its = result.get("iterations")
    if not isinstance(its, list) or not its:
        raise UsageError(f"{where} has no iteration records (was it written with --summary-only?)")
    first = its[0]
    written = (first.model_fields_set if isinstance(first, Iteration)
               else set(first) if isinstance(first, dict) else set(SHAPE_FIELDS))
    if any(k not in written for k in SHAPE_FIELDS):
        raise UsageError(
            f"{where}: its iteration records lack the batch shape (num_logits, attn_key_pairs); "
            "rerun it with this cbbench"
        )
    for k, it in enumerate(its):
        check_record(it, f"{where}: iteration {k}")
    return as_run(result)


def check_record(it: object, where: str) -> Iteration:
    """A record the fit can read. Its fields' kinds are the result schema's (cbbench/schema:
    text, a bool or a negative count is refused there, as every reader refuses it); the fit
    adds its own rules: every field it reads is present and within range (Infinity, NaN, 1e300
    and 10**30 were tracebacks inside the fit)."""
    from cbbench.schema.base import validate

    if isinstance(it, Iteration):
        rec = it
    elif isinstance(it, dict):
        checked = validate(Iteration, it, where, "iteration record")
        assert isinstance(checked, Iteration)
        rec = checked
    else:
        raise UsageError(f"{where} is {type(it).__name__}, not a record (an object)")
    written = rec.model_fields_set
    # The fields by name: the ranges are a table (RECORD_COUNTS, RECORD_AMOUNTS).
    for name in RECORD_COUNTS + RECORD_OPTIONAL_COUNTS:
        if name not in written:
            if name in RECORD_OPTIONAL_COUNTS:
                continue
            raise UsageError(f"{where} has no {name!r}")
        value = getattr(rec, name)
        if not value <= MAX_RECORD_COUNT:
            raise UsageError(
                f"{where} has {name} {value!r}: expected an integer in [0, {MAX_RECORD_COUNT}]"
            )
    for name, top in RECORD_AMOUNTS.items():
        if name not in written:
            raise UsageError(f"{where} has no {name!r}")
        value = getattr(rec, name)
        if not 0 <= value <= top:  # NaN is in no range
            raise UsageError(f"{where} has {name} {value!r}: expected a number in [0, {top:g}]")
    return rec


def _bench_selection(runs: Sequence[RunResult]) -> dict:
    """The decode microbenchmark rows that match the runs: their CUDA graphs, fused kernels and
    attention backend (without runs: graphs and fused kernels, the engine's defaults on a
    GPU)."""
    if not runs:
        return {"graphs": True, "fused": True, "attention_backend": None}
    config = runs[0].config
    graphs = (config.cuda_graphs_effective if "cuda_graphs_effective" in config.model_fields_set
              else config.cuda_graphs)
    return {"graphs": bool(graphs), "fused": bool(config.fused_kernels),
            "attention_backend": config.attention_backend}



def iteration_shape(it: Iteration) -> BatchShape:
    """The batch shape an iteration record holds, as the cost model reads it: what the fit refits
    and what the simulator predicted the step from."""
    # _run_of checked that each field the fit reads is there (not None).
    assert (it.num_logits is not None and it.attn_key_pairs is not None
            and it.attn_keys_read is not None and it.attn_decode_keys is not None
            and it.num_prefill_reqs is not None and it.num_decode_reqs is not None)
    return BatchShape(
        num_tokens=it.num_prefill_tokens + it.num_decode_tokens,
        num_logits=it.num_logits,
        attn_key_pairs=it.attn_key_pairs,
        attn_keys_read=it.attn_keys_read,
        num_reqs=it.num_prefill_reqs + it.num_decode_reqs,
        num_prefill_reqs=it.num_prefill_reqs,
        decode_keys=it.attn_decode_keys,
        num_draft_tokens=it.draft_tokens or 0,
    )

def fit_data(results: Sequence[tuple[str, ResultLike]],
             benches: Sequence[tuple[str, dict]] = ()
             ) -> tuple[FitData, str, str, str, list[Source]]:
    """The usable iterations of every result (and the matching rows of every decode
    microbenchmark), with their operators' FLOPs and bytes. Returns (data, device,
    device_name, dtype, sources)."""
    if not results and not benches:
        raise UsageError("give at least one result file")
    devices: dict[tuple[str, str], str] = {}
    dtypes: dict[str, str] = {}
    flops, nbytes, attn, reqs, prefill_reqs, measured, labels = [], [], [], [], [], [], []
    weights: list[float] = []
    sources: list[Source] = []

    def add(cost: CostModel, shape: BatchShape, seconds: float, label: str | None,
            weight: float, row_overheads: int) -> None:
        ops = cost.operators(shape)
        ops[ATTENTION_OP] = (0.0, 0.0)
        flops.append([f for f, _ in ops])
        nbytes.append([b for _, b in ops])
        (fd, bd), (fp, bp) = cost.attention_parts(shape)
        attn.append([fd, bd, fp, bp])
        reqs.append(row_overheads)
        prefill_reqs.append(shape.num_prefill_reqs)
        measured.append(seconds)
        labels.append(label)
        weights.append(weight)

    runs = []
    for where, result in results:
        run = _run_of(result, where)
        runs.append(run)
        config = run.config
        devices.setdefault(_device_of(config, where), where)
        dtypes.setdefault(str(config.dtype), where)
        # model_config stays an extra field of the config: pydantic reserves the name.
        model = _model_of((config.model_extra or {}).get("model_config"), where)
        cost = CostModel(model, str(config.dtype))
        src = Source(Path(where).name, config.workload, model.name, 0)
        for it in run.iterations or []:
            reason = _exclusion(it)
            if reason is not None:
                src.excluded[reason] = src.excluded.get(reason, 0) + 1
                continue
            shape = iteration_shape(it)
            add(cost, shape, it.duration_s,
                iteration_class(it.num_prefill_tokens, it.num_decode_tokens), 1.0,
                shape.num_reqs)
            src.used += 1
        sources.append(src)
    selection = _bench_selection(runs)
    for where, bench_data in benches:
        bench = decode_bench(where, bench_data, selection)
        devices.setdefault((bench.device, bench.device_name), where)
        dtypes.setdefault(bench.dtype, where)
        model = _model_of(bench.model_config, where)
        cost = CostModel(model, bench.dtype)
        src = Source(bench.file, "decode microbenchmark", model.name, 0)
        for row in bench.rows:
            keys = float(row.batch_size * (row.context + 1))  # each row attends c + 1 keys
            shape = BatchShape(num_tokens=row.batch_size, num_logits=row.batch_size,
                               attn_key_pairs=keys, attn_keys_read=keys,
                               num_reqs=row.batch_size, num_prefill_reqs=0, decode_keys=keys)
            # A microbenchmark step is ModelRunner.execute alone: none of the engine's work
            # per request (scheduling, output processing) that row_overhead_s stands for.
            add(cost, shape, row.step_s, "decode", float(row.steps), 0)
            src.used += 1
        src.selection = selection
        sources.append(src)
    if len({d for d, _ in devices}) > 1:
        (d1, w1), (d2, w2) = list(devices.items())[:2]
        raise UsageError(f"mixed devices: {w1} ran on {d1[1]}, {w2} on {d2[1]}; one device per profile")
    if len(dtypes) > 1:
        (t1, w1), (t2, w2) = list(dtypes.items())[:2]
        raise UsageError(f"mixed dtypes: {w1} ran in {t1}, {w2} in {t2}; one dtype per profile")
    n = len(measured)
    if n < MIN_ITERATIONS and not benches:
        raise UsageError(
            f"too few iterations to fit: {n} usable, at least {MIN_ITERATIONS} needed "
            "(run more requests)"
        )
    device, device_name = next(iter(devices))
    data = FitData(np.array(flops), np.array(nbytes), np.array(attn),
                   np.array(reqs, dtype=np.float64),
                   np.array(prefill_reqs, dtype=np.float64),
                   np.array(measured, dtype=np.float64), labels,
                   np.array(weights, dtype=np.float64))
    return data, device, device_name, next(iter(dtypes)), sources


def _model_of(model_config: object, where: str) -> ModelConfig:
    try:
        return ModelConfig.from_dict(model_config)
    except (KeyError, TypeError) as e:
        raise UsageError(f"{where}: no usable model_config in its config ({e})") from None


def _exclusion(it: Iteration) -> str | None:
    if iteration_class(it.num_prefill_tokens, it.num_decode_tokens) is None:
        return "no tokens"
    if it.num_swapped_out_blocks or it.num_swapped_in_blocks:
        return "swap copies"  # their time is the host link's, not the roofline's
    if not it.duration_s > 0:
        return "no measured time"
    return None


# ---- the profile ----------------------------------------------------------------------------
def _rates(theta: np.ndarray, host_factor: float) -> DeviceRates:
    return DeviceRates(
        memory_bandwidth=1.0 / theta[A] if theta[A] > 0 else None,
        flop_rate=1.0 / theta[B] if theta[B] > 0 else None,
        iteration_overhead_s=float(theta[T0]),
        row_overhead_s=float(theta[TR]),
        prefill_overhead_s=float(theta[TP]),
        decode_attention_efficiency=1.0 / theta[ED] if theta[ED] > 0 else 1.0,
        prefill_attention_efficiency=1.0 / theta[EP] if theta[EP] > 0 else 1.0,
        host_factor=host_factor,
    )


def calibrate(results: Sequence[tuple[str, ResultLike]],
              benches: Sequence[tuple[str, dict]] = ()) -> dict:
    """The profile (a JSON-ready dict) fitted to ``results`` [(path, run result dict)] and
    ``benches`` [(path, decode microbenchmark dict)]. On a GPU with a spec the fit is bounded by
    its physics with the spec's priors (engine/sim/roofline_physics.py); on the CPU, which has
    no spec, the staged fit decides which terms the data determine (roofline_select.py)."""
    data, device, device_name, dtype, sources = fit_data(results, benches)
    physics: PhysicsFit | None = None
    if device == CPU_DEVICE:
        fit, rounds = fit_rates(data, device)
        theta = fit.theta
    else:
        physics = fit_physics(data, get_gpu_spec(device), dtype)
        theta = physics.theta
    typical, _ = times_and_grad(theta, data)
    factor, factor_rse = host_factor(np.maximum(typical, TINY_S), data.measured)
    fitted_scales = (len(fit.free) if physics is None
                     else sum(1 for v in physics.status.values() if v == "fitted"))
    shapes = distinct_shapes(data)
    # The host factor is one more scale on the whole: the data show it only when they have a
    # shape to spare beyond the ones the fitted terms explain (200 copies of one iteration
    # have none: the roofline explains that one time exactly and the factor is 1 by design).
    factor_known = shapes > fitted_scales and math.isfinite(factor_rse) and factor_rse < MAX_RSE
    if not factor_known:
        factor, factor_rse = 1.0, math.inf
    floor = None
    if physics is not None:
        floor = physical_host_factor(factor, theta, typical, data, device, dtype, sources)
        factor = max(factor, floor.least)
    rates = _rates(theta, factor)
    models = tuple(dict.fromkeys(s.model for s in sources))
    profile = DeviceProfile(device, device_name, dtype, models, rates)
    params = (_param_report(fit, rates, device) if physics is None
              else _physics_report(physics, rates, device, dtype))
    if shapes <= fitted_scales:  # as many shapes as fitted terms: an exact fit, no error
        for entry in params.values():
            if entry["status"] == "fitted":
                entry.update(rse=None, note=(
                    f"determined exactly by {shapes} distinct iteration shape(s): "
                    "no residual is left to estimate its error"))
    params.update(host_factor={
        "value": factor if factor_known else None,
        "status": "fitted" if factor_known else "not identified",
        "rse": finite(factor_rse),
        # The share of the simulated step the factor adds: negative when it shortens steps
        # (a factor of 0.7 takes away 43% of each step; 0 read as if it did nothing).
        "median_share_of_time": 1.0 - 1.0 / factor, "used": factor,
        "note": ("measured over typical time, summed (winsorized at "
                 f"p{HOST_WINSOR_PERCENTILE:g}): the host's share lost to other processes")
        if factor_known else
        (f"the data hold {shapes} distinct iteration shape(s) for {fitted_scales} fitted "
         "term(s): no time is left over to show a host's lost share; the simulator uses 1"),
    })
    warnings = []
    if floor is not None and floor.clamped:
        params["host_factor"].update(value=None, status="at bound", rse=None,
                                     fitted_value=floor.fitted, note=floor.note)
        warnings.append(floor.note)
    # The simulator's error per iteration as it will predict (host factor included), and
    # the roofline's fit to a typical iteration (without it).
    residuals = error_stats(typical * factor, data.measured, data.labels)
    out = {
        **profile_to_dict(profile),
        "params": params,
        "residuals": residuals,
        "residuals_typical": error_stats(typical, data.measured, data.labels),
        # The residual band a simulated run's intervals come from (summary.intervals).
        "spread": {"level": SPREAD_LEVEL, "basis": "per class: e in [bias - p90, bias + p90] "
                   "of residuals, as factors 1 / (1 + e) on the predicted step time",
                   **spread_from_residuals(residuals)},
        "num_iterations": data.n,
        "distinct_shapes": shapes,
        "determined": _determined(params, shapes),
        "warnings": warnings + residual_warnings(residuals),
        "sources": [
            {"file": s.file, "workload": s.workload, "model": s.model, "iterations_used": s.used,
             "excluded": s.excluded, **({"rows": s.selection} if s.selection else {})}
            for s in sources
        ],
        "fit": _fit_report(fit, rounds) if physics is None else _physics_fit_report(physics),
    }
    check_profile(out)
    return out


@dataclass(frozen=True)
class HostFloor:
    """The least host factor that keeps every predicted step on the GPU's physics."""

    fitted: float  # the factor the data gave
    least: float  # the least factor at which no step beats the GPU's floor
    note: str  # why the fitted one is not physical ("" when it is)

    @property
    def clamped(self) -> bool:
        return self.fitted < self.least


def physical_host_factor(factor: float, theta: np.ndarray, typical: np.ndarray, data: FitData,
                         device: str, dtype: str, sources: Sequence[Source]) -> HostFloor:
    """The fitted host factor against the GPU's floor (engine/sim/physics_floor.py).

    The bounded fit keeps every rate within the spec, so the typical step it predicts is never
    under the floor; the host factor multiplies that whole step afterwards, and a factor below
    1 (measured times faster than the fit can reach) carried a profile past the physics: a
    trace 1.5x faster than an H100 gave 0.695 and a batch-1 decode predicted at 4.8 TB/s,
    silently. The factor is kept at or above the least value that leaves every step of the
    data and every reference step (device_profile's load check) at or over its floor, and the
    profile says what was fitted and why it was not used."""
    from cbbench.engine.model_config import MODEL_PRESETS
    from cbbench.engine.sim.device_profile import REFERENCE_CONTEXT, REFERENCE_MODEL
    from cbbench.engine.sim.physics_floor import FLOOR_RTOL, peak_rates, reference_checks

    gpu = get_gpu_spec(device)
    peak = peak_rates(gpu, dtype)
    assert peak.memory_bandwidth and peak.flop_rate
    floor_theta = np.array([1.0 / peak.memory_bandwidth, 1.0 / peak.flop_rate, 1.0, 1.0,
                            0.0, 0.0, 0.0])
    floors, _ = times_and_grad(floor_theta, data)
    rows = floors / np.maximum(typical, TINY_S)
    reference = MODEL_PRESETS[REFERENCE_MODEL]
    models = [reference] + [MODEL_PRESETS.get(s.model, reference) for s in sources]
    checks = reference_checks(_rates(theta, 1.0), gpu, dtype, models, REFERENCE_CONTEXT)
    least = max(float(rows.max()), *(1.0 / c.ratio for c in checks))
    if factor >= least * (1 - FLOOR_RTOL):
        return HostFloor(factor, factor, "")
    worst = min(checks, key=lambda c: c.ratio)
    under = data.measured < floors
    share = float(np.median(data.measured[under] / floors[under])) if under.any() else 1.0
    note = (
        f"host_factor {factor:.4g} was fitted (the measured steps are faster than the fit's "
        f"rates, which the {device}'s physics bound), but it would predict "
        f"{worst.what} of {worst.model} in {worst.predicted_s * factor * 1e3:.3g} ms, under "
        f"the {device}'s floor of {worst.floor_s * 1e3:.3g} ms (its peak "
        f"{peak.memory_bandwidth / 1e12:g} TB/s and {peak.flop_rate / 1e12:g} TFLOP/s, no "
        f"overhead); {int(under.sum())} of {data.n} measured steps took less than their floor "
        f"(median {share:.0%} of it): no {device} runs this model in {dtype} that fast "
        "(check the run's device, model and dtype); the simulator uses "
        f"{least:.4g}, the least factor that keeps every step physical")
    return HostFloor(factor, least, note)


def _fit_report(fit: Fit, rounds: Any) -> dict:
    return {
        "method": "M-estimator on log(predicted / measured): IRLS with Huber then Tukey "
                  "bisquare weights over scipy.optimize.least_squares (trf, bounds >= 0); "
                  "staged: all classes weighted equally, then the decode-side terms on the "
                  "decode steps, then the FLOP rate and prefill-only terms on the "
                  "prefill-carrying steps, twice (analysis/roofline_select.py); a "
                  "parameter's rse is from the stage that fitted it, given the others",
        "residual_scale": fit.scale,
        "huber_k": HUBER_K,
        "bisquare_c": BISQUARE_C,
        "max_rse": MAX_RSE,
        "neutral_z": NEUTRAL_Z,
        "rounds": rounds,
    }


def _physics_fit_report(physics: PhysicsFit) -> dict:
    return {
        "method": "maximum a posteriori on log(predicted / measured), bounded by the "
                  "GPU's physics, with the spec's priors (engine/sim/roofline_physics.py): "
                  "IRLS with Huber then Tukey bisquare weights over "
                  "scipy.optimize.least_squares (trf); each parameter's status from the "
                  "share of its prior variance the data remove (Laplace approximation)",
        "residual_scale": physics.scale,
        "huber_k": HUBER_K,
        "bisquare_c": BISQUARE_C,
        "min_shrinkage": MIN_SHRINKAGE,
        "effective_parameters": physics.effective_params,
    }


def distinct_shapes(d: FitData) -> int:
    """How many different iterations the data hold (what the roofline reads of each)."""
    rows = np.column_stack([d.op_flops, d.op_bytes, d.attn, d.num_reqs, d.num_prefill_reqs])
    scale = np.where(np.abs(rows).max(axis=0) > 0, np.abs(rows).max(axis=0), 1.0)
    return int(np.unique(np.round(rows / scale, DISTINCT_DIGITS), axis=0).shape[0])


def _determined(params: dict, shapes: int) -> str:
    """One line: which rates the data determined (the rest are the spec's or left out)."""
    fitted = [k for k, p in params.items() if p["status"] == "fitted"]
    if not fitted:
        return (f"nothing: {shapes} distinct iteration shape(s) show no rate apart from the "
                "others")
    return f"{', '.join(fitted)} (from {shapes} distinct iteration shapes)"


def residual_warnings(residuals: dict) -> list[str]:
    """One line per iteration class whose fit residuals are large: a profile that does not
    fit its own calibration data predicts nothing well, and says so."""
    out = []
    for cls, r in residuals.items():
        if not r.get("n"):
            continue
        if r["p90"] > WARN_P90 or r["median"] > WARN_MEDIAN:
            out.append(f"{cls} steps fit poorly: median |error| {r['median']:.0%}, p90 "
                       f"{r['p90']:.0%} (over {WARN_MEDIAN:.0%} / {WARN_P90:.0%}): "
                       "predictions of such steps are unreliable")
    return out


def check_profile(profile: dict) -> None:
    """The profile must be one `run --gpu-profile` reads: the same checks, applied before it
    is written (a fit that determines no time wrote a profile the run then refused)."""
    import tempfile

    from cbbench.engine.sim.device_profile import load_profile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.json"
        path.write_text(json.dumps(profile))
        try:
            load_profile(path)
        except ValueError as e:
            reason = str(e).replace(str(path), "the fitted profile")
            raise UsageError(f"calibrate: no profile written: {reason}") from None


def _physics_report(fit: PhysicsFit, rates: DeviceRates, device: str, dtype: str) -> dict:
    values = _values(rates)
    gpu = get_gpu_spec(device)
    out = {}
    for p, name in enumerate(PARAMS):
        status = fit.status[p]
        entry: dict = {
            "value": values[name] if status == "fitted" else None,
            "status": status,
            "rse": finite(fit.rse[p]) if status == "fitted" else None,
            "median_share_of_time": fit.share[p],
            "used": values[name],
            "data_share": fit.shrinkage[p],
            "prior": fit.priors[p].basis,
        }
        conf = fit.confounder.get(p)
        if conf is not None:
            entry.update(confounded_with={
                "param": conf[0], "posterior_correlation": conf[1],
                # the most prior variance the data leave in any mix of the two (1: all)
                "variance_left": fit.left_with_confounder.get(p)})
        if status == "prior" and fit.shrinkage[p] < NO_DATA_SHARE:
            entry.update(note=("no iteration in the data shows it (data share "
                               f"{fit.shrinkage[p]:.0%}): the simulator uses the spec's prior"))
        elif status == "prior":
            entry.update(note=("the data cannot determine it"
                               + (f" apart from {conf[0]}" if conf else "")
                               + "; the simulator uses the spec's prior, moved by what the "
                               "data say"))
        elif status == "at bound":
            entry.update(note=("the data ask for more than the device's physics allow; the "
                               "simulator uses the bound" + (f" (confounded with {conf[0]})"
                                                             if conf else "")))
        elif conf is not None and abs(conf[1]) >= CONFOUNDED_CORRELATION:
            # rse None: its error given the prior's split, not the data's
            entry.update(status="confounded", value=None, rse=None, note=(
                f"not told apart from {conf[0]} (posterior correlation "
                f"{conf[1]:+.2f}): the data fix a combination of the two; the "
                "split rests on small terms and the spec's priors, which a model "
                "error moves"))
        out[name] = entry
    peaks = {"memory_bandwidth": (rates.memory_bandwidth, gpu.hbm_bandwidth),
             "flop_rate": (rates.flop_rate, gpu.peak_flops(dtype) or gpu.bf16_flops)}
    for name, (rate, peak) in peaks.items():
        if rate:
            out[name].update(fraction_of_peak=rate / peak)
    return out


def _values(rates: DeviceRates) -> dict:
    return {
        "memory_bandwidth": rates.memory_bandwidth,
        "flop_rate": rates.flop_rate,
        "decode_attention_efficiency": rates.decode_attention_efficiency,
        "prefill_attention_efficiency": rates.prefill_attention_efficiency,
        "iteration_overhead_s": rates.iteration_overhead_s,
        "row_overhead_s": rates.row_overhead_s,
        "prefill_overhead_s": rates.prefill_overhead_s,
    }


def _param_report(fit: Fit, rates: DeviceRates, device: str) -> dict:
    values = _values(rates)
    out = {}
    for p, name in enumerate(PARAMS):
        fitted = p in fit.free
        entry = {
            "value": values[name] if fitted else None,
            "status": "fitted" if fitted else "not identified",
            "rse": finite(fit.rse[p]) if fitted else None,
            "median_share_of_time": fit.share[p],
            "used": values[name],
        }
        if not fitted:
            entry.update(note=("the data cannot determine it, and the CPU has no spec to fall "
                               "back on: the simulator leaves this term out"))
        out[name] = entry
    return out
