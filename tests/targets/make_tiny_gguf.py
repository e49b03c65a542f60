"""Make the tiny random-weight Llama GGUF that tests/targets/test_llamacpp_server.py serves with
llama-cpp-python: a seeded Hugging Face LlamaForCausalLM (68M parameters, almost all of them
the Llama-3 vocabulary's embedding and output layers) saved with a given tokenizer, then
converted by llama.cpp's own convert_hf_to_gguf.py.

    python tests/targets/make_tiny_gguf.py --tokenizer-dir DIR --llama-cpp SRC --out-dir OUT

DIR holds tokenizer.json and tokenizer_config.json (with its LICENSE, which is copied along:
the Llama-3 tokenizer's license must travel with it); SRC is llama.cpp's source tree (the
vendor/llama.cpp folder of llama-cpp-python's source distribution). Run it with a Python that
has torch, transformers and sentencepiece (the converter imports it even for a BPE
tokenizer); the converter's `gguf` package comes from SRC/gguf-py (put on PYTHONPATH here).
Writes
OUT/hf/ (the Hugging Face folder) and OUT/tiny-llama-f16.gguf. Never write OUT inside the repo.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
LICENSE_FILES = ("LICENSE", "NOTICE")
SEED = 0
# Small enough to run on 2 CPU cores, large enough that prefill and decode take measurable time.
CONFIG = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-dir", required=True, type=Path)
    ap.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp source tree")
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument(
        "--eos-logit-scale", type=float, default=1.0,
        help="Scale the output layer's end-of-sequence row: > 1 makes the random model stop "
        "early now and then (a server that ignores ignore_eos then returns short outputs).",
    )
    args = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    hf = args.out_dir / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES + LICENSE_FILES:
        if (args.tokenizer_dir / name).exists():
            shutil.copy(args.tokenizer_dir / name, hf / name)
    tok = PreTrainedTokenizerFast.from_pretrained(hf)
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        torch_dtype="float16",
        **CONFIG,
    )
    model = LlamaForCausalLM(config).to(torch.float16)
    if args.eos_logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight[tok.eos_token_id] *= args.eos_logit_scale
    model.save_pretrained(hf)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny Llama: {n_params / 1e6:.1f}M parameters, vocab {config.vocab_size}")

    suffix = "" if args.eos_logit_scale == 1.0 else f"-eos{args.eos_logit_scale:g}"
    out = args.out_dir / f"tiny-llama{suffix}-f16.gguf"
    env = {**os.environ, "PYTHONPATH": str(args.llama_cpp / "gguf-py")}
    subprocess.run(
        [sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(hf),
         "--outtype", "f16", "--outfile", str(out)],
        check=True,
        env=env,
    )
    print(out)


if __name__ == "__main__":
    main()
