"""The fused layer kernels through the whole engine against Hugging Face ``generate``.

A tiny random-weight Llama (norms randomized too) is saved with ``save_pretrained`` and loaded
from that folder with ``fused=True``: residual add + RMSNorm, RoPE + KV store and SiLU-and-mul
run as Triton kernels (interpreted on a CPU). The engine (continuous batching, chunked prefill
with an 8-token budget, block size 4) serves ragged requests; every request's greedy tokens
must equal what ``transformers`` generates for it alone. fp32, so rounding cannot excuse a
difference. Kept small: the interpreter is slow.

On a GPU the same check runs compiled (the ``cuda`` variant, which tests/gpu/gpu_check.sh's pytest
step picks up): fp32 there too, the attention kernels' dots in IEEE fp32, cuBLAS without TF32
(torch's default). The CPU variant runs where no GPU is (Triton cannot run on CPU tensors
compiled).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("triton")

from cbbench.engine.core.clock import WallClock  # noqa: E402
from cbbench.engine.core.engine import Engine, EngineConfig  # noqa: E402
from cbbench.engine.core.feed import run_until_done  # noqa: E402
from cbbench.engine.core.request import Request  # noqa: E402
from cbbench.engine.core.scheduler import SchedulerConfig  # noqa: E402
from cbbench.engine.torch.model_runner import ModelRunner  # noqa: E402
from cbbench.engine.torch.models import allocate_kv_cache, load_model  # noqa: E402
from cbbench.kernels import get_backend  # noqa: E402

# The interpreted variant only where no GPU is (conftest turns the interpreter on there);
# the compiled one is marked cuda and skipped without a GPU.
DEVICES = [pytest.param("cuda", marks=pytest.mark.cuda)]
if not torch.cuda.is_available():
    DEVICES.append("cpu")
VOCAB = 256
SIZES = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    initializer_range=0.1,
)
# (prompt length, output length): one prompt spans chunks, decodes share iterations with it.
SHAPE = [(5, 6), (19, 6), (11, 5)]
BLOCK_SIZE = 4
BUDGET = 8


@pytest.fixture(scope="module")
def hf_case(tmp_path_factory):
    config = transformers.LlamaConfig(**SIZES)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF initializes norms to 1: randomize them so they matter
        for name, param in hf.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.1)
    folder = tmp_path_factory.mktemp("hf-llama-fused")
    hf.save_pretrained(folder)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (p,), generator=gen).tolist() for p, _ in SHAPE]
    expected = []
    with torch.no_grad():
        for ids, (_, n) in zip(prompts, SHAPE, strict=True):
            x = torch.tensor([ids])
            y = hf.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
            expected.append(y[0, len(ids) :].tolist())
    return folder, prompts, expected


def _serve(folder, prompts, backend: str, fused: bool, device: str) -> list[list[int]]:
    attn = get_backend(backend, device, block_size=BLOCK_SIZE)
    model, config = load_model(str(folder), torch.float32, device, attn, fused=fused)
    assert model.ops.fused is fused
    num_blocks = 32
    kv = allocate_kv_cache(config, num_blocks, BLOCK_SIZE, torch.float32, device)
    runner = ModelRunner(model, config, kv, BLOCK_SIZE, device, torch.float32)
    sched = SchedulerConfig(max_model_len=config.max_model_len, max_num_batched_tokens=BUDGET)
    engine = Engine(
        EngineConfig(sched, num_kv_blocks=num_blocks, block_size=BLOCK_SIZE), runner, WallClock()
    )
    reqs = [
        Request(i, len(ids), n, prompt_token_ids=ids)
        for i, (ids, (_, n)) in enumerate(zip(prompts, SHAPE, strict=True))
    ]
    mixed = []
    assert run_until_done(engine, reqs, on_step=lambda s: mixed.append(_is_mixed(s)))
    assert any(mixed), "no iteration mixed a prefill chunk with decodes"
    return [r.output_token_ids for r in reqs]


def _is_mixed(step) -> bool:
    r = step.record
    return r.num_prefill_tokens > 0 and r.num_decode_tokens > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_fused_engine_matches_hf(hf_case, backend, device):
    folder, prompts, expected = hf_case
    assert _serve(folder, prompts, backend, fused=True, device=device) == expected
