"""Our Llama-family implementation and loader against Hugging Face transformers (CPU, fp32).

Each test builds a tiny random model with transformers, saves it as safetensors, loads it with
our loader and compares a full-prompt forward through our packed path (reference backend) with
``model(input_ids).logits``.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
from helpers import TINY_VOCAB, tiny_hf_model  # noqa: E402

from cbbench.engine.core.request import Request  # noqa: E402
from cbbench.engine.core.scheduler_output import SchedulerOutput  # noqa: E402
from cbbench.engine.torch.model_runner import ModelRunner  # noqa: E402
from cbbench.engine.torch.models import allocate_kv_cache, load_model  # noqa: E402
from cbbench.kernels import get_backend  # noqa: E402

TOL = 1e-4
BLOCK_SIZE = 4
PROMPT_LEN = 37  # not a multiple of the block size; past the llama3 variant's original context
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,  # small, so all three frequency bands occur
}


def _save(model, path, **kwargs):
    model.save_pretrained(path, **kwargs)
    return path


def _packed_logits(model, config, token_ids: list[int]) -> torch.Tensor:
    """Logits of every row of one full-prompt request through the runner's packed batch."""
    num_blocks = -(-len(token_ids) // BLOCK_SIZE) + 2
    kv_caches = allocate_kv_cache(config, num_blocks, BLOCK_SIZE, torch.float32, "cpu")
    runner = ModelRunner(model, config, kv_caches, BLOCK_SIZE, "cpu", torch.float32)
    req = Request(0, len(token_ids), 1, prompt_token_ids=token_ids)
    req.block_table = list(reversed(range(num_blocks)))  # non-contiguous on purpose
    sched = SchedulerOutput([req], [len(token_ids)], 0, len(token_ids), len(token_ids))
    batch = runner.prepare(sched)
    with torch.inference_mode():
        hidden = model(batch.input_ids, batch.positions, kv_caches, batch.metadata)
        return model.compute_logits(hidden)


def _check_against_hf(hf_model, folder):
    model, config = load_model(str(folder), torch.float32, "cpu", get_backend("reference", "cpu"))
    ids = torch.randint(
        0, TINY_VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        expected = hf_model(ids.unsqueeze(0)).logits[0].float()
    got = _packed_logits(model, config, ids.tolist())
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL
    return model, config


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama_matches_hf(tmp_path, tied):
    hf = tiny_hf_model("llama", tie_word_embeddings=tied)
    model, config = _check_against_hf(hf, _save(hf, tmp_path))
    assert config.tie_word_embeddings is tied
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied


def test_llama3_rope_scaling_matches_hf(tmp_path):
    hf = tiny_hf_model("llama", rope_scaling=LLAMA3_ROPE, rope_theta=500000.0)
    _, config = _check_against_hf(hf, _save(hf, tmp_path))
    assert config.rope_scaling is not None and config.rope_scaling["factor"] == 8.0
    assert config.rope_theta == 500000.0


def test_qwen2_qkv_bias_matches_hf(tmp_path):
    hf = tiny_hf_model("qwen2", rope_theta=1000000.0)
    model, config = _check_against_hf(hf, _save(hf, tmp_path))
    assert config.qkv_bias and model.model.layers[0].self_attn.qkv_proj.bias is not None


def test_mistral_matches_hf(tmp_path):
    hf = tiny_hf_model("mistral", sliding_window=128)
    _, config = _check_against_hf(hf, _save(hf, tmp_path))
    assert config.architecture == "mistral"
    assert config.max_model_len == 128  # capped to the sliding window, where it is exact


def test_sharded_checkpoint_loads(tmp_path):
    hf = tiny_hf_model("llama")
    folder = _save(hf, tmp_path, max_shard_size="40KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    _check_against_hf(hf, folder)


# ---- errors ---------------------------------------------------------------------------------


def _load(folder):
    return load_model(str(folder), torch.float32, "cpu", get_backend("reference", "cpu"))


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="neither a preset"):
        _load(tmp_path / "nope")


def test_folder_without_safetensors(tmp_path):
    tiny_hf_model("llama").config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        _load(tmp_path)


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        _load(tmp_path)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    hf = tiny_hf_model("llama")
    hf.config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    del state["model.layers.1.self_attn.k_proj.weight"]
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        _load(tmp_path)
    assert "missing tensors: model.layers.1.self_attn.k_proj.weight" in str(err.value)
    assert "unexpected tensors: model.layers.0.mlp.extra.weight" in str(err.value)


def test_shape_mismatch_is_named(tmp_path):
    hf = tiny_hf_model("llama")
    hf.config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    state["model.norm.weight"] = torch.ones(3)
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight .* shape \\(3,\\)"):
        _load(tmp_path)
