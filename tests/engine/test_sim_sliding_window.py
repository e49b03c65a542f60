"""Sliding-window attention in the simulator: a windowed layer attends to at most the last
``sliding_window`` tokens, so at long context it reads a window's KV, not the whole history.

The truth is gpt-oss-20b's published config.json (openai/gpt-oss-20b; transformers'
GptOssConfig default agrees): ``sliding_window: 128`` and ``layer_types`` alternating
sliding_attention / full_attention over its 24 layers, the first windowed: 12 windowed, 12
full. Its KV per token per layer is K and V of 8 heads x 64 x 2 B = 2,048 B.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import cli_in_process

from cbbench.engine.model_config import MODEL_PRESETS, ModelConfig, from_hf_config
from cbbench.engine.sim.cost_model import ATTENTION_OP, BatchShape, CostModel, Efficiency
from cbbench.engine.sim.gpu_specs import get_gpu_spec

IDEAL = Efficiency(eta_memory=1.0, eta_compute=1.0, overhead_s=0.0)
KV_PER_LAYER_TOKEN = 2 * 8 * 64 * 2  # 2,048 B
GPT_OSS_LAYER_TYPES = ["sliding_attention", "full_attention"] * 12

GPT_OSS_CONFIG = {
    "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 201088, "num_local_experts": 32, "experts_per_token": 4,
    "num_experts_per_tok": 4, "attention_bias": True, "max_position_embeddings": 131072,
    "quantization_config": {"quant_method": "mxfp4"}, "rope_theta": 150000,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0}, "sliding_window": 128,
    "layer_types": GPT_OSS_LAYER_TYPES,
}  # fmt: skip


def _write(folder, cfg: dict):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


def _full(m: ModelConfig) -> ModelConfig:
    return replace(m, sliding_window=None, sliding_window_layers=0)


def test_gpt_oss_preset_and_config_carry_the_window(tmp_path):
    p = MODEL_PRESETS["gpt-oss-20b"]
    assert (p.sliding_window, p.sliding_window_layers) == (128, 12)
    m = from_hf_config(_write(tmp_path / "oss", GPT_OSS_CONFIG))
    assert (m.sliding_window, m.sliding_window_layers) == (128, 12)
    # Without layer_types, gpt-oss's default (transformers' GptOssConfig): every other layer.
    cfg = {k: v for k, v in GPT_OSS_CONFIG.items() if k != "layer_types"}
    assert from_hf_config(_write(tmp_path / "oss2", cfg)).sliding_window_layers == 12
    # A round trip through a result's model_config keeps it; a model without a window is
    # recorded as before (no new keys).
    assert ModelConfig.from_dict(p.to_dict()) == p
    assert "sliding_window" not in MODEL_PRESETS["llama-3-8b"].to_dict()


def test_other_configs_window_only_where_they_say_so(tmp_path):
    """Mistral v0.1 (``sliding_window: 4096``, no layer_types): every layer windowed, as
    transformers' Mistral attention does; Qwen2.5 (``sliding_window: 131072`` beside
    ``use_sliding_window: false``): none; Mistral v0.3 (``sliding_window: null``): none."""
    mistral = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096}
    m = from_hf_config(_write(tmp_path / "m1", mistral))
    assert (m.sliding_window, m.sliding_window_layers) == (4096, 32)
    m = from_hf_config(_write(tmp_path / "m3", {**mistral, "sliding_window": None}))
    assert not m.has_sliding_window
    qwen = {**mistral, "model_type": "qwen2", "sliding_window": 131072,
            "use_sliding_window": False, "max_window_layers": 28}
    assert not from_hf_config(_write(tmp_path / "q", qwen)).has_sliding_window


def test_long_context_decode_reads_the_window_on_windowed_layers():
    """The reviewer's case: 32 decode rows at a 32,000-token context on an H100. True KV
    read: 32 rows x (12 full layers x 32,001 keys + 12 windowed x 128) x 2,048 B =
    25,267,273,728 B, plus q read and o written (2 x 32 x 4096 x 2 B x 24 layers =
    12,582,912 B) = 25,279,856,640 B for the attention operator. (Was 50.33 GB: every layer
    read all 32,001 keys, a 23.80 ms step at the default efficiencies; now ~14.4 ms.)"""
    m, gpu = MODEL_PRESETS["gpt-oss-20b"], get_gpu_spec("h100")
    shape = BatchShape.decodes(32, 32 * 32001.0)
    cm = CostModel(m, "bf16", gpu)
    kv = 32 * (12 * 32001 + 12 * 128) * KV_PER_LAYER_TOKEN
    assert kv == 25_267_273_728
    qo = 2 * 32 * 4096 * 2 * 24
    assert cm.operators(shape)[ATTENTION_OP][1] == kv + qo
    full = CostModel(_full(m), "bf16", gpu)
    assert full.operators(shape)[ATTENTION_OP][1] == 32 * 24 * 32001 * KV_PER_LAYER_TOKEN + qo
    assert cm.cost(shape).time_s == pytest.approx(0.01445, abs=2e-4)
    assert full.cost(shape).time_s == pytest.approx(0.02380, abs=2e-4)


def test_within_the_window_nothing_changes_and_prefill_is_bounded():
    """A context under the window: every layer reads every key, the windowed model costs what
    the full one does. A 1000-token prefill: a windowed layer's rows attend
    sum_{j=1}^{1000} min(j, 128) = 128 x 129 / 2 + 872 x 128 = 119,872 pairs (the full
    layer 500,500); the model's bound from the batch's sums, min(500,500, 1000 x 128) =
    128,000, lies between the truth and the full count (never priced faster than it runs)."""
    m, gpu = MODEL_PRESETS["gpt-oss-20b"], get_gpu_spec("h100")
    cm, full = CostModel(m, "bf16", gpu, IDEAL), CostModel(_full(m), "bf16", gpu, IDEAL)
    short = BatchShape.decodes(4, 4 * 100.0)
    assert cm.cost(short).time_s == full.cost(short).time_s
    assert cm.cost(short).bytes == full.cost(short).bytes
    n = 1000
    prefill = BatchShape(n, 1, n * (n + 1) / 2, float(n), 1, 1, 0.0)
    afp = 4 * 64 * 64  # FLOPs per key pair per layer
    true_pairs = 128 * 129 // 2 + (n - 128) * 128
    assert true_pairs == 119_872
    flops = cm.operators(prefill)[ATTENTION_OP][0]
    assert afp * (12 * 500_500 + 12 * true_pairs) <= flops == afp * (12 * 500_500 + 12 * 128_000)
    assert flops < full.operators(prefill)[ATTENTION_OP][0]


def test_a_simulated_gpt_oss_run_fast_forwards_as_it_steps():
    """The window is priced from the batch's counts, the same in a stepped engine, a
    fast-forwarded decode stretch and the array simulator: the same run three ways."""
    from helpers import run_spec

    from cbbench.bench.runner import execute_run
    from cbbench.engine.args import EngineArgs

    def run(fast: bool):
        spec = run_spec(workload="random", input_len=300, output_len=40, num_requests=12,
                        length_range=0.5, request_rate=50.0, seed=3,
                        engine=EngineArgs(engine="sim", gpu="h100", model="gpt-oss-20b",
                                          fast_forward=fast))
        return execute_run(spec)

    a, b = run(True), run(False)
    assert [r.ttft_ms for r in a.requests] == [r.ttft_ms for r in b.requests]
    assert [it.duration_s for it in a.iterations] == [it.duration_s for it in b.iterations]


def test_bad_layer_types_is_one_line_exit_2(tmp_path):
    cfg = {**GPT_OSS_CONFIG, "layer_types": ["sliding_attention"] * 5}
    folder = _write(tmp_path / "bad", cfg).parent
    proc = cli_in_process(["run", "--engine", "sim", "--model", str(folder),
                           "--num-requests", "2", "--output", str(tmp_path / "r.json")])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "layer_types" in lines[0], proc.stderr
