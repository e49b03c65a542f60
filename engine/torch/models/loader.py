"""Build a model from a preset (random weights) or a Hugging Face folder (safetensors)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from ...model_config import MODEL_PRESETS, ModelConfig, from_hf_config, with_max_model_len
from .llama import LlamaForCausalLM

INIT_STD = 0.02  # normal init for random weights: keeps activations finite through deep stacks
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Tensors some checkpoints carry that the model derives itself.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# How many tensor names a checkpoint mismatch lists of each kind (missing, unexpected).
MISMATCH_NAMES_SHOWN = 3
# The MLP's activation (llama.py's SwiGLU computes silu(gate) * up), and the value
# transformers' Llama, Mistral and Qwen2 configs default to. Any other would load and generate
# wrong tokens; vLLM's Llama MLP refuses it too ("Only silu is supported for now").
SUPPORTED_HIDDEN_ACT = "silu"
# What llama.py's rope_inv_freq reads from a "llama3" rope scaling; transformers refuses a
# config without one of them ("Missing required keys in `rope_parameters`").
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")

# Hugging Face name fragment -> (our fused parameter fragment, shard index within it).
_FUSED = {
    ".self_attn.q_proj.": (".self_attn.qkv_proj.", 0),
    ".self_attn.k_proj.": (".self_attn.qkv_proj.", 1),
    ".self_attn.v_proj.": (".self_attn.qkv_proj.", 2),
    ".mlp.gate_proj.": (".mlp.gate_up_proj.", 0),
    ".mlp.up_proj.": (".mlp.gate_up_proj.", 1),
}

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(_DTYPES)}") from None


def load_model(
    model: str,
    dtype: torch.dtype | str,
    device: torch.device | str,
    attn_backend,
    seed: int = 0,
    max_model_len: int | None = None,
    fused: bool = False,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """A preset name (random weights, deterministic from ``seed``) or a Hugging Face folder.

    ``max_model_len`` sets the context length (it sizes the RoPE tables): a preset's may be
    stretched, a folder's at most its own (check_max_model_len); ``fused`` picks the
    Triton layer kernels (see ``LlamaForCausalLM``).
    """
    dtype = resolve_dtype(dtype)
    if model in MODEL_PRESETS:
        config = MODEL_PRESETS[model]
        check_dense(config)
        if max_model_len is not None:
            config = with_max_model_len(config, max_model_len)
        net = LlamaForCausalLM(config, attn_backend, dtype=dtype, device=device, fused=fused)
        init_random_weights(net, seed)
        return net.eval(), config

    folder = Path(model)
    if not folder.is_dir():
        raise ValueError(
            f"model {model!r} is neither a preset ({', '.join(sorted(MODEL_PRESETS))}) "
            "nor an existing folder"
        )
    config = hf_model_config(folder)
    check_dense(config)
    if max_model_len is not None:
        check_max_model_len(max_model_len, config, folder)
        config = with_max_model_len(config, max_model_len)
    files = safetensors_files(folder)
    net = LlamaForCausalLM(config, attn_backend, dtype=dtype, device=device, fused=fused)
    load_hf_weights(net, files)
    return net.eval(), config


def check_max_model_len(max_model_len: int, config: ModelConfig, folder: Path) -> None:
    """A context beyond the folder's own is refused, as vLLM refuses to start ("User-specified
    max_model_len ... is greater than the derived max_model_len"): cut silently to the
    folder's, requests between the two failed one by one as beyond "the model's context"."""
    if max_model_len <= config.max_model_len:
        return
    config_path = folder / "config.json"
    windowed = config.has_sliding_window and config.sliding_window == config.max_model_len
    source = (f"the sliding_window in {config_path}: attention is exact only within it"
              if windowed else f"max_position_embeddings in {config_path}")
    raise ValueError(f"--max-model-len {max_model_len} is greater than the model's context of "
                     f"{config.max_model_len} ({source})")


def check_dense(config: ModelConfig) -> None:
    """The torch engine implements the dense Llama family; MoE models are simulated only."""
    if config.is_moe:
        raise ValueError(f"{config.name} is a mixture-of-experts model: the torch engine runs "
                         "dense Llama-family models; use --engine sim")


def hf_model_config(folder: Path) -> ModelConfig:
    """``from_hf_config`` plus what it does not read.

    - transformers >= 5 writes ``rope_parameters`` (theta and scaling together) instead of
      ``rope_theta`` / ``rope_scaling``.
    - Sliding-window attention (Mistral v0.1) is not implemented, but within the window it
      equals full attention, so the context is capped to the window to stay exact.
    - ``hidden_act``: the MLP is SiLU-gated; another activation is refused.
    """
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"model folder {folder} has no config.json")
    config = from_hf_config(config_path)  # raises ValueError on an unsupported model_type
    raw = json.loads(config_path.read_text())
    act = raw.get("hidden_act", SUPPORTED_HIDDEN_ACT)
    if act != SUPPORTED_HIDDEN_ACT:
        raise ValueError(f"unsupported hidden_act {act!r} in {config_path}: the torch engine's "
                         f"MLP is {SUPPORTED_HIDDEN_ACT!r}-gated")

    rope = raw.get("rope_parameters")
    if isinstance(rope, dict) and raw.get("rope_scaling") is None:
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", "llama3"):
            raise ValueError(f"unsupported rope_type {kind!r} in {config_path}")
        config = replace(
            config,
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", config.rope_theta))),
            rope_scaling=dict(rope) if kind == "llama3" else None,
        )

    if config.rope_scaling:
        _check_llama3_rope(config.rope_scaling, config_path)

    window = config.sliding_window  # from_hf_config's: the model type's default included
    if config.has_sliding_window and window and window < config.max_model_len:
        config = with_max_model_len(config, int(window))
    return config


def _check_llama3_rope(scaling: dict, config_path: Path) -> None:
    """Each llama3 field a number > 0 (a missing one was a KeyError traceback at model build)."""
    for key in LLAMA3_ROPE_KEYS:
        v = scaling.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ValueError(f"{config_path}: llama3 rope scaling needs {key!r} as a number > 0, "
                             f"got {v!r}")


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model folder {folder} has no *.safetensors files")
    return files


def load_hf_weights(net: LlamaForCausalLM, files: list[Path]) -> None:
    """Copy every Hugging Face tensor into its (possibly fused) parameter; check completeness."""
    from safetensors import safe_open

    params = dict(net.named_parameters())  # tied lm_head shares the embedding: listed once
    tied = net.config.tie_word_embeddings
    # Every (parameter, shard) that must be filled; a fused parameter has one entry per shard.
    expected: set[tuple[str, int | None]] = {(name, None) for name in params}
    for name in list(params):
        for ours, _ in _FUSED.values():
            if ours in name:
                expected.discard((name, None))
                num_shards = 3 if "qkv" in ours else 2
                expected.update((name, s) for s in range(num_shards))
                break
    loaded: set[tuple[str, int | None]] = set()
    unexpected: list[str] = []

    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if hf_name.endswith(IGNORED_SUFFIXES):
                        continue
                    if tied and hf_name == "lm_head.weight":
                        continue  # the embedding is the head; a stored copy is redundant
                    name, shard = _our_name(hf_name)
                    if name not in params:
                        unexpected.append(hf_name)
                        continue
                    target = _shard_view(net, params[name], name, shard)
                    tensor = f.get_tensor(hf_name)
                    if tensor.shape != target.shape:
                        raise ValueError(
                            f"tensor {hf_name} in {file.name} has shape {tuple(tensor.shape)}, "
                            f"expected {tuple(target.shape)}"
                        )
                    target.copy_(tensor)
                    loaded.add((name, shard))

    missing = sorted(_describe(name, shard) for name, shard in expected - loaded)
    if missing or unexpected:
        parts = [f"{kind} tensors: {_first_names(names)}"
                 for kind, names in (("missing", missing), ("unexpected", sorted(unexpected)))
                 if names]
        raise ValueError(f"checkpoint does not match the model: {'; '.join(parts)}")


def _first_names(names: list[str]) -> str:
    """A few names and how many more: every bias of a 32-layer model (mlp_bias) was ~100 names
    on one line."""
    more = len(names) - MISMATCH_NAMES_SHOWN
    return ", ".join(names[:MISMATCH_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _our_name(hf_name: str) -> tuple[str, int | None]:
    for fragment, (ours, shard) in _FUSED.items():
        if fragment in hf_name:
            return hf_name.replace(fragment, ours), shard
    return hf_name, None


def _shard_view(net: LlamaForCausalLM, param: torch.Tensor, name: str, shard: int | None):
    """The rows of a fused parameter that one Hugging Face tensor fills (dim 0 for W and b)."""
    if shard is None:
        return param
    c = net.config
    sizes = [c.q_size, c.kv_size, c.kv_size] if "qkv_proj" in name else [c.intermediate_size] * 2
    start = sum(sizes[:shard])
    return param.narrow(0, start, sizes[shard])


def _describe(name: str, shard: int | None) -> str:
    """Our (parameter, shard) back to the Hugging Face tensor name a user would look for."""
    if shard is None:
        return name
    for fragment, (ours, s) in _FUSED.items():
        if ours in name and s == shard:
            return name.replace(ours, fragment)
    return f"{name}[{shard}]"


def init_random_weights(net: LlamaForCausalLM, seed: int = 0, std: float = INIT_STD) -> None:
    """Deterministic random weights: normal(0, std) matrices and embeddings, zero biases,
    unit norms. Drawn on the model's device, so a seed reproduces per device type."""
    device = next(net.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in net.named_parameters():  # tied weights appear once
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=gen)
