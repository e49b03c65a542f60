"""`cbbench run --api embeddings | rerank` and image workloads against `cbbench serve --engine
sim` (issue 26): the client's per-request counts are the server's request log, line by line;
image tokens are the hand-computed Qwen2-VL formula; bad input is one line and exit 2."""

from __future__ import annotations

import json
import statistics

import pytest
from helpers import invoke_app, serve_process

ENGINE = ("--engine", "sim", "--model", "llama-3.2-1b", "--gpu", "h200")
RATE = "20"
# 1024 x 1024 -> 980 x 980 after Qwen2-VL's smart resize: 35 * 35 tokens (server/images.py).
TOKENS_1024 = 35 * 35
TOKENS_256 = 9 * 9  # 252 x 252


def _cli(*argv: str):
    res = invoke_app(list(argv), env={"COLUMNS": "200"})
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res


def _run(tmp_path, name: str, url: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    res = _cli("run", "--endpoint", url, "--request-rate", RATE, "--arrival", "constant",
               "--output", str(out), *args)
    assert res.exit_code == 0, res.stdout + res.stderr
    return json.loads(out.read_text())


def _log(path) -> dict[str, dict]:
    return {x["id"]: x for x in map(json.loads, path.read_text().splitlines())}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "log.jsonl"
    with serve_process(*ENGINE, "--request-log", str(log)) as srv:
        srv.log = log
        yield srv


@pytest.mark.parametrize("api,batch", [("embeddings", "3"), ("rerank", "4")])
def test_pooling_counts_are_the_servers(tmp_path, server, api, batch):
    result = _run(tmp_path, api, server.url, "--api", api, "--workload", "random",
                  "--input-len", "48", "--num-requests", "20", "--batch-size", batch)
    s = result["summary"]
    assert s["completed"] == 20 and s["failed"] == 0
    log = _log(server.log)
    total = 0
    for r in result["requests"]:
        line = log[r["server_request_id"]]
        assert line["api"] == api and line["status"] == 200
        assert r["server_prompt_tokens"] == line["prompt_tokens"]
        assert r["inputs"] == line["inputs"] == int(batch)
        assert r["output_tokens"] == 0 and r["e2el_ms"] > 0
        total += line["prompt_tokens"]
    assert s["usage"] == {"prompt_tokens": total, "requests_with_usage": 20, "requests": 20}
    assert s["input_throughput"] == pytest.approx(total / s["duration_s"])
    # One basis in the table: the totals are the server's usage too (were the workload's).
    assert s["total_input_tokens"] == total
    assert s["total_token_throughput"] == s["input_throughput"]
    assert s["inputs"] == 20 * int(batch)
    assert result["config"]["batch_size"] == int(batch)


def test_pooling_input_tokens_have_one_basis():
    """`run --api embeddings` printed total token throughput 4,384.0 tok/s (the workload's
    prompt tokens) and input throughput 4,315.5 (the server's usage) in one table with no
    output. Where every completed request carried usage, both are the server's; where one
    did not, both are the workload's (no mix)."""
    from cbbench.analysis.records import RequestRecord
    from cbbench.analysis.summary.inputs import add_input_figures
    from cbbench.analysis.summary.metrics import summarize

    def recs(usage: list[int | None]) -> list[RequestRecord]:
        return [RequestRecord(i, 64, 0, 0.1 * i, send_s=0.1 * i, token_times_s=[0.1 * i + 0.05],
                              server_prompt_tokens=u, inputs=4) for i, u in enumerate(usage)]

    for usage, total in (([63, 62, 63, 61], 249), ([63, None, 63, 61], 256)):
        records = recs(usage)
        s = summarize(records, 2.0)
        add_input_figures(s, records, 2.0, pooling=True)
        assert s["total_input_tokens"] == total, usage
        assert s["input_throughput"] == s["total_token_throughput"] == total / 2.0
        assert s["usage"]["prompt_tokens"] == sum(u or 0 for u in usage)


def test_image_workload_tokens_are_the_formula(tmp_path, server):
    result = _run(tmp_path, "mm", server.url, "--api", "chat", "--workload", "random-mm",
                  "--images-per-request", "2", "--image-size", "1024x1024", "--input-len", "32",
                  "--output-len", "4", "--num-requests", "6")
    s = result["summary"]
    assert s["completed"] == 6 and s["failed"] == 0
    log = _log(server.log)
    for r in result["requests"]:
        line = log[r["server_request_id"]]
        assert r["images"] == line["images"] == 2
        assert r["image_tokens"] == line["image_tokens"] == 2 * TOKENS_1024
        assert r["image_bytes"] == line["image_bytes"]
        assert r["server_prompt_tokens"] == line["prompt_tokens"]
        assert r["request_bytes"] > 4 / 3 * r["image_bytes"]  # base64 in the body
    im = s["images"]
    assert im["images"] == 12 and im["image_tokens"] == 6 * 2 * TOKENS_1024
    assert im["text_tokens"] == sum(r["server_prompt_tokens"] for r in result["requests"]) \
        - im["image_tokens"]
    assert result["config"]["images"]["image_size"] == ["1024x1024"]


def test_ttft_grows_with_image_size_on_the_simulated_h200(tmp_path, server):
    result = _run(tmp_path, "sizes", server.url, "--api", "chat", "--workload", "random-mm",
                  "--image-size", "256x256,1024x1024", "--input-len", "32", "--output-len", "2",
                  "--num-requests", "16", "--request-rate", "4")
    by_tokens: dict[int, list[float]] = {}
    log = _log(server.log)
    for r in result["requests"]:
        assert r["image_tokens"] in (TOKENS_256, TOKENS_1024)
        line = log[r["server_request_id"]]
        by_tokens.setdefault(r["image_tokens"], []).append(
            (r["ttft_ms"], line["first_token"] - line["submitted"]))
    assert set(by_tokens) == {TOKENS_256, TOKENS_1024}  # seed 0 draws both sizes
    small, big = by_tokens[TOKENS_256], by_tokens[TOKENS_1024]
    # The server's own TTFT (its engine: prefill tokens + the ViT's FLOPs) and the client's.
    assert max(t for _, t in small) < min(t for _, t in big)
    assert statistics.median(c for c, _ in small) < statistics.median(c for c, _ in big)


# ---- bad input: one line, exit 2 (no server needed: refused before any request) ----------------
DEAD = "http://127.0.0.1:9"


def _one_line_exit_2(*argv: str) -> str:
    res = _cli("run", "--endpoint", DEAD, *argv)
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(err) == 1, res.stdout + res.stderr
    assert err[0].startswith("cbbench: error: ")
    return err[0]


def test_missing_image_path_is_one_line(tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text(json.dumps({"prompt": "hi", "output_len": 4, "images": ["nope.png"]}) + "\n")
    assert "image file not found" in _one_line_exit_2("--api", "chat", "--workload", str(w))


def test_non_image_file_is_one_line(tmp_path):
    (tmp_path / "notes.png").write_text("not an image")
    w = tmp_path / "w.jsonl"
    w.write_text(json.dumps({"prompt": "hi", "output_len": 4, "images": ["notes.png"]}) + "\n")
    assert "not an image file" in _one_line_exit_2("--api", "chat", "--workload", str(w))


def test_embeddings_with_output_len_is_one_line(tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text(json.dumps({"prompt": "hi", "output_len": 4}) + "\n")
    assert "'output_len' does not fit" in _one_line_exit_2("--api", "embeddings", "--workload",
                                                           str(w))
    assert "--output-len does not fit" in _one_line_exit_2(
        "--api", "embeddings", "--workload", "random", "--output-len", "5")


@pytest.mark.parametrize("argv,needle", [
    (("--api", "chat", "--batch-size", "2"), "--batch-size applies to --api embeddings"),
    (("--api", "completions", "--workload", "random-mm"), "use --api chat"),
    (("--api", "chat", "--workload", "random-mm", "--image-size", "big"), "--image-size"),
    (("--api", "chat", "--images-per-request", "2"), "apply only to --workload random-mm"),
    (("--api", "embeddings", "--batch-size", "0"), "--batch-size must be in"),
])
def test_api_the_workload_does_not_fit_is_one_line(argv, needle):
    assert needle in _one_line_exit_2(*argv)


def test_a_jsonl_embeddings_workload_runs(tmp_path, server):
    """A file workload: inputs and their lengths, no output_len."""
    w = tmp_path / "w.jsonl"
    w.write_text("".join(json.dumps({"prompt": f"text number {i} of the file"}) + "\n"
                         for i in range(4)))
    result = _run(tmp_path, "file", server.url, "--api", "embeddings", "--workload", str(w))
    log = _log(server.log)
    assert result["summary"]["completed"] == 4
    for r in result["requests"]:
        assert r["server_prompt_tokens"] == log[r["server_request_id"]]["prompt_tokens"] == 6
