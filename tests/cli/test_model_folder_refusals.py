"""What a Hugging Face folder's config.json says the torch engine cannot honour is refused at
start-up, one line and exit 2, not approximated (seventh review).

- ``hidden_act``: the engine's MLP is SiLU-gated (llama.py). A folder with ``"gelu"`` loaded and
  generated other tokens than transformers does ([140, 136, 212, ...] against [54, 54, 54,
  ...]); vLLM's Llama MLP refuses anything but silu.
- ``--max-model-len`` above the folder's context (its max_position_embeddings): it was cut to
  the folder's without a word, so requests between the two failed one by one as beyond "the
  model's context of 256"; vLLM refuses to start ("User-specified max_model_len ... is greater
  than the derived max_model_len"). ``run`` and ``serve`` alike; a shorter one is taken.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
from helpers import invoke_app, one_line, tiny_hf_model  # noqa: E402

CONTEXT = 256  # helpers.TINY_SIZES' max_position_embeddings
SERVE_TIMEOUT_S = 120  # were the check missing, serve would listen until this kills it


def _folder(path, **overrides):
    tiny_hf_model("llama", **overrides).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def silu_folder(tmp_path_factory):
    return _folder(tmp_path_factory.mktemp("silu"), hidden_act="silu")


def _run(folder: str, out, *extra: str):
    return invoke_app(["run", "--engine", "torch", "--device", "cpu", "--model", folder,
                       "--workload", "random", "--input-len", "8", "--output-len", "2",
                       "--num-requests", "2", "--num-kv-blocks", "64", "--output", str(out),
                       "--quiet", *extra])


@pytest.mark.parametrize("act", ["gelu", "relu", "gelu_pytorch_tanh"])
def test_an_mlp_activation_other_than_silu_is_refused(tmp_path, act):
    folder = _folder(tmp_path / "m", hidden_act=act)
    res = _run(folder, tmp_path / "x.json")
    one_line(res, f"unsupported hidden_act {act!r}", "config.json")
    assert not (tmp_path / "x.json").exists()


def test_a_silu_folder_still_runs(silu_folder, tmp_path):
    res = _run(silu_folder, tmp_path / "x.json")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "x.json").read_text())["summary"]["completed"] == 2


def test_run_refuses_a_context_beyond_the_folders(silu_folder, tmp_path):
    res = _run(silu_folder, tmp_path / "x.json", "--max-model-len", str(CONTEXT + 1))
    one_line(res, f"--max-model-len {CONTEXT + 1} is greater than the model's context of "
                  f"{CONTEXT}", "max_position_embeddings")
    assert not (tmp_path / "x.json").exists()


def test_run_takes_a_context_up_to_the_folders(silu_folder, tmp_path):
    res = _run(silu_folder, tmp_path / "x.json", "--max-model-len", str(CONTEXT))
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "x.json").read_text())
    assert result["config"]["max_model_len"] == CONTEXT


def test_serve_refuses_a_context_beyond_the_folders(silu_folder):
    """A real process: were the check missing, it would listen (until the timeout)."""
    argv = ["serve", "--engine", "torch", "--device", "cpu", "--model", silu_folder,
            "--port", "0", "--num-kv-blocks", "64", "--max-model-len", "1000"]
    proc = subprocess.run([sys.executable, "-c", "from cbbench.cli.app import main; main()",
                           *argv], capture_output=True, text=True, timeout=SERVE_TIMEOUT_S,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cbbench: error: "), proc.stderr
    assert f"--max-model-len 1000 is greater than the model's context of {CONTEXT}" in lines[0]
