"""``--fused-kernels on`` under Triton's interpreter: refused in bf16, run in fp16.

The interpreter casts float32 to bfloat16 by truncation (1.0078 -> 1.0; PyTorch rounds to
1.0078), so interpreted in bf16 the fused layer kernels round differently from the PyTorch ops
they replace and a greedy run's tokens drift (the tiny preset, 6 requests of 24 tokens with 40
prompt tokens: request 3 from its 10th token). Its float16 casts round to nearest: the same
run's tokens equal the unfused run's. On a GPU (compiled Triton, which rounds) nothing here
applies, so these tests need the interpreter.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from helpers import invoke_app, one_line  # noqa: E402

from cbbench.kernels.triton_common import INTERPRETED  # noqa: E402

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (the CPU)")

# A 16-token context keeps the build's warm-up passes (interpreted fused kernels) short.
SMALL_RUN = (
    "run", "--engine", "torch", "--model", "tiny", "--workload", "random",
    "--input-len", "6", "--output-len", "2", "--num-requests", "1", "--max-model-len", "16",
    "--block-size", "8", "--attention-backend", "torch", "--fused-kernels", "on",
)  # fmt: skip


def test_bf16_fused_kernels_on_are_refused_under_the_interpreter(tmp_path):
    res = invoke_app([*SMALL_RUN, "--dtype", "bf16", "--output", str(tmp_path / "r.json")])
    one_line(res, "--fused-kernels on with --dtype bf16", "truncation", "--dtype fp32", "GPU")
    assert not (tmp_path / "r.json").exists()


def test_fp16_fused_kernels_on_still_run_under_the_interpreter(tmp_path):
    out = tmp_path / "r.json"
    res = invoke_app([*SMALL_RUN, "--dtype", "fp16", "--output", str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    result = json.loads(out.read_text())
    assert result["config"]["fused_kernels"] is True
    assert result["summary"]["completed"] == 1


def test_only_bf16_is_unfaithful_here():
    from cbbench.kernels import fused_layer_ops_unfaithful_reason

    assert fused_layer_ops_unfaithful_reason(torch.bfloat16) is not None
    assert fused_layer_ops_unfaithful_reason(torch.float16) is None
    assert fused_layer_ops_unfaithful_reason(torch.float32) is None
