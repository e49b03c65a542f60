"""Model architecture descriptions: named presets and Hugging Face config.json parsing.

Pure Python (no torch) so the simulated engine starts fast. The same presets drive the
simulator's roofline and the torch engine's random-weight models.
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on q/k/v projections
    rope_theta: float = 10000.0
    # Llama-3.x "llama3" rope scaling: factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings. None means plain RoPE.
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    rms_norm_eps: float = 1e-5
    # The end-of-sequence ids: a generated one stops a request (unless it ignores EOS). Hugging
    # Face's generate stops on any of them; from generation_config.json, else config.json.
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"  # llama | qwen2 | mistral: all share one implementation
    # Mixture of experts (the simulator only): every layer's MLP is num_experts SwiGLU experts
    # of moe_intermediate_size, num_experts_per_tok of them chosen per token by a linear
    # router (h x E). 0 experts: a dense model.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    expert_bias: bool = False  # gpt-oss: biases on each expert's projections and the router
    # Bits per expert weight when the experts are stored quantized (gpt-oss: MXFP4, 4 bits
    # plus one 8-bit scale per 32 values = 4.25); None: the model's dtype.
    expert_weight_bits: float | None = None
    # Sliding-window attention: ``sliding_window_layers`` of the layers attend only to the last
    # ``sliding_window`` tokens (the query's own included), so they read at most that many keys
    # per row; the rest attend to the whole context. gpt-oss: 12 of 24 (every other layer,
    # its config.json's layer_types), window 128. None / 0: every layer attends fully.
    sliding_window: int | None = None
    sliding_window_layers: int = 0

    # ---- derived sizes (counts of parameters, not bytes) ----
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        return attn

    @property
    def params_per_expert(self) -> int:
        """One SwiGLU expert: gate and up (h x I each) and down (I x h), with biases on
        gpt-oss."""
        h, inter = self.hidden_size, self.moe_intermediate_size
        return 3 * h * inter + (2 * inter + h if self.expert_bias else 0)

    @property
    def router_params_per_layer(self) -> int:
        e = self.num_experts
        return self.hidden_size * e + (e if self.expert_bias else 0) if e else 0

    @property
    def expert_params(self) -> int:
        """Every expert of every layer (the part stored at expert_weight_bits)."""
        return self.num_layers * self.num_experts * self.params_per_expert

    @property
    def params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_moe:
            mlp = self.num_experts * self.params_per_expert + self.router_params_per_layer
        else:
            mlp = 3 * h * self.intermediate_size
        norms = 2 * h
        return self.attention_params_per_layer + mlp + norms

    @property
    def active_params(self) -> int:
        """Parameters one token's forward uses: the chosen experts only (all, when dense)."""
        if not self.is_moe:
            return self.num_params
        unused = self.num_experts - self.num_experts_per_tok
        return self.num_params - self.num_layers * unused * self.params_per_expert

    def expert_bytes_per_param(self, dtype: str = "bf16") -> float:
        if self.expert_weight_bits is None:
            return float(DTYPE_BYTES[dtype])
        return self.expert_weight_bits / 8

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        final_norm = self.hidden_size
        return (
            self.num_layers * self.params_per_layer
            + self.embedding_params
            + self.lm_head_params
            + final_norm
        )

    def weight_bytes(self, dtype: str = "bf16") -> int:
        """All weights; quantized experts at their own width."""
        dense = (self.num_params - self.expert_params) * DTYPE_BYTES[dtype]
        return int(dense + math.ceil(self.expert_params * self.expert_bytes_per_param(dtype)))

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """K and V for every layer: 2 * layers * kv_heads * head_dim * dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    @property
    def has_sliding_window(self) -> bool:
        return self.sliding_window is not None and self.sliding_window_layers > 0

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["eos_token_ids"]
        if not self.has_sliding_window:
            # A model without windowed layers is recorded as it was before the fields existed.
            del d["sliding_window"], d["sliding_window_layers"]
        return {**d, **eos_record(self.eos_token_ids)}

    @classmethod
    def from_dict(cls, d: object) -> ModelConfig:
        """A result's ``model_config`` (``to_dict``'s, or an older one's) as a ModelConfig."""
        if not isinstance(d, dict):
            raise TypeError(f"a model_config is an object, not {type(d).__name__}")
        fields = {k: v for k, v in d.items() if k not in ("eos_token_id", "eos_token_ids")}
        return cls(**fields, eos_token_ids=eos_ids_of(d))


def eos_record(ids: tuple[int, ...]) -> dict:
    """How a result records a model's end-of-sequence ids: ``eos_token_id`` the first (None:
    none), the one field results had; ``eos_token_ids`` all of them, only where there are
    several (a record of one id reads as it did)."""
    d: dict = {"eos_token_id": ids[0] if ids else None}
    if len(ids) > 1:
        d["eos_token_ids"] = list(ids)
    return d


def eos_ids_of(record: dict) -> tuple[int, ...]:
    """The end-of-sequence ids an ``eos_record`` (or an older result's single
    ``eos_token_id``) holds."""
    ids = record.get("eos_token_ids")
    if ids is None:
        one = record.get("eos_token_id")
        ids = [] if one is None else [one]
    return tuple(ids)


# MXFP4 (OCP microscaling): 4-bit values, one 8-bit shared scale per block of 32.
MXFP4_BITS = 4 + 8 / 32


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_LLAMA32_ROPE = {**_LLAMA3_ROPE, "factor": 32.0}

MODEL_PRESETS: dict[str, ModelConfig] = {
    "llama-3-8b": ModelConfig(
        name="llama-3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, max_model_len=8192,
        rope_theta=500000.0, eos_token_ids=(128009,),
    ),
    "llama-3.1-8b": ModelConfig(
        name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, max_model_len=131072,
        rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, eos_token_ids=(128009,),
    ),
    "llama-3.1-70b": ModelConfig(
        name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
        head_dim=128, intermediate_size=28672, vocab_size=128256, max_model_len=131072,
        rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, eos_token_ids=(128009,),
    ),
    "llama-3.2-1b": ModelConfig(
        name="llama-3.2-1b", num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, max_model_len=131072,
        rope_theta=500000.0, rope_scaling=_LLAMA32_ROPE, tie_word_embeddings=True,
        eos_token_ids=(128009,),
    ),
    "llama-2-7b": ModelConfig(
        name="llama-2-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
        head_dim=128, intermediate_size=11008, vocab_size=32000, max_model_len=4096,
        rms_norm_eps=1e-5, eos_token_ids=(2,),
    ),
    "mistral-7b": ModelConfig(
        name="mistral-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=32768, max_model_len=32768,
        rope_theta=1000000.0, architecture="mistral", eos_token_ids=(2,),
    ),
    "qwen2.5-7b": ModelConfig(
        name="qwen2.5-7b", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
        head_dim=128, intermediate_size=18944, vocab_size=152064, max_model_len=32768,
        rope_theta=1000000.0, qkv_bias=True, rms_norm_eps=1e-6, architecture="qwen2",
        eos_token_ids=(151645,),
    ),
    # Mixture-of-experts presets (the simulator only), from each model's published config.json.
    "mixtral-8x7b": ModelConfig(
        name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=32000, max_model_len=32768,
        rope_theta=1000000.0, architecture="mixtral", eos_token_ids=(2,),
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336,
    ),
    "qwen3-30b-a3b": ModelConfig(
        name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4,
        head_dim=128, intermediate_size=6144, vocab_size=151936, max_model_len=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, architecture="qwen3_moe",
        eos_token_ids=(151645,), num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
    ),
    # Its experts ship in MXFP4 (quantization_config), the rest in bf16. Its layer_types
    # alternate sliding_attention (window 128) and full_attention: 12 windowed of 24.
    "gpt-oss-20b": ModelConfig(
        name="gpt-oss-20b", num_layers=24, hidden_size=2880, num_heads=64, num_kv_heads=8,
        head_dim=64, intermediate_size=2880, vocab_size=201088, max_model_len=131072,
        rope_theta=150000.0, qkv_bias=True, architecture="gpt_oss", eos_token_ids=(200002,),
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=2880, expert_bias=True,
        expert_weight_bits=MXFP4_BITS, sliding_window=128, sliding_window_layers=12,
    ),
    # Small presets for the torch engine on a CPU and for tests (random weights only).
    "small": ModelConfig(
        name="small", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
        head_dim=32, intermediate_size=384, vocab_size=4096, max_model_len=4096,
        rope_theta=500000.0,
    ),
    "tiny": ModelConfig(
        name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=128, vocab_size=512, max_model_len=2048,
    ),
}


def preset_names() -> list[str]:
    return sorted(MODEL_PRESETS)


def get_model_config(name_or_path: str) -> ModelConfig:
    """A preset by name, or a Hugging Face model folder's config.json."""
    if name_or_path in MODEL_PRESETS:
        return MODEL_PRESETS[name_or_path]
    path = Path(name_or_path)
    if (path / "config.json").is_file():
        return from_hf_config(path / "config.json")
    raise ValueError(
        f"unknown model {name_or_path!r}: not a preset ({', '.join(preset_names())}) "
        "and not a folder with a config.json"
    )


_SUPPORTED_HF_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2",
                       "mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "gpt_oss": "gpt_oss"}
# Mixture-of-experts model types: config.json key of (expert count, experts per token, expert
# width). Both a count and a top-k are required: without them there is no MoE to model.
_MOE_FIELDS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
}


# What transformers' config class per model type (LlamaConfig, MistralConfig, Qwen2Config,
# MixtralConfig, Qwen3MoeConfig, GptOssConfig) sets where config.json leaves a field out: what
# AutoConfig gives, so what HF runs and vLLM derives its max_model_len and KV heads from. A
# field given as null is not defaulted: those classes read it as "derive it" (a null
# num_key_value_heads is the head count, a null sliding_window no window).
_HF_DEFAULTS: dict[str, dict[str, object]] = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    "mistral": {"max_position_embeddings": 131072, "num_key_value_heads": 8,
                "sliding_window": 4096, "rms_norm_eps": 1e-6},
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32,
              "sliding_window": 4096, "max_window_layers": 28, "rms_norm_eps": 1e-6},
    "mixtral": {"max_position_embeddings": 131072, "num_key_value_heads": 8,
                "rope_theta": 1e6, "rms_norm_eps": 1e-5},
    "qwen3_moe": {"max_position_embeddings": 32768, "num_key_value_heads": 4,
                  "sliding_window": 4096, "rms_norm_eps": 1e-6},
    "gpt_oss": {"max_position_embeddings": 131072, "num_key_value_heads": 8, "head_dim": 64,
                "sliding_window": 128, "rope_theta": 150000.0, "rms_norm_eps": 1e-5},
}

# Fields whose null transformers' config classes read as "derive it", not as the default: a
# null num_key_value_heads is the head count, head_dim hidden // heads, sliding_window no
# window; max_position_embeddings, no length (vLLM's default_max_len).
NULL_DERIVED = frozenset({"num_key_value_heads", "head_dim", "sliding_window",
                          "max_position_embeddings"})
# The context where config.json's max_position_embeddings is null: vLLM's default_max_len
# ("does not contain any of the keys to determine the original maximum length").
NO_CONTEXT_FIELD_LEN = 2048

# A model's config.json is a few kB; one far larger (or an endless stream) is not one.
CONFIG_MAX_BYTES = 16 << 20
# Beside config.json: the generation defaults (the end-of-sequence ids among them) that
# transformers' generate uses.
GENERATION_CONFIG = "generation_config.json"


def _read_hf_config(config_path: Path) -> dict:
    """config.json as a dict whose fields, where present, have the kinds a model needs: a
    malformed one is a ValueError naming the field (it was a ZeroDivisionError, TypeError,
    KeyError or AttributeError from deep inside)."""
    from .json_file import read_json

    cfg = read_json(config_path, "model config", CONFIG_MAX_BYTES)
    if not isinstance(cfg, dict):
        raise ValueError(f"{config_path} is not a JSON object")
    # A field left out is its model type's default, as is a null one, except where
    # transformers derives a null (NULL_DERIVED): those are then dropped.
    model_type = cfg.get("model_type")
    defaults = _HF_DEFAULTS.get(model_type, {}) if isinstance(model_type, str) else {}
    cfg = {**defaults, **{k: v for k, v in cfg.items() if v is not None or k in NULL_DERIVED}}
    return {k: v for k, v in cfg.items() if v is not None}


def _check_hf_fields(cfg: dict, config_path: Path) -> None:
    def integer(key: str, required: bool = True) -> None:
        v = cfg.get(key)
        if v is None and not required:
            return
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{config_path}: {key!r} must be an integer >= 1, got {v!r}")

    for key in ("num_attention_heads", "hidden_size", "num_hidden_layers", "intermediate_size",
                "vocab_size"):
        integer(key)
    for key in ("num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window"):
        integer(key, required=False)
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if heads % kv:
        raise ValueError(f"{config_path}: num_attention_heads ({heads}) must be a multiple of "
                         f"num_key_value_heads ({kv})")
    for key in ("rope_theta", "rms_norm_eps"):
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                              or not math.isfinite(v) or v <= 0):
            raise ValueError(f"{config_path}: {key!r} must be a number > 0, got {v!r}")
    if cfg.get("rope_scaling") is not None and not isinstance(cfg["rope_scaling"], dict):
        raise ValueError(f"{config_path}: 'rope_scaling' must be an object")


def _eos_ids(value: object, path: Path, vocab_size: int) -> tuple[int, ...]:
    """An ``eos_token_id`` field (None, an id, or a list of ids) as its ids, in order, each
    once; anything else, or an id outside the vocabulary (it could never be generated), is a
    ValueError naming the file."""
    ids = [] if value is None else value if isinstance(value, list) else [value]
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
            raise ValueError(f"{path}: 'eos_token_id' must be a token id below vocab_size "
                             f"({vocab_size}) or a list of them; {reprlib.repr(i)} is not")
    return tuple(dict.fromkeys(ids))


def _model_eos_ids(cfg: dict, config_path: Path) -> tuple[int, ...]:
    """The ids Hugging Face's generate stops on: generation_config.json's ``eos_token_id``
    where the model folder has that file (its value whole, None or missing included: no EOS),
    else config.json's. transformers loads the generation config from that file when it is
    there and builds it from config.json only when it is not (adjust_generation_fn); generate
    then stops on any id of the list."""
    vocab = cfg["vocab_size"]
    ids = _eos_ids(cfg.get("eos_token_id"), config_path, vocab)  # checked even where overridden
    gen_path = config_path.parent / GENERATION_CONFIG
    if not gen_path.is_file():
        return ids
    from .json_file import read_json

    gen = read_json(gen_path, "generation config", CONFIG_MAX_BYTES)
    if not isinstance(gen, dict):
        raise ValueError(f"{gen_path} is not a JSON object")
    return _eos_ids(gen.get("eos_token_id"), gen_path, vocab)


def _moe_fields(cfg: dict, model_type: str, config_path: Path) -> dict:
    """The expert fields of an MoE config.json, checked (a missing one is a ValueError)."""
    if model_type not in _MOE_FIELDS:
        return {}
    count_key, topk_key, width_key = _MOE_FIELDS[model_type]
    if topk_key not in cfg and "experts_per_token" in cfg:  # gpt-oss writes both names
        topk_key = "experts_per_token"
    values = {}
    for key in (count_key, topk_key, width_key):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{config_path}: a {model_type} (mixture-of-experts) config needs "
                             f"{key!r} as an integer >= 1, got {v!r}")
        values[key] = v
    experts, topk = values[count_key], values[topk_key]
    if topk > experts:
        raise ValueError(f"{config_path}: {topk_key} ({topk}) exceeds {count_key} ({experts})")
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise ValueError(f"{config_path}: dense layers among the MoE layers (mlp_only_layers, "
                         "decoder_sparse_step) are not modelled")
    quant = cfg.get("quantization_config")
    mxfp4 = isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"
    return {
        "num_experts": experts,
        "num_experts_per_tok": topk,
        "moe_intermediate_size": values[width_key],
        "expert_bias": model_type == "gpt_oss",
        "expert_weight_bits": MXFP4_BITS if mxfp4 else None,
    }


# Layer types (config.json ``layer_types``) that attend within ``sliding_window``, and those
# that attend to everything.
SLIDING_LAYER = "sliding_attention"
FULL_LAYER = "full_attention"
# Model types whose attention is windowed on every layer when config.json gives a
# sliding_window (Mistral v0.1, Mixtral) unless use_sliding_window says otherwise, as
# transformers' Mistral attention does; others window only through layer_types (gpt-oss,
# Gemma-style) or use_sliding_window (Qwen2: the layers from max_window_layers on).
WINDOW_BY_DEFAULT = frozenset({"mistral", "mixtral"})


def _sliding_window(cfg: dict, model_type: str, config_path: Path) -> dict:
    """ModelConfig's sliding_window and sliding_window_layers from a config.json: the window
    (``sliding_window``) and how many layers use it: those ``layer_types`` names
    sliding_attention (gpt-oss: 12 of 24; without layer_types, gpt-oss's default: every other
    layer from the first), else every layer where the model type windows them by default or
    ``use_sliding_window`` is set (Qwen2's, from layer ``max_window_layers`` on)."""
    window = cfg.get("sliding_window")
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not all(
                t in (SLIDING_LAYER, FULL_LAYER) for t in types):
            raise ValueError(f"{config_path}: 'layer_types' must list {SLIDING_LAYER!r} or "
                             f"{FULL_LAYER!r} for each of the {layers} layers")
        windowed = sum(t == SLIDING_LAYER for t in types)
    elif model_type == "gpt_oss":
        windowed = (layers + 1) // 2  # transformers' GptOssConfig default: even layers
    elif cfg.get("use_sliding_window", model_type in WINDOW_BY_DEFAULT):
        first = cfg.get("max_window_layers", 0) if model_type not in WINDOW_BY_DEFAULT else 0
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"{config_path}: 'max_window_layers' must be an integer >= 0, "
                             f"got {first!r}")
        windowed = max(0, layers - first)
    else:
        windowed = 0
    if window is None or windowed == 0:
        return {}
    return {"sliding_window": window, "sliding_window_layers": windowed}


def from_hf_config(config_path: Path) -> ModelConfig:
    cfg = _read_hf_config(config_path)
    model_type = cfg.get("model_type", "")
    if not isinstance(model_type, str) or model_type not in _SUPPORTED_HF_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r} in {config_path}: "
            f"supported are {', '.join(sorted(_SUPPORTED_HF_TYPES))}"
        )
    _check_hf_fields(cfg, config_path)
    num_heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    eos_ids = _model_eos_ids(cfg, Path(config_path))
    moe = _moe_fields(cfg, model_type, config_path)
    rope_scaling = cfg.get("rope_scaling")
    if moe:
        rope_scaling = None  # position encoding does not change the simulator's cost
    if rope_scaling is not None:
        kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
        if kind not in ("llama3", "default", None):
            raise ValueError(f"unsupported rope_scaling type {kind!r} in {config_path}")
        if kind != "llama3":
            rope_scaling = None
    return ModelConfig(
        name=Path(config_path).parent.name,
        num_layers=cfg["num_hidden_layers"],
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads", num_heads),
        head_dim=cfg.get("head_dim") or hidden // num_heads,
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        max_model_len=cfg.get("max_position_embeddings", NO_CONTEXT_FIELD_LEN),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rope_scaling=rope_scaling,
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        eos_token_ids=eos_ids,
        architecture=_SUPPORTED_HF_TYPES[model_type],
        **moe,
        **_sliding_window(cfg, model_type, config_path),
    )


def with_max_model_len(config: ModelConfig, max_model_len: int) -> ModelConfig:
    return replace(config, max_model_len=max_model_len)
