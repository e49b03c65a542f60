"""The torch engine's model, loaded from a Hugging Face folder, against transformers' logits
for the config.json variants real model folders carry (CPU, fp32). test_models_hf.py holds
the plain Llama, tied embeddings, llama3 rope, Qwen2, Mistral and a sharded checkpoint to a
prefill; these add decode steps and the variants it does not have.

Each tiny random model is saved with ``save_pretrained`` (or its config.json rewritten the way
older transformers wrote it), loaded by ``load_model``, and run through the paged KV path: a
prefill, then greedy decode steps one token at a time over the cache. Every step's logits must
equal ``AutoModelForCausalLM``'s for the same sequence within fp32 rounding, so the greedy
tokens are the same too. A variant the engine does not implement must be refused with a
ValueError (the CLI's one line and exit 2), never loaded to compute other logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from helpers import TINY_VOCAB, tiny_hf_model  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from cbbench.cli.app import app  # noqa: E402
from cbbench.engine.torch.models import allocate_kv_cache, load_model  # noqa: E402
from cbbench.engine.torch.models.loader import hf_model_config  # noqa: E402
from cbbench.kernels import get_backend  # noqa: E402
from cbbench.kernels.metadata import build_metadata  # noqa: E402

BLOCK_SIZE = 4
NUM_BLOCKS = 16
PROMPT_LEN = 30  # past LLAMA3's original context, so its scaling changes the logits
DECODE_STEPS = 4
ATOL = 1e-4  # fp32: the two differ by ~2e-6
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _old_format(cfg: dict) -> None:
    """config.json as transformers 4.x wrote it (Llama-3.1 on the Hub): rope_theta and
    rope_scaling at the top, no rope_parameters."""
    cfg.pop("rope_parameters", None)
    cfg.update(rope_theta=500000.0, rope_scaling=LLAMA3)


# name -> (model type, config overrides, save_pretrained kwargs, config.json rewrite)
VARIANTS = {
    "llama3-rope-old-format": ("llama", {}, {}, _old_format),
    "explicit-head-dim": ("llama", {"head_dim": 32}, {}, None),
    "qwen2-tied-head-dim": ("qwen2", {"tie_word_embeddings": True, "head_dim": 32}, {}, None),
    "mha-rope-theta": ("llama", {"num_key_value_heads": 4, "rope_theta": 1000.0}, {}, None),
    "mqa-8-heads-norm-eps": ("llama", {"num_attention_heads": 8, "num_key_value_heads": 1,
                                       "rms_norm_eps": 1e-2}, {}, None),
    # transformers' default (1e-6) where config.json leaves it out; it was read as 1e-5.
    "rms-norm-eps-left-out": ("qwen2", {}, {}, lambda c: c.pop("rms_norm_eps")),
    "bf16-config-sharded": ("llama", {"dtype": "bfloat16"}, {"max_shard_size": "20KB"}, None),
    # MistralConfig's default (8 KV heads) where config.json leaves it out; it was read as the
    # head count (16), and the load failed on the k_proj shape where transformers loads it.
    "mistral-kv-heads-left-out": ("mistral", {"num_attention_heads": 16, "num_key_value_heads": 8},
                                  {}, lambda c: c.pop("num_key_value_heads")),
}


def _save(folder: Path, kind: str, overrides: dict, save_kw: dict, rewrite) -> Path:
    tiny_hf_model(kind, **overrides).save_pretrained(folder, **save_kw)
    if rewrite is not None:
        cfg = json.loads((folder / "config.json").read_text())
        rewrite(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _engine_logits(folder: Path, prompt: list[int]) -> tuple[torch.Tensor, list[int]]:
    """(logits of the prompt's last row and of each decode step, the prompt and the greedy
    token each of those logits picked)."""
    attn = get_backend("reference", "cpu", block_size=BLOCK_SIZE)
    model, config = load_model(str(folder), torch.float32, "cpu", attn)
    kv = allocate_kv_cache(config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, "cpu")
    table = list(range(1, NUM_BLOCKS))  # block 0 is the padding block
    seq, rows = list(prompt), []
    new, start = list(prompt), 0
    with torch.no_grad():
        for _ in range(DECODE_STEPS + 1):
            md = build_metadata([len(new)], [start], [table], BLOCK_SIZE)
            hidden = model(torch.tensor(new), torch.arange(start, start + len(new)), kv, md)
            rows.append(model.compute_logits(hidden)[-1])
            start = len(seq)
            new = [int(rows[-1].argmax())]
            seq += new
    return torch.stack(rows), seq


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_transformers(tmp_path, variant):
    kind, overrides, save_kw, rewrite = VARIANTS[variant]
    folder = _save(tmp_path / variant, kind, overrides, save_kw, rewrite)
    if "max_shard_size" in save_kw:
        assert (folder / "model.safetensors.index.json").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = torch.randint(0, TINY_VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
    got, seq = _engine_logits(folder, prompt.tolist())
    with torch.no_grad():
        want = hf(torch.tensor([seq[:-1]])).logits[0, PROMPT_LEN - 1 :].float()
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert seq[PROMPT_LEN:] == want.argmax(-1).tolist()


# name -> (model type, the config.json field left out, config overrides)
LEFT_OUT = {
    "llama-context": ("llama", "max_position_embeddings", {}),  # 2048 (was 4096)
    "qwen2-context": ("qwen2", "max_position_embeddings", {}),  # 32768
    "mistral-context": ("mistral", "max_position_embeddings", {"sliding_window": None}),  # 131072
    "mistral-window": ("mistral", "sliding_window", {"max_position_embeddings": 8192}),  # 4096
}


@pytest.mark.parametrize("variant", LEFT_OUT)
def test_left_out_fields_read_as_transformers_does(tmp_path, variant):
    """A field config.json leaves out is what transformers' config class defaults it to, the
    config vLLM derives max_model_len from: the context (capped to a Mistral's default window,
    where the engine's full attention stops being exact) and the KV heads."""
    kind, key, overrides = LEFT_OUT[variant]
    folder = _save(tmp_path / variant, kind, overrides, {}, lambda c: c.pop(key))
    hf = transformers.AutoConfig.from_pretrained(folder)
    config = hf_model_config(folder)
    window = getattr(hf, "sliding_window", None) or hf.max_position_embeddings
    assert config.max_model_len == min(hf.max_position_embeddings, window)
    assert config.num_kv_heads == hf.num_key_value_heads


def test_many_unexpected_tensors_are_counted_not_listed(tmp_path):
    """mlp_bias on 32 layers listed all 96 bias names on one line."""
    folder = _save(tmp_path / "m", "llama", {"mlp_bias": True, "num_hidden_layers": 8}, {}, None)
    attn = get_backend("reference", "cpu", block_size=BLOCK_SIZE)
    with pytest.raises(ValueError) as err:
        load_model(str(folder), torch.float32, "cpu", attn)
    assert str(err.value).endswith("model.layers.0.mlp.up_proj.bias and 21 more"), err.value


# name -> (config overrides, config.json rewrite, a fragment of the refusal)
REFUSED = {
    "linear-rope": ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, None, "'linear'"),
    "dynamic-rope": ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, None, "'dynamic'"),
    "yarn-rope": ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, None, "'yarn'"),
    "mlp-bias": ({"mlp_bias": True}, None, "mlp.down_proj.bias"),
    "llama-attention-bias": ({"attention_bias": True}, None, "o_proj.bias"),
    # transformers refuses these too ("Missing required keys in `rope_parameters`").
    "llama3-missing-key": ({}, lambda c: c.update(rope_parameters={
        "rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}), "'low_freq_factor'"),
    "llama3-old-format-missing-key": ({}, lambda c: (c.pop("rope_parameters", None), c.update(
        rope_scaling={"rope_type": "llama3", "factor": 8.0})), "'low_freq_factor'"),
}


@pytest.mark.parametrize("variant", REFUSED)
def test_unsupported_variants_are_refused(tmp_path, variant):
    overrides, rewrite, fragment = REFUSED[variant]
    folder = _save(tmp_path / variant, "llama", overrides, {}, rewrite)
    attn = get_backend("reference", "cpu", block_size=BLOCK_SIZE)
    with pytest.raises(ValueError, match=fragment):
        load_model(str(folder), torch.float32, "cpu", attn)


def test_malformed_llama3_rope_is_one_line_exit_2(tmp_path):
    """It was a KeyError traceback (exit 1) from building the RoPE tables."""
    folder = _save(tmp_path / "m", "llama", {}, {}, REFUSED["llama3-missing-key"][1])
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 2}) + "\n")
    res = CliRunner().invoke(app, [
        "run", "--workload", str(workload), "--model", str(folder), "--engine", "torch",
        "--device", "cpu", "--dtype", "fp32", "--num-kv-blocks", "16",
        "--output", str(tmp_path / "r.json")])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "llama3 rope scaling needs 'low_freq_factor'" in res.output
    assert "Traceback" not in res.output
