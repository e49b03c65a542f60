"""The torch engine end to end against Hugging Face ``generate`` (CPU, fp32, greedy).

A tiny random-weight Llama and Qwen2 (norms and biases randomized too) are saved with
``save_pretrained``; cbbench loads them FROM THAT FOLDER through the real CLI
(``cbbench run --workload FILE.jsonl --engine torch --model FOLDER ...``) and replays a workload
of ragged prompts arriving at different times. Every request's output token ids must equal,
token for token, what ``transformers`` generates for that request alone. The variants exercise
the engine paths where batching could leak between requests:

- chunked prefill with a 16-token budget: long prompts split, chunks share iterations with decodes;
- a KV pool so small that requests are preempted (recompute) and resume;
- the static scheduler, with small batches;
- the ``torch`` attention backend, and the ``triton`` one (under TRITON_INTERPRET on a CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from helpers import TINY_VOCAB, hf_greedy, tiny_hf_model  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from cbbench.cli.app import app  # noqa: E402

VOCAB = TINY_VOCAB
# (prompt length, output length, arrival_s): ragged prompts (3..40 tokens, several longer than
# the 16-token budget and not multiples of the block sizes), staggered wall-clock arrivals.
WORKLOAD = [
    (3, 12, 0.0),
    (40, 8, 0.0),
    (17, 20, 0.0),
    (9, 6, 0.01),
    (33, 15, 0.02),
    (5, 18, 0.02),
    (26, 10, 0.03),
    (12, 7, 0.05),
]
# Three short requests for the Triton interpreter, which is slow.
SHORT = [(5, 6, 0.0), (19, 7, 0.0), (11, 6, 0.01)]

BASE = ["--engine", "torch", "--device", "cpu", "--dtype", "fp32", "--save-detailed"]
# An explicit pool that holds every request at once (the CPU default, 2 GiB of zero-filled KV,
# costs seconds per run to allocate on a busy machine).
ROOMY = ["--num-kv-blocks", "128"]
CHUNKED = ["--max-num-batched-tokens", "16"]
# Block size 4 and 16 blocks (64 token slots): the largest request (33 + 15 - 1 tokens) needs
# 12 blocks, so it fits alone, but the eight together need ~70 blocks -> preemption.
PREEMPT = ["--block-size", "4", "--num-kv-blocks", "16"]
STATIC = ["--scheduler", "static", "--max-num-seqs", "3"]


def _prompts(shape: list[tuple[int, int, float]], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (p,), generator=g).tolist() for p, _, _ in shape]


def _write_workload(path: Path, shape, prompts) -> Path:
    lines = [
        json.dumps({"prompt_token_ids": ids, "output_len": out, "arrival_s": t})
        for ids, (_, out, t) in zip(prompts, shape, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


class Case:
    """One saved HF model, its workload files and the HF reference outputs."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        hf = tiny_hf_model(kind)
        self.folder = root / f"hf-{kind}"
        hf.save_pretrained(self.folder)
        self.prompts = _prompts(WORKLOAD, seed=1)
        self.workload = _write_workload(root / "workload.jsonl", WORKLOAD, self.prompts)
        self.expected = hf_greedy(hf, self.prompts, [n for _, n, _ in WORKLOAD])
        short_prompts = _prompts(SHORT, seed=2)
        self.short_workload = _write_workload(root / "short.jsonl", SHORT, short_prompts)
        self.short_expected = hf_greedy(hf, short_prompts, [n for _, n, _ in SHORT])

    def run(self, out: Path, *flags: str, backend: str = "reference", short: bool = False) -> dict:
        workload = self.short_workload if short else self.workload
        args = [
            "run", "--workload", str(workload), "--model", str(self.folder),
            "--attention-backend", backend, *BASE, *flags, "--output", str(out),
        ]  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        assert out.is_file()
        return json.loads(out.read_text())

    def check(self, result: dict, short: bool = False) -> None:
        expected = self.short_expected if short else self.expected
        reqs = {r["id"]: r for r in result["requests"]}
        assert sorted(reqs) == list(range(len(expected)))
        assert result["summary"]["completed"] == len(expected)
        for i, want in enumerate(expected):
            r = reqs[i]
            assert r["error"] is None, r
            got = r["output_token_ids"]
            assert got == want, (
                f"{self.kind} request {i}: first difference at token "
                f"{next(j for j, (a, b) in enumerate(zip(got, want)) if a != b) if len(got) == len(want) else 'len'}"
                f"\n cbbench: {got}\n     HF: {want}"
            )


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def case(request, tmp_path_factory) -> Case:
    return Case(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Case:
    return Case("llama", tmp_path_factory.mktemp("llama-only"))


# ---- (a) continuous batching, chunked prefill, 16-token budget --------------------------------
def test_chunked_prefill_matches_hf(case, tmp_path):
    result = case.run(tmp_path / "chunked.json", *CHUNKED, *ROOMY)
    case.check(result)
    its = result["iterations"]
    assert all(it["num_prefill_tokens"] + it["num_decode_tokens"] <= 16 for it in its)
    # Prefill chunks shared iterations with decodes (the stall-free schedule) ...
    assert any(it["num_prefill_tokens"] > 0 and it["num_decode_tokens"] > 0 for it in its)
    # ... and the 40-token prompt cannot have been prefilled in one 16-token iteration.
    assert max(p for p, _, _ in WORKLOAD) > 16
    assert result["config"]["max_num_batched_tokens"] == 16


# ---- (b) a KV pool small enough to force preemption (recompute) -------------------------------
def test_preemption_matches_hf(case, tmp_path):
    result = case.run(tmp_path / "preempt.json", *PREEMPT)
    case.check(result)
    its = result["iterations"]
    assert sum(it["num_preempted"] for it in its) > 0, "the small pool never preempted"
    assert any(r["num_preemptions"] > 0 for r in result["requests"])
    assert all(it["kv_blocks_total"] == 16 for it in its)
    assert max(it["kv_blocks_used"] for it in its) <= 16


def test_preemption_with_chunked_prefill_matches_hf(llama, tmp_path):
    result = llama.run(tmp_path / "preempt-chunked.json", *PREEMPT, *CHUNKED)
    llama.check(result)
    assert sum(it["num_preempted"] for it in result["iterations"]) > 0


@pytest.mark.parametrize(
    "flags",
    [
        # Whole prompts only (a recompute must fit one iteration: 64 >= 40 + 20 - 1) + preemption.
        ["--no-chunked-prefill", "--max-num-batched-tokens", "64", *PREEMPT],
        # Prompt + max output reserved at admission, as before paging: queueing, no preemption.
        ["--kv-allocation", "reserved", "--block-size", "4", "--num-kv-blocks", "24", *CHUNKED],
    ],
    ids=["unchunked-preempt", "reserved"],
)
def test_other_engine_modes_match_hf(llama, tmp_path, flags):
    result = llama.run(tmp_path / "mode.json", *flags)
    llama.check(result)
    preempted = sum(it["num_preempted"] for it in result["iterations"])
    assert (preempted > 0) == ("--no-chunked-prefill" in flags)


# ---- (c) the static scheduler ----------------------------------------------------------------
def test_static_matches_hf(case, tmp_path):
    result = case.run(tmp_path / "static.json", *STATIC, *ROOMY)
    case.check(result)
    its = result["iterations"]
    assert all(it["num_running"] <= 3 for it in its)
    # Static batches never mix a new prompt into a running batch: no iteration has both.
    assert not any(it["num_prefill_tokens"] > 0 and it["num_decode_tokens"] > 0 for it in its)


# ---- (d) the torch attention backend, (e) triton under the interpreter ------------------------
def test_torch_backend_matches_hf(llama, tmp_path):
    result = llama.run(tmp_path / "torch.json", *CHUNKED, *PREEMPT, backend="torch")
    llama.check(result)
    assert result["config"]["attention_backend"] == "torch"


def test_triton_backend_matches_hf(llama, tmp_path):
    pytest.importorskip("triton")
    # Budget 8 splits the 19-token prompt into chunks; block size 4 makes the kernel walk blocks.
    # A 64-token context holds the longest request (19 + 7) and bounds the runner's warm-up
    # passes (a prefill of up to 256 tokens and a decode over max_model_len keys, interpreted
    # here): at the model's 256 they took about half of this test's time.
    result = llama.run(
        tmp_path / "triton.json", "--max-num-batched-tokens", "8", "--block-size", "4",
        "--num-kv-blocks", "32", "--max-model-len", "64",
        backend="triton", short=True,
    )  # fmt: skip
    llama.check(result, short=True)
    assert result["config"]["attention_backend"] == "triton"
    assert any(
        it["num_prefill_tokens"] > 0 and it["num_decode_tokens"] > 0 for it in result["iterations"]
    )


# ---- (f) the stop at the model's end-of-sequence ids ------------------------------------------
# HF's generate stops on ANY id of the model's eos_token_id list, and takes that list from
# generation_config.json where the folder has one (Llama-3-Instruct: end-of-turn is only there).
EOS_PROMPT = [5, 17, 42, 99, 3, 250, 7, 11]
EOS_MAX_TOKENS = 12
NO_FILE = object()  # no generation_config.json in the folder


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory):
    """(a saved tiny Llama, HIT: an id its greedy output for EOS_PROMPT reaches at a later step,
    NEVER: an id that output never holds)."""
    hf = tiny_hf_model("llama")
    folder = tmp_path_factory.mktemp("eos") / "base"
    hf.save_pretrained(folder)
    out = hf_greedy(hf, [EOS_PROMPT], [EOS_MAX_TOKENS])[0]
    hit = next(t for j, t in enumerate(out) if j >= 1 and t not in out[:j])
    never = max(set(range(VOCAB)) - set(out))
    return folder, hit, never


def _with_eos(base: Path, folder: Path, config_eos, generation_eos) -> Path:
    import shutil

    shutil.copytree(base, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "eos_token_id": config_eos}))
    gen = folder / "generation_config.json"
    if generation_eos is NO_FILE:
        gen.unlink(missing_ok=True)
    else:
        body = json.loads(gen.read_text()) if gen.is_file() else {}
        gen.write_text(json.dumps({**body, "eos_token_id": generation_eos}))
    return folder


def _hf_generate(folder: Path) -> list[int]:
    """What transformers generates from the folder as saved (its own reading of both files)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = torch.tensor([EOS_PROMPT])
    with torch.no_grad():
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=EOS_MAX_TOKENS,
                           do_sample=False, pad_token_id=0)  # fmt: skip
    return y[0, len(EOS_PROMPT) :].tolist()


def _served_finish(folder: Path) -> tuple[str, int]:
    """(finish_reason, completion tokens) of the prompt through `cbbench serve`'s engine."""
    import httpx
    from helpers import start_server

    from cbbench.cli.serve import build_serving_engine
    from cbbench.engine.args import EngineArgs

    args = EngineArgs(engine="torch", model=str(folder), device="cpu", dtype="fp32",
                      num_kv_blocks=16)  # fmt: skip
    run = start_server(lambda: build_serving_engine(args))
    try:
        body = {"prompt": EOS_PROMPT, "max_tokens": EOS_MAX_TOKENS, "ignore_eos": False,
                "temperature": 0}  # fmt: skip
        r = httpx.post(run.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["finish_reason"], r.json()["usage"]["completion_tokens"]
    finally:
        run.stop()


# Case -> ((hit, never) -> (config.json's eos_token_id, generation_config.json's), stops at hit).
EOS_CASES = {
    "list-in-config": (lambda hit, never: ([never, hit], NO_FILE), True),
    "list-in-generation-config": (lambda hit, never: (never, [never, hit]), True),
    # generation_config.json's list replaces config.json's, which would have stopped.
    "generation-config-replaces": (lambda hit, never: ([hit], [never]), False),
}


@pytest.mark.parametrize("eos_case", EOS_CASES)
def test_stops_at_any_eos_id_as_hf_generate_does(eos_model, tmp_path, eos_case):
    base, hit, never = eos_model
    files, stops = EOS_CASES[eos_case]
    config_eos, generation_eos = files(hit, never)
    folder = _with_eos(base, tmp_path / "m", config_eos, generation_eos)
    want = _hf_generate(folder)
    # HF itself stops at HIT (short of the limit), or runs to the limit.
    assert (want[-1] == hit and len(want) < EOS_MAX_TOKENS) if stops else len(want) == EOS_MAX_TOKENS
    (tmp_path / "w.jsonl").write_text(
        json.dumps({"prompt_token_ids": EOS_PROMPT, "output_len": EOS_MAX_TOKENS}) + "\n")
    args = ["run", "--workload", str(tmp_path / "w.jsonl"), "--model", str(folder), *BASE,
            "--no-ignore-eos", "--num-kv-blocks", "16", "--output", str(tmp_path / "r.json")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "r.json").read_text())
    (req,) = result["requests"]
    assert req["output_token_ids"] == want and req["output_tokens"] == len(want)
    # The record: eos_token_id the first stop id (the one field older results have), and
    # eos_token_ids all of them where there are several; read back whole.
    stop_ids = config_eos if generation_eos is NO_FILE else generation_eos
    stop_ids = stop_ids if isinstance(stop_ids, list) else [stop_ids]
    for record in (result["config"], result["config"]["model_config"]):
        assert record["eos_token_id"] == stop_ids[0]
        assert record.get("eos_token_ids") == (stop_ids if len(stop_ids) > 1 else None)
    from cbbench.engine.model_config import ModelConfig

    model = ModelConfig.from_dict(result["config"]["model_config"])
    assert model.eos_token_ids == tuple(stop_ids)
    assert _served_finish(folder) == ("stop" if stops else "length", len(want))


# ---- (g) a request's own stop_token_ids, and min_tokens, on the torch server ------------------
def test_stop_token_ids_stop_as_hf_generate_does(eos_model, tmp_path):
    """vLLM's stop_token_ids through `cbbench serve --engine torch` (which ignores the model's
    EOS by default): the output is what `generate` gives with that id among its stop ids, the
    request ends there (finish_reason stop; the id counted in completion_tokens), and the
    stop token's text is not written, as vLLM's detokenizer leaves it out; streamed and not.
    min_tokens is a 400 there (its sampler cannot keep a token from being sampled)."""
    import httpx
    from helpers import start_server

    from cbbench.cli.serve import build_serving_engine
    from cbbench.engine.args import EngineArgs

    base, hit, never = eos_model
    folder = _with_eos(base, tmp_path / "m", never, NO_FILE)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = torch.tensor([EOS_PROMPT])
    with torch.no_grad():
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=EOS_MAX_TOKENS,
                           do_sample=False, pad_token_id=0, eos_token_id=[never, hit])
    want = y[0, len(EOS_PROMPT):].tolist()
    assert want[-1] == hit and len(want) < EOS_MAX_TOKENS
    text = "".join(f" {t}" for t in want[:-1])  # the server's text without a tokenizer
    args = EngineArgs(engine="torch", model=str(folder), device="cpu", dtype="fp32",
                      num_kv_blocks=16)  # fmt: skip
    run = start_server(lambda: build_serving_engine(args))
    body = {"prompt": EOS_PROMPT, "max_tokens": EOS_MAX_TOKENS, "temperature": 0,
            "stop_token_ids": [hit]}
    try:
        with httpx.Client(base_url=run.url, timeout=60) as c:
            r = c.post("/v1/completions", json=body).json()
            chunks = []
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
                chunks = [json.loads(x[5:]) for x in s.iter_lines() if x.startswith("data: {")]
            bad = c.post("/v1/completions", json={**body, "min_tokens": 2})
            defaults = c.post("/v1/completions", json={
                **body, "stop_token_ids": [], "min_tokens": 0, "max_tokens": 3})
    finally:
        run.stop()
    (choice,) = r["choices"]
    assert choice["finish_reason"] == "stop" and choice["text"] == text
    assert r["usage"]["completion_tokens"] == len(want)
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "min_tokens"
    assert defaults.status_code == 200 and defaults.json()["usage"]["completion_tokens"] == 3
