"""Models for the torch executor: the Llama family and its loader."""

from .llama import KVCache, LlamaForCausalLM, allocate_kv_cache
from .loader import init_random_weights, load_model, resolve_dtype

__all__ = [
    "KVCache",
    "LlamaForCausalLM",
    "allocate_kv_cache",
    "init_random_weights",
    "load_model",
    "resolve_dtype",
]
