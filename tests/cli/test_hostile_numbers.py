"""Every number a user can give has a range (issue 19).

- Non-finite floats: every float option of every command rejects nan, inf and -inf (none
  documents inf: the rates that take inf are text options), found by walking the CLI, so an
  option added later is covered too. Before, `--telemetry-interval inf`, `--request-timeout
  nan` and `--slo ttft=inf` passed, and `--iteration-overhead-us nan` gave a run of zero
  duration, exit 0.
- Sizes: what a size needs is checked before it is allocated (huge KV pools, swap space,
  context, request counts): one line, exit 2, not a MemoryError traceback.

In-process (Typer's runner): each check fails before anything runs, so each case takes
milliseconds; the base arguments keep a case cheap should a check be missing.
"""

from __future__ import annotations

import inspect
import json
import typing

import pytest
from helpers import invoke_app

from cbbench.cli.app import app

# A cheap, complete invocation of each command that has float options (serve, which would
# serve for ever, is covered by test_bad_input.py's subprocess cases).
BASE = {
    "run": ["run", "--engine", "sim", "--num-requests", "2", "--output", "{t}/x.json"],
    "compare": ["compare", "--engine", "sim", "--num-requests", "2", "--variants",
                "static,continuous", "--out-dir", "{t}/c"],
    "sweep": ["sweep", "--engine", "sim", "--num-requests", "2", "--rates", "1",
              "--min-duration", "0", "--out-dir", "{t}/s"],
    "capacity": ["capacity", "--engine", "sim", "--num-requests", "2", "--min-duration", "0",
                 "--slo", "ttft_p99=1000", "--start-rate", "1", "--out", "{t}/c.json"],
}


def _float_options(command: str) -> list[str]:
    """The --flags of ``command`` whose type is float (or float | None)."""
    import typer.main

    cmd = typer.main.get_command(app).commands[command]
    if cmd.callback is None:  # a group (workloads)
        return []
    flags = []
    for name, par in inspect.signature(cmd.callback).parameters.items():
        hint = par.annotation
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        if float in (hint, *typing.get_args(hint)):
            flags.append("--" + name.replace("_", "-"))
    return flags


FLOAT_CASES = [(c, f) for c in BASE for f in _float_options(c)]


def invoke(argv: list[str], tmp_path) -> tuple[int, list[str]]:
    argv = [a.replace("{t}", str(tmp_path)) for a in argv]
    res = invoke_app(argv, env={"COLUMNS": "200"})  # the app's click command built once
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, [ln for ln in res.stderr.splitlines() if ln.strip()]


def test_every_command_with_float_options_is_walked():
    """A new command with a float option needs its cheap invocation in BASE (serve is covered
    by test_bad_input.py's subprocess cases: it would serve for ever)."""
    import typer.main

    commands = typer.main.get_command(app).commands
    with_floats = {name for name in commands if name != "serve" and _float_options(name)}
    assert with_floats <= set(BASE), with_floats - set(BASE)


def test_the_walk_finds_the_float_options():
    found = dict.fromkeys(f for _, f in FLOAT_CASES)
    for flag in ("--burstiness", "--telemetry-interval", "--request-timeout", "--temperature",
                 "--iteration-overhead-us", "--precision", "--min-duration"):
        assert flag in found, flag


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize(("command", "flag"), FLOAT_CASES, ids=[f"{c}{f}" for c, f in FLOAT_CASES])
def test_every_float_option_rejects_non_finite_values(tmp_path, command, flag, value):
    code, err = invoke([*BASE[command], flag, value], tmp_path)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("cbbench: error: ") and flag in err[0], err


@pytest.mark.parametrize(
    ("command", "extra", "text"),
    [
        ("run", ["--slo", "ttft=inf"], "invalid SLO value"),
        ("run", ["--slo", "e2el=-inf"], "invalid SLO value"),
        ("sweep", ["--slo", "ttft_p99=inf"], "invalid SLO value"),
        ("run", ["--request-rate", "nan"], "invalid request rate"),
        ("sweep", ["--rates", "1,-inf"], "invalid request rate"),
    ],
)
def test_numbers_in_text_options_reject_non_finite_values(tmp_path, command, extra, text):
    code, err = invoke([*BASE[command], *extra], tmp_path)
    assert code == 2 and len(err) == 1 and text in err[0], err


# ---- sizes: checked against what they need before anything is allocated -----------------------
SIM_RUN = ["run", "--engine", "sim", "--num-requests", "2", "--output", "{t}/x.json"]
TORCH_RUN = ["run", "--engine", "torch", "--device", "cpu", "--model", "tiny",
             "--num-requests", "2", "--output", "{t}/x.json"]
HUGE = "1000000000000"  # 10^12


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        ([*SIM_RUN, "--num-kv-blocks", HUGE], "--num-kv-blocks"),  # MemoryError
        ([*SIM_RUN, "--preemption", "swap", "--swap-space", "1e12"], "--swap-space"),  # MemoryError
        ([*SIM_RUN, "--block-size", HUGE], "--block-size"),  # ValueError: no block fits
        ([*TORCH_RUN, "--num-kv-blocks", "100000000"], "--num-kv-blocks"),  # 205 GB RuntimeError
        ([*TORCH_RUN, "--max-model-len", "2000000000"], "--max-model-len"),  # 64 GB RoPE table
        ([*TORCH_RUN, "--max-num-seqs", HUGE], "--max-num-seqs"),  # 3.6 TiB per-slot arrays
        ([*TORCH_RUN, "--preemption", "swap", "--swap-space", "1e12"], "--swap-space"),
        (["run", "--engine", "sim", "--num-requests", "1000000000", "--output", "{t}/x.json"],
         "--num-requests"),  # 14 GB and counting
        (["run", "--engine", "sim", "--duration", "30d", "--request-rate", "100000",
          "--output", "{t}/x.json"], "--duration"),
        (["sweep", "--engine", "sim", "--num-requests", "1000000000", "--max-requests",
          "1000000000", "--rates", "1", "--min-duration", "0", "--out-dir", "{t}/s"],
         "--num-requests"),
    ],
    ids=["sim-kv-blocks", "sim-swap-space", "sim-block-size", "torch-kv-blocks",
         "torch-max-model-len", "torch-max-num-seqs", "torch-swap-space", "num-requests",
         "duration-times-rate", "sweep-num-requests"],
)
def test_a_size_beyond_memory_is_one_line_before_allocating(tmp_path, argv, flag):
    if "torch" in argv:
        pytest.importorskip("torch")
    code, err = invoke(argv, tmp_path)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("cbbench: error: ") and flag in err[0], err


# ---- a model folder's config.json -------------------------------------------------------------
GOOD_CONFIG = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
               "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
               "vocab_size": 512, "max_position_embeddings": 256}


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ("not json", "not valid JSON"),
        ('{"vocab_size": ' + "1" * 5000 + "}", "not valid JSON"),  # int() digit limit
        ([1, 2], "not a JSON object"),
        ({"num_attention_heads": 0}, "'num_attention_heads' must be an integer >= 1"),  # ZeroDivisionError
        ({"hidden_size": "x"}, "'hidden_size' must be an integer >= 1"),  # TypeError
        ({"vocab_size": None}, "'vocab_size'"),  # KeyError
        ({"num_key_value_heads": 3}, "num_attention_heads (4) must be a multiple"),
        ({"rope_scaling": "x"}, "'rope_scaling' must be an object"),  # AttributeError
        ({"rope_theta": "fast"}, "'rope_theta' must be a number > 0"),
        ({"rms_norm_eps": float("nan")}, "'rms_norm_eps' must be a number > 0"),
        ({"max_position_embeddings": -1}, "'max_position_embeddings' must be an integer >= 1"),
        ({"eos_token_id": "x"}, "'eos_token_id'"),
        ({"eos_token_id": 512}, "'eos_token_id' must be a token id below vocab_size (512)"),
        ({"eos_token_id": [2, -1]}, "-1 is not"),
        ({"eos_token_id": [2, [3]]}, "[3] is not"),
        ({"sliding_window": "x"}, "'sliding_window' must be an integer >= 1"),
        ({"model_type": ["llama"]}, "unsupported model_type"),  # TypeError: unhashable
    ],
    ids=["not-json", "big-int", "a-list", "zero-heads", "hidden-text", "no-vocab", "kv-heads",
         "rope-scaling-text", "rope-theta-text", "eps-nan", "negative-context", "eos-text",
         "eos-beyond-vocab", "eos-negative", "eos-nested",
         "window-text", "model-type-list"],
)
def test_a_malformed_model_config_is_one_line(tmp_path, change, text):
    folder = tmp_path / "model"
    folder.mkdir()
    if isinstance(change, dict):
        cfg = {k: v for k, v in {**GOOD_CONFIG, **change}.items() if v is not None}
        body = json.dumps(cfg)
    else:
        body = change if isinstance(change, str) else json.dumps(change)
    (folder / "config.json").write_text(body)
    code, err = invoke(["run", "--engine", "sim", "--model", str(folder), "--num-requests", "2",
                        "--output", "{t}/x.json"], tmp_path)
    assert code == 2 and len(err) == 1 and text in err[0], err


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ('{"eos_token_id": "x"}', "generation_config.json: 'eos_token_id' must be a token id"),
        ('{"eos_token_id": [2, 4096]}', "4096 is not"),
        ('{"eos_token_id": [2, true]}', "True is not"),
        ("[2]", "generation_config.json is not a JSON object"),
        ("{", "generation_config.json is not valid JSON"),
    ],
    ids=["text", "beyond-vocab", "bool", "a-list", "not-json"],
)
def test_a_malformed_generation_config_is_one_line(tmp_path, body, text):
    """generation_config.json's eos_token_id (the ids generate stops on) is checked as
    config.json's is."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GOOD_CONFIG))
    (folder / "generation_config.json").write_text(body)
    code, err = invoke(["run", "--engine", "sim", "--model", str(folder), "--num-requests", "2",
                        "--output", "{t}/x.json"], tmp_path)
    assert code == 2 and len(err) == 1 and text in err[0], err


def test_a_null_field_reads_as_the_field_left_out(tmp_path):
    """transformers reads an explicit null as the field left out: a null num_key_value_heads
    is num_attention_heads (LlamaConfig: ``if num_key_value_heads is None``), a null
    head_dim is hidden_size // num_attention_heads. It was a TypeError traceback at the
    first KV size. A null max_position_embeddings is vLLM's default_max_len, 2048."""
    from cbbench.engine.model_config import get_model_config

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {**GOOD_CONFIG, "model_type": "mistral", "num_key_value_heads": None, "head_dim": None,
         "max_position_embeddings": None, "rms_norm_eps": None, "sliding_window": None}))
    m = get_model_config(str(folder))
    assert (m.num_kv_heads, m.head_dim, m.max_model_len, m.rms_norm_eps) == (4, 16, 2048, 1e-6)
    assert not m.has_sliding_window
    assert m.kv_bytes_per_token("bf16") == 2 * 2 * 4 * 16 * 2


def test_a_model_config_beyond_memory_is_one_line(tmp_path):
    pytest.importorskip("torch")
    folder = tmp_path / "model"
    folder.mkdir()
    huge = {**GOOD_CONFIG, "hidden_size": 2**20, "intermediate_size": 2**22,
            "num_hidden_layers": 1000, "vocab_size": 2**20}
    (folder / "config.json").write_text(json.dumps(huge))
    (folder / "model.safetensors").write_bytes(b"")
    code, err = invoke([*TORCH_RUN[:6], str(folder), *TORCH_RUN[7:]], tmp_path)
    assert code == 2 and len(err) == 1 and "the weights" in err[0], err


# ---- found in this round: more numbers without a range -----------------------------------------
@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["sweep", "--engine", "sim", "--num-requests", "2", "--points", "1000000000",
          "--min-duration", "0", "--out-dir", "{t}/s"], "--points"),  # linspace of 10^9: OOM
        ([*SIM_RUN, "--workload", "random", "--prefix-len", HUGE], "--prefix-len"),
        ([*SIM_RUN, "--workload", "random", "--input-len", HUGE, "--prefix-len", "100"],
         "--input-len"),  # 7 TiB of token ids
        ([*TORCH_RUN, "--seed", str(2**70)], "--seed"),  # torch.manual_seed overflow
        ([*SIM_RUN, "--seed", str(2**70)], "--seed"),
        ([*SIM_RUN, "--workload", "sharegpt-multiturn", "--think-time", "1e300"], "--think-time"),
        ([*SIM_RUN, "--cancel-rate", "0.5", "--cancel-after", "exp:1e300"], "--cancel-after"),
    ],
    ids=["sweep-points", "random-prefix-len", "random-input-len", "torch-seed", "sim-seed",
         "think-time", "cancel-after"],
)
def test_more_numbers_have_a_range(tmp_path, argv, flag):
    if "torch" in argv:
        pytest.importorskip("torch")
    code, err = invoke(argv, tmp_path)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("cbbench: error: ") and flag in err[0], err


# Each crashed or exhausted the process it ran in: run in a child whose memory is capped.
CHILD_MEMORY_CAP_BYTES = 4 << 30


def _cap_child_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_CAP_BYTES, CHILD_MEMORY_CAP_BYTES))


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        ([*TORCH_RUN, "--cpu-threads", "100000000"], "--cpu-threads"),  # SIGSEGV
        ([*SIM_RUN, "--data-parallel-size", "1000000000"], "--data-parallel-size"),  # 2 MB each
    ],
    ids=["torch-cpu-threads", "sim-data-parallel-size"],
)
def test_numbers_that_took_the_process_down_are_one_line(tmp_path, argv, flag):
    import shutil
    import subprocess
    import sys

    if "torch" in argv:
        pytest.importorskip("torch")
    exe = shutil.which("cbbench")
    command = [exe] if exe else [sys.executable, "-c", "from cbbench.cli.app import main; main()"]
    argv = [a.replace("{t}", str(tmp_path)) for a in argv]
    proc = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=120,
                          preexec_fn=_cap_child_memory, cwd=tmp_path)
    err = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(err) == 1 and err[0].startswith("cbbench: error: ") and flag in err[0], err


def test_a_huge_sweep_rate_is_saved_under_a_short_name(tmp_path):
    """`sweep --rates 1e308` ran the point, then could not save it: 'rate-1000...0.json' (309
    digits) is a file name too long for any filesystem, so the measurement was lost."""
    code, err = invoke(["sweep", "--engine", "sim", "--num-requests", "2", "--rates", "1e308",
                        "--min-duration", "0", "--out-dir", "{t}/s"], tmp_path)
    assert code == 0, err
    assert (tmp_path / "s" / "rate-1e+308.json").is_file()


def test_a_sweep_rate_too_slow_to_send_is_refused_before_any_point_runs(tmp_path):
    """`sweep --rates 1,1e-300` ran rate 1 and only then refused 1e-300 (a 1e300 s schedule)."""
    code, err = invoke(["sweep", "--engine", "sim", "--num-requests", "2", "--rates",
                        "1,1e-300", "--min-duration", "0", "--out-dir", "{t}/s"], tmp_path)
    assert code == 2
    assert len(err) == 1 and "1e-300 req/s" in err[0] and "30 days" in err[0], err
    assert not (tmp_path / "s").exists()  # nothing ran


def test_rate_labels_stay_short_and_distinct():
    from cbbench.bench.probe import rate_label

    assert [rate_label(r) for r in (1e308, 1e-300, 3e-7, 2.5)] == ["1e+308", "1e-300", "3e-07",
                                                                     "2.5"]
