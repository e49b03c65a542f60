"""Sampling values are normalized at both ends (issue 25, rule 3).

Round 2 made a temperature below SAMPLING_EPS greedy. At the other end a temperature above
float32's range (> 3.4e38) divided every logit to 0: `top_k: 1` then returned random tokens and
`top_p: 0.5` one repeated token (server and CLI). Now a temperature beyond MAX_TEMPERATURE
samples as MAX_TEMPERATURE does, which keeps the logits' order; under `top_k: 1` the token is
the argmax. (1e37 and 1e20, within float32's range, sampled right before the fix too: they
stay in the test as the cap's neighbours.)
"""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import serve_process

from cbbench.engine.core.request import MAX_TEMPERATURE, Request, SamplingParams

torch = pytest.importorskip("torch")

HUGE = [1e39, 1e300, 1e37, 1e20]  # beyond float32 (the defect); within it (fine before too)


def _sample(params: SamplingParams, seed: int, vocab: int = 64) -> tuple[int, int]:
    from cbbench.engine.torch.sampler import Sampler

    torch.manual_seed(seed)
    logits = torch.randn(1, vocab) * 3
    req = Request(0, 3, 4, prompt_token_ids=[1, 2, 3], sampling=params)
    return int(Sampler()(logits, [req])[0]), int(logits.argmax())


@pytest.mark.parametrize("temperature", HUGE)
def test_top_k_1_under_a_huge_temperature_is_the_argmax(temperature):
    for seed in range(20):  # random tokens were the symptom: many rows, every one the argmax
        token, best = _sample(SamplingParams(temperature=temperature, top_k=1, seed=seed), seed)
        assert token == best


@pytest.mark.parametrize("temperature", HUGE)
def test_top_p_under_a_huge_temperature_samples_from_the_top_half(temperature):
    """Uniform over the nucleus (the logits' order kept): top_p 0.5 of 64 tokens keeps the 32
    best; the draws spread over them (one repeated token was the symptom)."""
    seen = set()
    for seed in range(40):
        torch.manual_seed(0)
        logits = torch.randn(1, 64) * 3
        top = set(logits[0].argsort(descending=True)[:32].tolist())
        from cbbench.engine.torch.sampler import Sampler

        req = Request(0, 3, 4, prompt_token_ids=[1, 2, 3],
                      sampling=SamplingParams(temperature=temperature, top_p=0.5, seed=seed))
        token = int(Sampler()(logits, [req])[0])
        assert token in top
        seen.add(token)
    assert len(seen) > 5


def test_sampling_params_cap_the_temperature():
    assert SamplingParams(temperature=1e39).temperature == MAX_TEMPERATURE
    assert SamplingParams(temperature=2.0).temperature == 2.0  # ordinary values untouched


def test_cli_run_with_a_huge_temperature_and_top_k_1_is_greedy(tmp_path):
    from typer.testing import CliRunner

    from cbbench.cli.app import app

    w = tmp_path / "w.jsonl"
    w.write_text("".join(json.dumps({"prompt_token_ids": [3 + i, 9, 27, 81 % 64 + i],
                                     "output_len": 6}) + "\n" for i in range(3)))
    outs = {}
    for name, flags in {"greedy": ["--temperature", "0"],
                        "huge": ["--temperature", "1e39", "--top-k", "1"]}.items():
        out = tmp_path / f"{name}.json"
        res = CliRunner().invoke(app, [
            "run", "--engine", "torch", "--device", "cpu", "--model", "tiny",
            "--num-kv-blocks", "32", "--workload", str(w), "--save-detailed", *flags,
            "--output", str(out)])
        assert res.exit_code == 0, (res.output, res.exception)
        outs[name] = [r["output_token_ids"] for r in json.loads(out.read_text())["requests"]]
    assert outs["huge"] == outs["greedy"]


def test_the_server_gives_the_argmax_under_a_huge_temperature():
    """A request's own temperature, and (beyond the issue's list) the server's default for
    requests that send none, `serve --temperature 1e39 --top-k 1`: the same SamplingParams."""
    with serve_process("--engine", "torch", "--device", "cpu", "--model", "tiny",
                       "--num-kv-blocks", "64", "--max-model-len", "128",
                       "--temperature", "1e39", "--top-k", "1") as run, \
            httpx.Client(base_url=run.url, timeout=30.0) as c:
        def text(**kw) -> str:
            body = {"prompt": [5, 6, 7, 8], "max_tokens": 8, **kw}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        greedy = text(temperature=0, top_k=0)
        for seed in range(3):
            assert text(temperature=1e39, top_k=1, seed=seed) == greedy
            assert text(seed=seed) == greedy  # the server's defaults


def test_top_k_minus_one_is_off_as_in_vllm(tmp_path):
    """`run --top-k -1`: exit 2 ("must be >= 0") where the HTTP API and vLLM's SamplingParams
    take -1 as off, as 0 is ("Set to 0 (or -1) to consider all tokens"). -1 now samples
    exactly as 0 does; -2 is still refused."""
    from typer.testing import CliRunner

    from cbbench.cli.app import app

    w = tmp_path / "w.jsonl"
    w.write_text("".join(json.dumps({"prompt_token_ids": [3 + i, 9, 27], "output_len": 6})
                         + "\n" for i in range(2)))
    outs = {}
    for k in ("0", "-1", "-2"):
        out = tmp_path / f"{k}.json"
        res = CliRunner().invoke(app, [
            "run", "--engine", "torch", "--device", "cpu", "--model", "tiny",
            "--num-kv-blocks", "32", "--workload", str(w), "--save-detailed",
            "--temperature", "1", "--top-k", k, "--output", str(out)])
        if k == "-2":
            assert res.exit_code == 2 and "top-k" in res.output, res.output
            continue
        assert res.exit_code == 0, (res.output, res.exception)
        outs[k] = [r["output_token_ids"] for r in json.loads(out.read_text())["requests"]]
    assert outs["-1"] == outs["0"]
    assert SamplingParams(top_k=-1).top_k == 0
