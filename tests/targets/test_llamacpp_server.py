"""`cbbench run --endpoint` against a real third-party server: llama-cpp-python's
OpenAI-compatible server (it compiles llama.cpp when installed from PyPI), serving a tiny
random-weight Llama GGUF (tests/targets/make_tiny_gguf.py) on 127.0.0.1, started and stopped here.

Opt-in, because the server takes minutes to build and is not a dependency of cbbench:

    python3 -m venv VENV && VENV/bin/pip install 'llama-cpp-python[server]'
    python tests/targets/make_tiny_gguf.py --tokenizer-dir DIR --llama-cpp SRC --out-dir OUT
    CBBENCH_LLAMACPP_PYTHON=VENV/bin/python CBBENCH_LLAMACPP_MODEL=OUT/tiny-llama-f16.gguf \\
        pytest -m llamacpp tests/targets/test_llamacpp_server.py

(CBBENCH_LLAMACPP_TOKENIZER: the tokenizer.json, by default OUT/hf/tokenizer.json;
CBBENCH_LLAMACPP_FIGURES=FILE also writes the per-request figures as JSON;
CBBENCH_LLAMACPP_EOS_MODEL: a GGUF from make_tiny_gguf.py --eos-logit-scale 2.5, whose
outputs sometimes end early, for the ignore_eos test.)

The server runs as a user should run it for a benchmark (README, server notes):
`--interrupt_requests False` (else a new request cuts the stream in progress) and
`--logits_all False` (else every prompt token's logits are computed: a much slower prefill).
It sends no usage in the stream and has no /metrics, so this is the path where cbbench must
count and warn on its own. Its own per-request timings (llama.cpp's `llama_perf_context_print`
lines on stderr: prompt evaluation, then per-token evaluation) are the oracle for the
client's: requests run one at a time (--max-concurrency 1; the server serializes them
anyway), so the k-th timing block belongs to the k-th request sent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import free_port, invoke_app

from cbbench.schema import read_run, to_dict

PYTHON = os.environ.get("CBBENCH_LLAMACPP_PYTHON")
MODEL = os.environ.get("CBBENCH_LLAMACPP_MODEL")
# A model that reaches its end-of-sequence token now and then (--eos-logit-scale): optional.
EOS_MODEL = os.environ.get("CBBENCH_LLAMACPP_EOS_MODEL")
pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.skipif(
        not (PYTHON and MODEL), reason="set CBBENCH_LLAMACPP_PYTHON and CBBENCH_LLAMACPP_MODEL"
    ),
]
N = 24
OUTPUT_LEN = 32
START_TIMEOUT_S = 180.0
# llama.cpp's own timing lines, one block per request.
PROMPT_RE = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
EVAL_RE = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
TOTAL_RE = re.compile(r"total time =\s*([\d.]+) ms")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from _serve(MODEL, tmp_path_factory)


@pytest.fixture(scope="module")
def eos_server(tmp_path_factory):
    if not EOS_MODEL:
        pytest.skip("set CBBENCH_LLAMACPP_EOS_MODEL (make_tiny_gguf.py --eos-logit-scale 2.5)")
    yield from _serve(EOS_MODEL, tmp_path_factory)


def _serve(model: str, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    cmd = [
        PYTHON, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", "2048", "--interrupt_requests", "False",
        "--logits_all", "False", "--n_threads", "1", "--n_threads_batch", "1",
        "--verbose", "True",
    ]
    # One thread: OpenMP's spinning threads on a shared 2-core machine made a token take 1.9 s.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _server_timings(log: Path) -> list[dict]:
    """Per request, in order: prompt-eval ms and tokens, eval ms and runs."""
    text = log.read_text()
    prompts = PROMPT_RE.findall(text)
    evals = EVAL_RE.findall(text)
    totals = TOTAL_RE.findall(text)
    return [
        {"prompt_ms": float(pm), "prompt_tokens": int(pn), "eval_ms": float(em),
         "eval_runs": int(er), "total_ms": float(tm)}
        for (pm, pn), (em, er), tm in zip(prompts, evals, totals)
    ]


def test_cbbench_against_llama_cpp_python(server, tmp_path, monkeypatch):
    url, log = server
    tokenizer = os.environ.get("CBBENCH_LLAMACPP_TOKENIZER") or str(
        Path(MODEL).parent / "hf" / "tokenizer.json"
    )
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(
        json.dumps({"prompt_len": 32 + 10 * i, "output_len": OUTPUT_LEN}) + "\n" for i in range(N)
    ))
    before = len(_server_timings(log))
    out = tmp_path / "llamacpp.json"
    args = [
        "run", "--endpoint", url, "--workload", str(workload), "--num-requests", str(N),
        "--tokenizer", tokenizer, "--max-concurrency", "1", "--scrape-metrics",
        "--output", str(out), "--save-detailed",
    ]
    monkeypatch.setattr(sys, "argv", ["cbbench", *args])
    res = invoke_app(args)
    assert res.exit_code == 0, res.output
    result = to_dict(read_run(out))
    s = result["summary"]
    assert s["completed"] == N and s["failed"] == 0

    # No /metrics: one warning line, and the run goes on.
    said = [ln for ln in res.stderr.splitlines() if "--scrape-metrics" in ln]
    assert len(said) == 1 and "HTTP 404" in said[0]

    # No usage: every count is the stream's events, shown to be one token each; the server
    # generated (eval runs + 1) tokens per request (the last sampled token is never evaluated).
    counts = s["http"]["token_counts"]
    assert counts["output_method"] == {"events": N}
    assert counts["one_token_per_event"]["detected"] is True
    assert counts["one_token_per_event"]["basis"] == "tokenizer"
    server_t = _server_timings(log)[before:]
    reqs = sorted(result["requests"], key=lambda r: r["intended_start_s"] + r["slot_wait_ms"])
    assert len(server_t) == N
    assert [r["output_tokens"] for r in reqs] == [t["eval_runs"] + 1 for t in server_t]
    assert all(r["finish_reason"] == "length" for r in reqs)
    assert s["short_outputs"]["count"] == sum(r["output_tokens"] < OUTPUT_LEN for r in reqs)

    # Closed loop: TTFT from the intended start includes the slot wait; from the send it does
    # not, and the slot wait is not the client falling behind.
    assert s["latency_basis"] == "intended_start" and not s["http"]["client_fell_behind"]
    assert s["from_send"]["ttft_ms"]["p50"] < s["ttft_ms"]["p50"]

    # Client vs the server's own timings, per request. Neither the client's TTFT from the send
    # nor its E2EL can be shorter than what the server timed inside them: the prompt
    # evaluation, and the whole generation (llama.cpp's total, which also holds
    # llama-cpp-python's per-token sampling and detokenizing in Python); 1 ms: the log's
    # rounding. What is left of E2EL is HTTP, the event stream and the client.
    ttft = np.array([r["ttft_from_send_ms"] for r in reqs])
    prompt_ms = np.array([t["prompt_ms"] for t in server_t])
    assert (ttft >= prompt_ms - 1.0).all()
    e2el = np.array([r["e2el_ms"] - r["slot_wait_ms"] - r["send_lag_ms"] for r in reqs])
    total_ms = np.array([t["total_ms"] for t in server_t])
    assert (e2el >= total_ms - 1.0).all()
    tpot = np.array([r["tpot_ms"] for r in reqs])
    per_token = np.array([t["eval_ms"] / t["eval_runs"] for t in server_t])

    figures_path = os.environ.get("CBBENCH_LLAMACPP_FIGURES")
    if figures_path:
        disagree = counts["disagreement"].get("tokenizer_vs_events", {})
        Path(figures_path).write_text(json.dumps({
            "requests": N,
            "output_len": OUTPUT_LEN,
            "load_average": os.getloadavg(),
            "ttft_from_send_ms_p50": float(np.median(ttft)),
            "server_prompt_eval_ms_p50": float(np.median(prompt_ms)),
            "ttft_minus_prompt_eval_ms": _stats(ttft - prompt_ms),
            "tpot_ms_p50": float(np.median(tpot)),
            "server_ms_per_token_p50": float(np.median(per_token)),
            "tpot_minus_server_per_token_ms": _stats(tpot - per_token),
            "e2el_from_send_ms_p50": float(np.median(e2el)),
            "server_total_ms_p50": float(np.median(total_ms)),
            "e2el_minus_server_total_ms": _stats(e2el - total_ms),
            "prompt_tokens_server_minus_workload": _stats(
                np.array([t["prompt_tokens"] for t in server_t])
                - np.array([r["prompt_tokens"] for r in reqs])
            ),
            "events_equal_server_tokens": N,
            "tokenizer_vs_events": disagree,
            "slot_wait_ms_p50": s["slot_wait_ms"]["p50"],
            "send_lag_ms_p50": s["send_lag_ms"]["p50"],
            "warnings": [ln for ln in res.stderr.splitlines() if "warning" in ln],
        }, indent=1))


def _stats(a: np.ndarray) -> dict:
    return {"p50": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}


def _run(url: str, workload: Path, out: Path, tokenizer: str, monkeypatch, *extra: str):
    args = [
        "run", "--endpoint", url, "--workload", str(workload), "--num-requests", str(N),
        "--tokenizer", tokenizer, "--max-concurrency", "1", "--output", str(out), *extra,
    ]
    monkeypatch.setattr(sys, "argv", ["cbbench", *args])
    return invoke_app(args)


def test_llama_cpp_python_ignores_ignore_eos(eos_server, tmp_path, monkeypatch):
    """The server accepts ignore_eos and drops it: the same requests come back equally short
    with and without the field, each ending with finish_reason 'stop', and cbbench says so."""
    url, _ = eos_server
    tokenizer = str(Path(EOS_MODEL).parent / "hf" / "tokenizer.json")
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(
        json.dumps({"prompt_len": 32 + 10 * i, "output_len": OUTPUT_LEN}) + "\n" for i in range(N)
    ))
    outputs = {}
    for flag in ("--ignore-eos-field", "--no-ignore-eos-field"):
        out = tmp_path / f"{flag}.json"
        res = _run(url, workload, out, tokenizer, monkeypatch, flag)
        assert res.exit_code in (0, 1), res.output  # a request whose first token is EOS fails
        result = to_dict(read_run(out))
        short = result["summary"]["short_outputs"]
        assert short["count"] >= 1 and short["finish_reason_stop"] == short["count"]
        warned = [ln for ln in res.stderr.splitlines() if "max_tokens" in ln]
        if short["share"] > short["warn_share"]:
            assert len(warned) == 1
            said = "may be ignoring ignore_eos" if flag == "--ignore-eos-field" else "was not sent"
            assert said in warned[0]
        outputs[flag] = [(r["id"], r["output_tokens"], r["finish_reason"])
                         for r in result["requests"]]
    assert outputs["--ignore-eos-field"] == outputs["--no-ignore-eos-field"]
