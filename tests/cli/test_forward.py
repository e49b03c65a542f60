"""`cbbench forward` on a CPU (issue 40): the tiny preset's floors against numbers worked out by
hand from its shape, the file read back through the schema, and the CPU said."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cbbench.cli.app import app
from cbbench.schema import read_forward

# The tiny preset (engine/model_config.py): 2 layers, hidden 64, 4 query heads and 2 KV heads of
# 16, MLP 128, vocabulary 512, untied embeddings; bf16 (2 bytes).
# Per layer: QKV 64 x (64 + 2 x 32) = 8192, O 64 x 64 = 4096, MLP 3 x 64 x 128 = 24576 -> 36864
# GEMM weights; norms 2 x 64 = 128. Final norm 64. LM head 512 x 64 = 32768.
# KV bytes per token: K and V x 2 layers x 2 heads x 16 x 2 bytes = 256.
GEMM_BYTES = 36864 * 2 * 2  # both layers' GEMM weights, bf16
NORM_BYTES = (128 * 2 + 64) * 2
HEAD_BYTES = 32768 * 2
# Decode batch 4 at context 40: 4 rows x 41 keys.
DECODE = {
    "layer GEMMs": (2 * 4 * 36864 * 2, GEMM_BYTES),
    "norms and biases": (0, NORM_BYTES),
    "lm_head": (2 * 4 * 32768, HEAD_BYTES),
    "attention": (4 * 64 * (4 * 41) * 2, 4 * 41 * 256),
    "embedding rows": (0, 4 * 64 * 2),
}
# A 64-token prefill chunk, nothing cached: causal keys 64 x 65 / 2 = 2080; one logits row.
PREFILL = {
    "layer GEMMs": (2 * 64 * 36864 * 2, GEMM_BYTES),
    "norms and biases": (0, NORM_BYTES),
    "lm_head": (2 * 1 * 32768, HEAD_BYTES),
    "attention": (4 * 64 * 2080 * 2, 64 * 256),
    "embedding rows": (0, 64 * 64 * 2),
}
# Peaks as slow as a CPU's, so both roofs bind somewhere: 1 GB/s and 1 GFLOP/s.
PEAK = 1e9
# Each operator's floor = max(bytes, FLOPs) / 1e9 s, so in ms: max(...) / 1e6.
DECODE_FLOOR_MS = (589824 + 640 + 262144 + 83968 + 512) / 1e6
PREFILL_FLOOR_MS = (9437184 + 640 + 65536 + 1064960 + 8192) / 1e6
H100_BW = 3.35e12


def forward(tmp_path, *extra: str) -> tuple[str, dict]:
    out = tmp_path / "forward.json"
    r = CliRunner().invoke(app, [
        "forward", "--model", "tiny", "--device", "cpu", "--batch-sizes", "4", "--context",
        "40", "--prefill-tokens", "64", "--steps", "2", "--warmup", "1", "--output", str(out),
        *extra])
    assert r.exit_code == 0, r.output
    return r.output, read_forward(out)  # through the schema


def test_floors_match_the_hand_worked_numbers(tmp_path):
    output, result = forward(tmp_path, "--peak-bw", str(PEAK), "--peak-flops", str(PEAK))
    rows = {r["phase"]: r for r in result["rows"]}
    assert set(rows) == {"decode", "prefill"}
    for phase, want, floor in (("decode", DECODE, DECODE_FLOOR_MS),
                               ("prefill", PREFILL, PREFILL_FLOOR_MS)):
        row = rows[phase]
        ops = {o["name"]: o for o in row["operators"]}
        assert {k: (o["flops"], o["bytes"]) for k, o in ops.items()} == want
        assert row["floor_ms"] == pytest.approx(floor, rel=1e-12)
        assert row["bytes"] == sum(b for _, b in want.values())
        step_s = row["step_ms"]["mean"] / 1000
        assert row["mbu"] == pytest.approx(row["bytes"] / step_s / PEAK)  # peaks given: a number
        assert row["mfu"] == pytest.approx(row["flops"] / step_s / PEAK)
        assert row["step_ms"]["min"] > 0 and row["graphs"] is False
    # At these peaks the GEMMs are compute-bound and the norms memory-bound.
    ops = {o["name"]: o for o in rows["decode"]["operators"]}
    assert ops["layer GEMMs"]["bound"] == "compute" and ops["norms and biases"]["bound"] == "memory"
    assert "floor by operator" in output


def test_a_cpu_says_so_and_leaves_utilization_null(tmp_path):
    output, result = forward(tmp_path)
    assert result["device"]["is_cpu"] is True and result["device"]["type"] == "cpu"
    assert "a CPU" in output and "no CUDA graphs" in output
    assert result["peaks"]["source"].startswith("h100") and result["peaks"]["utilization"] is False
    for row in result["rows"]:
        assert row["mbu"] is None and row["mfu"] is None
        # The floor is the H100's for this shape: every operator memory-bound at this size.
        assert row["floor_ms"] == pytest.approx(row["bytes"] / H100_BW * 1000, rel=1e-12)


def test_bad_input(tmp_path):
    r = CliRunner().invoke(app, ["forward", "--device", "cpu", "--model", "llama-3-8b"])
    assert r.exit_code == 2 and "small presets" in r.output
    r = CliRunner().invoke(app, ["forward", "--device", "cpu", "--batch-sizes", "1,x"])
    assert r.exit_code == 2 and "--batch-sizes" in r.output
    r = CliRunner().invoke(app, ["forward", "--device", "cpu", "--context", "4000"])
    assert r.exit_code == 2 and "positions" in r.output
    # A dtype the engine has no weights for: one line, not resolve_dtype's ValueError.
    r = CliRunner().invoke(app, ["forward", "--device", "cpu", "--dtype", "int8"])
    assert r.exit_code == 2 and "--dtype" in r.output and "bf16" in r.output, r.output


def test_schema_forward_prints_the_model():
    r = CliRunner().invoke(app, ["schema", "forward"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["title"] == "ForwardResult"


# ---- positions: a prefill row caches nothing ------------------------------------------------
# The tiny preset's context is 2048. The default shapes (--context 512, --prefill-tokens 2048)
# were refused on a CPU ("needs 2560 positions"): the check added --context to the prefill
# chunk, which runs with nothing cached (prefill_rows(p): context 0, as the table prints).
TINY_CONTEXT = 2048


def _forward_cpu(tmp_path, *args: str):
    return CliRunner().invoke(app, [
        "forward", "--model", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "0",
        "--output", str(tmp_path / "f.json"), *args])


def test_the_default_shapes_fit_the_tiny_preset(tmp_path):
    # The defaults' context and chunk, with one small decode batch (the check is the same).
    r = _forward_cpu(tmp_path, "--batch-sizes", "1", "--context", "512",
                     "--prefill-tokens", str(TINY_CONTEXT))
    assert r.exit_code == 0, r.output
    rows = read_forward(tmp_path / "f.json")["rows"]
    assert {(x["phase"], x["context"]) for x in rows} == {("decode", 512), ("prefill", 0)}


def test_a_full_context_prefill_chunk_is_accepted(tmp_path):
    r = _forward_cpu(tmp_path, "--prefill-tokens", str(TINY_CONTEXT), "--batch-sizes", "",
                     "--context", "1")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args,what", [
    (["--prefill-tokens", str(TINY_CONTEXT + 1), "--batch-sizes", ""], "--prefill-tokens 2049"),
    (["--context", str(TINY_CONTEXT), "--batch-sizes", "1", "--prefill-tokens", ""],
     "--context 2048"),
])
def test_positions_beyond_the_models_context_are_refused(tmp_path, args, what):
    r = _forward_cpu(tmp_path, *args)
    assert r.exit_code == 2 and what in r.output and "positions" in r.output, r.output
    assert "Traceback" not in r.output


def test_the_kv_pool_holds_a_prefill_chunk_not_context_plus_chunk(tmp_path, monkeypatch):
    import cbbench.engine.torch.models.llama as llama

    sizes = []
    real = llama.allocate_kv_cache

    def spy(config, num_blocks, *a, **kw):
        sizes.append(num_blocks)
        return real(config, num_blocks, *a, **kw)

    monkeypatch.setattr(llama, "allocate_kv_cache", spy)
    r = _forward_cpu(tmp_path, "--prefill-tokens", "64", "--batch-sizes", "", "--context", "1000")
    assert r.exit_code == 0, r.output
    assert sizes == [64 // 16 + 1]  # the chunk's 4 blocks of 16 and run_forward's one spare


# ---- a tied table: its gathered rows are read too -------------------------------------------
def test_a_tied_tables_gathered_rows_count_beside_the_lm_head():
    """Llama-3.2-1B ties its embedding to the LM head. A 2048-token prefill chunk gathers 2048
    rows at the first layer and reads the whole table again as the head at the last: the rows
    are bytes moved too (the floor left them out for a tied model, 8.39 MB)."""
    from cbbench.bench.roofline import prefill_rows, step_operators
    from cbbench.engine.model_config import MODEL_PRESETS

    cfg = MODEL_PRESETS["llama-3.2-1b"]
    assert cfg.tie_word_embeddings
    ops = {o.name: o.bytes for o in step_operators(cfg, "bf16", prefill_rows(2048))}
    assert ops["embedding rows"] == 2048 * 2048 * 2 == 8_388_608  # rows x hidden x bf16
    assert ops["lm_head"] == 128256 * 2048 * 2  # the whole table, as the head


# ---- the timed steps' spread and hyperfine's warnings ----------------------------------------
# hyperfine (src/outlier_detection.rs, src/benchmark/mod.rs): mean ± σ (the sample standard
# deviation), and a warning when a step's modified Z-score (x - median) / MAD passes 1.4826 x 10
# (ten standard deviations): "first run significantly slower" when it is the first, else
# "statistical outliers".
def test_step_ms_carries_the_sample_standard_deviation():
    from cbbench.bench.forward import _stats

    # mean 2; deviations -1, 0, 1; sample variance (1 + 0 + 1) / (3 - 1) = 1: sigma 1.
    s = _stats([1.0, 2.0, 3.0])
    assert (s.mean, s.std, s.p50, s.min, s.max) == (2.0, 1.0, 2.0, 1.0, 3.0)
    assert _stats([5.0]).std is None  # one step: no spread to state (hyperfine prints none)


@pytest.mark.parametrize("steps,warning", [
    # median 10, deviations 0.1, 0, 0.1, 0, 0.2: MAD 0.1; 10.2 scores 2: quiet.
    ([9.9, 10.0, 10.1, 10.0, 10.2], None),
    # the first step: (30 - 10) / 0.1 = 200 > 14.826: the first is slower than the rest.
    ([30.0, 9.9, 10.0, 10.1, 10.0], "first timed step"),
    # a later one: same score, not the first: an outlier.
    ([9.9, 10.0, 30.0, 10.1, 10.0], "outliers"),
    # hyperfine's own case [0.5, 0.30, 0.29, 0.31, 0.30] (one outlier), a later step here.
    ([0.30, 0.29, 0.5, 0.31, 0.30], "outliers"),
])
def test_timing_warnings_follow_hyperfines_rule(steps, warning):
    from cbbench.bench.forward import timing_warning

    got = timing_warning(steps)
    assert got is None if warning is None else warning in got


def test_a_slow_first_step_is_noted_in_the_file_and_the_table(tmp_path, monkeypatch):
    import cbbench.bench.forward as bench_forward

    times = iter([40.0, 10.0, 10.1, 9.9, 10.0] * 2)  # each row: a first step 4x the rest

    class Timer:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def elapsed_ms(self):
            return next(times)

    monkeypatch.setattr(bench_forward, "StepTimer", Timer)
    r = _forward_cpu(tmp_path, "--batch-sizes", "2", "--context", "8", "--prefill-tokens", "8",
                     "--steps", "5")
    assert r.exit_code == 0, r.output
    result = read_forward(tmp_path / "f.json")
    step = result["rows"][0]["step_ms"]
    # mean (40 + 10 + 10.1 + 9.9 + 10) / 5 = 16; sigma sqrt((24^2 + 6^2 + 5.9^2 + 6.1^2 + 6^2) / 4)
    assert step["mean"] == pytest.approx(16.0)
    assert step["std"] == pytest.approx(((24**2 + 6**2 + 5.9**2 + 6.1**2 + 6**2) / 4) ** 0.5)
    assert "16.000 ± 13.417" in r.output
    slow = [n for n in result["notes"] if "first timed step" in n]
    assert len(slow) == 2 and slow[0].startswith("decode batch 2") and "--warmup" in slow[0]
    assert "note: decode batch 2" in r.output


@pytest.mark.parametrize("flag, said", [("--peak-bw", "bandwidth given"),
                                        ("--peak-flops", "FLOP/s given")])
def test_one_given_peak_is_labelled_as_given(tmp_path, flag, said):
    """Found in the tenth review: --peak-bw alone left peaks.source "h100 spec (a CPU:
    reference)" though the bandwidth in the file was the user's."""
    _, result = forward(tmp_path, flag, str(PEAK))
    assert result["peaks"]["source"].startswith(said), result["peaks"]
    assert "h100 spec" in result["peaks"]["source"]  # the other peak's origin


def test_ctrl_c_keeps_the_rows_measured(tmp_path, monkeypatch):
    """Found in the tenth review: Ctrl-C during `cbbench forward` lost every row already
    measured. The file keeps them, marked interrupted, and the exit is 130."""
    from helpers import cli_in_process

    import cbbench.bench.forward as fw

    real = fw._time_row

    def ctrl_c_in_the_second_row(spec, setup, runner, phase, *args):
        if phase == "prefill":
            raise KeyboardInterrupt
        real(spec, setup, runner, phase, *args)

    monkeypatch.setattr(fw, "_time_row", ctrl_c_in_the_second_row)
    out = tmp_path / "forward.json"
    outcome = cli_in_process(["forward", "--model", "tiny", "--device", "cpu", "--batch-sizes",
                              "4", "--context", "40", "--prefill-tokens", "64", "--steps", "2",
                              "--warmup", "1", "--output", str(out)])
    assert outcome.returncode == 130 and "Traceback" not in outcome.stderr, outcome.stderr
    result = read_forward(out)
    assert result["interrupted"] is True
    assert [r["phase"] for r in result["rows"]] == ["decode"]
