"""`cbbench serve`: /v1/embeddings (the openai SDK's call), /v1/rerank, and image_url parts in
chat messages charged as Qwen2-VL's vision tokens plus a ViT encoder cost (issue 26).

The server runs in-process (tests/helpers.py) with the sim engine; the truths are the request
log, the hand-computed token formula and the encoder's FLOPs over the simulated GPU's rate.
"""

from __future__ import annotations

import base64
import io
import json
import math

import httpx
import numpy as np
import pytest
from helpers import sim_options, start_server

from cbbench.cli.serve import build_serving_engine
from cbbench.server.app import ServeConfig
from cbbench.server.images import encoder_flops, image_tokens, smart_resize

MAX_IMAGE_BYTES = 200_000


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _chat(*images: str, text: str = "describe these") -> dict:
    parts = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in images]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    log = tmp_path_factory.mktemp("pool") / "log.jsonl"
    cfg = ServeConfig(request_log=str(log), max_image_bytes=MAX_IMAGE_BYTES)
    run = start_server(lambda: build_serving_engine(sim_options()), cfg)
    run.log = log
    yield run
    run.stop()


@pytest.fixture()
def client(srv):
    with httpx.Client(base_url=srv.url, timeout=60.0) as c:
        yield c


def _wait_line(srv, rid: str) -> dict:
    """The request's log line, once the log's writer thread has written it (bounded wait)."""
    import time

    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for line in srv.log.read_text().splitlines():
            got = json.loads(line)
            if got["id"] == rid:
                return got
        time.sleep(0.01)
    raise AssertionError(f"no request-log line for {rid}")


# ---- the formula, by hand ------------------------------------------------------------------
@pytest.mark.parametrize("w,h,tokens", [
    # 1024 -> round(1024/28)*28 = 1036; 1036^2 > 28*28*1280, so beta = sqrt(1024^2/1003520)
    # and floor(1024/beta/28)*28 = 980: 35 * 35.
    (1024, 1024, 35 * 35),
    (256, 256, 9 * 9),  # round(256/28) = 9 (252), within the pixel range
    (1000, 500, 36 * 18),  # 1008 x 504 = 508,032 pixels: kept
    (20, 20, 2 * 2),  # 28 x 28 < 56*56 min: beta = sqrt(3136/400) = 2.8 -> 56 x 56
])
def test_qwen2_vl_tokens_by_hand(w, h, tokens):
    assert image_tokens(w, h) == tokens


def test_encoder_flops_by_hand():
    # 980 x 980 after resize: (980/14)^2 = 4900 patches.
    patches = 4900
    assert smart_resize(1024, 1024) == (980, 980)
    assert encoder_flops(1024, 1024) == 2 * 675e6 * patches + 4 * 32 * 1280 * patches**2


def test_sim_step_adds_encoder_time():
    """The step that runs an image request's first prefill chunk takes the encoder's FLOPs at
    the simulated GPU's FLOP rate longer than the same step without them."""
    from cbbench.engine.build import build_engine
    from cbbench.engine.core.request import Request

    times = []
    for flops in (0.0, encoder_flops(1024, 1024)):
        engine, _ = build_engine(sim_options(iteration_overhead_us=None))
        engine.add_request(Request(0, 1300, 2, encoder_flops=flops))
        times.append(engine.step().record.duration_s)
        rate = engine.executor.cost_model.rates.flop_rate
        times.append(engine.step().record.duration_s)  # the decode: no encoder again
    assert math.isclose(times[1], times[3], rel_tol=1e-9)
    assert math.isclose(times[2] - times[0], encoder_flops(1024, 1024) / rate, rel_tol=1e-6)


# ---- /v1/embeddings and /v1/rerank ---------------------------------------------------------
def test_openai_sdk_embeddings_match_the_log(srv, client):
    import openai

    sdk = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
    # The SDK asks for base64 by default and decodes it.
    got = sdk.embeddings.create(model="llama-3.2-1b", input=["one two three", "four five"])
    assert [d.index for d in got.data] == [0, 1]
    dim = len(got.data[0].embedding)
    assert dim == 2048  # Llama-3.2-1B's hidden size
    assert all(abs(np.linalg.norm(d.embedding) - 1.0) < 1e-5 for d in got.data)
    # The float form is the same vector (float32 both ways).
    plain = client.post("/v1/embeddings", json={"input": "one two three"}).json()
    assert np.allclose(plain["data"][0]["embedding"], got.data[0].embedding, atol=0)
    line = _wait_line(srv, got.id)
    assert line["api"] == "embeddings" and line["inputs"] == 2 and line["status"] == 200
    assert got.usage.prompt_tokens == line["prompt_tokens"] == got.usage.total_tokens
    # The word-per-token fallback codec (no --tokenizer): 3 and 2 words.
    assert line["prompt_tokens"] == 5
    assert line["first_token"] <= line["last_token"] <= line["last_token_sent"]


def test_rerank_shape_and_usage(srv, client):
    r = client.post("/v1/rerank", json={
        "query": "a b", "documents": ["c d e", {"text": "f"}, "g h"], "top_n": 2,
    })
    assert r.status_code == 200, r.text
    body = r.json()
    scores = [x["relevance_score"] for x in body["results"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)
    assert all(0 < s < 1 for s in scores)
    assert {x["document"]["text"] for x in body["results"]} <= {"c d e", "f", "g h"}
    line = _wait_line(srv, body["id"])
    # Each pair: the query's 2 words then the document's (word-per-token fallback codec).
    assert line["prompt_tokens"] == body["usage"]["prompt_tokens"] == (2 + 3) + (2 + 1) + (2 + 2)
    assert line["inputs"] == 3


@pytest.mark.parametrize("body,status", [
    ({"input": []}, 400),
    ({"input": "x", "dimensions": 8}, 400),
    ({"input": [[999_999_999]]}, 400),
    ({"input": "x", "model": "nope"}, 404),
])
def test_embeddings_bad_requests(client, body, status):
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


# ---- images --------------------------------------------------------------------------------
def test_image_tokens_in_usage_and_log(srv, client):
    img = _url(_png(256, 256))
    r = client.post("/v1/chat/completions", json=_chat(img, img))
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens_details"]["image_tokens"] == 2 * 81
    line = _wait_line(srv, r.json()["id"])
    assert line["images"] == 2 and line["image_tokens"] == 2 * 81
    assert line["image_bytes"] == 2 * len(_png(256, 256))
    assert usage["prompt_tokens"] == line["prompt_tokens"]
    # The text's tokens are the rest: the same request without images.
    plain = client.post("/v1/chat/completions", json=_chat()).json()["usage"]
    assert usage["prompt_tokens"] - 2 * 81 == plain["prompt_tokens"]
    assert "prompt_tokens_details" not in plain


def test_ttft_grows_with_image_size(srv, client):
    """On the simulated H200, a bigger image is more prefill tokens and more encoder work: the
    server's own TTFT (first token - submitted, from its log) grows with the image."""
    ttft = []
    for side in (128, 512, 1024):
        r = client.post("/v1/chat/completions", json=_chat(_url(_png(side, side))))
        assert r.status_code == 200, r.text
        line = _wait_line(srv, r.json()["id"])
        ttft.append(line["first_token"] - line["submitted"])
    assert ttft[0] < ttft[1] < ttft[2]


@pytest.mark.parametrize("url,status,needle", [
    ("https://example.com/cat.png", 400, "only data: URLs"),
    ("data:image/png;base64,aGVsbG8=", 400, "not an image"),
    ("data:image/png,raw", 400, "must be base64"),
    ("data:image/png;base64,@@@", 400, "not valid base64"),
])
def test_bad_images(client, url, status, needle):
    r = client.post("/v1/chat/completions", json=_chat(url))
    assert r.status_code == status
    assert needle in r.json()["error"]["message"]


def test_image_bytes_beyond_the_limit_are_413(client):
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 256, (400, 400, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG")  # noise: ~480 KB, over the 200 KB limit
    assert len(buf.getvalue()) > MAX_IMAGE_BYTES
    r = client.post("/v1/chat/completions", json=_chat(_url(buf.getvalue())))
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and "--max-image-bytes" in err["message"]


def test_a_client_that_leaves_aborts_every_input(srv):
    """The body is sent and the socket closed at once: the server notices (its watcher), aborts
    the inputs still in the engine, logs the request as an abort, and the KV pool empties."""
    import socket
    import time
    from urllib.parse import urlsplit

    # 8 inputs of 1000 words: many engine steps on the simulated H200's wall clock (a 2 ms
    # overhead each), the disconnect seen within the first.
    body = json.dumps({"input": [" ".join(["w"] * 1000)] * 8}).encode()
    parts = urlsplit(srv.url)
    before = set(_ids(srv))
    with socket.create_connection((parts.hostname, parts.port)) as s:
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 20.0
    new: list[dict] = []
    while not new and time.monotonic() < deadline:
        new = [x for i, x in _ids(srv).items() if i not in before]
        time.sleep(0.01)
    assert len(new) == 1 and new[0]["finish"] == "abort" and new[0]["inputs"] == 8
    assert new[0]["last_token"] is None  # it never answered
    snap = srv.engine.snapshot()
    while (snap.running or snap.waiting or snap.kv_blocks_used) and time.monotonic() < deadline:
        time.sleep(0.01)
        snap = srv.engine.snapshot()
    assert snap.running == snap.waiting == snap.kv_blocks_used == 0


def _ids(srv) -> dict[str, dict]:
    return {x["id"]: x for x in map(json.loads, srv.log.read_text().splitlines())}


def test_torch_engine_embeddings_are_the_models_last_hidden_state(tmp_path):
    """On the torch engine a vector is the model's own: the final (normed) hidden state at the
    input's last token, L2-normalized (vLLM's LAST pooling), checked against Hugging Face's
    forward of the same weights; rerank (no classifier head) is a 400 there."""
    torch = pytest.importorskip("torch")
    from helpers import tiny_hf_model

    from cbbench.engine.args import EngineArgs

    hf = tiny_hf_model("llama")
    hf.save_pretrained(tmp_path / "m")
    args = EngineArgs(engine="torch", model=str(tmp_path / "m"), device="cpu", dtype="fp32",
                      num_kv_blocks=64)
    run = start_server(lambda: build_serving_engine(args))
    try:
        ids = [[3, 14, 15, 92, 65], [35, 89], [7]]
        r = httpx.post(run.url + "/v1/embeddings", json={"input": ids}, timeout=60)
        assert r.status_code == 200, r.text
        got = [d["embedding"] for d in r.json()["data"]]
        assert r.json()["usage"]["prompt_tokens"] == 8
        with torch.no_grad():
            for row, x in zip(got, ids, strict=True):
                h = hf.model(torch.tensor([x])).last_hidden_state[0, -1]
                assert np.allclose(row, (h / h.norm()).numpy(), atol=1e-5)
        bad = httpx.post(run.url + "/v1/rerank", json={"query": "a", "documents": ["b"]})
        assert bad.status_code == 400 and "classifier head" in bad.json()["error"]["message"]
    finally:
        run.stop()


# ---- hostile images (issue 37, rule 1: one request never freezes the server) --------------------
def _png_header(width: int, height: int) -> bytes:
    """The attack's image: a PNG's signature and IHDR claiming width x height, then an empty
    IDAT, 45 bytes; Pillow reads its size from the header alone."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"")


def _image_ctx(limit: int):
    from types import SimpleNamespace

    return SimpleNamespace(
        cfg=SimpleNamespace(max_image_bytes=10**9, limit_images_per_prompt=limit),
        bridge=SimpleNamespace(info={"engine": "sim"}),
        ready=lambda: SimpleNamespace(vocab_size=1000, max_model_len=None),
    )


def test_image_prompt_work_is_linear_in_its_images():
    """The attack: 1,000 1036x1036 headers blocked the loop 12 s, the placeholder ids copied
    once per image (quadratic). The CPU time for 4x the images must stay near 4x (a quadratic
    build is ~16x: 0.14 s -> 2.5 s for 200 -> 800 before the fix); CPU time, the best of 3,
    so the machine's load does not enter."""
    import time

    from cbbench.server.images import add_images
    from cbbench.server.protocol import ChatRequest

    url = _url(_png_header(1036, 1036))

    def cpu_s(n: int) -> float:
        req = ChatRequest.model_validate(_chat(*[url] * n))
        best = math.inf
        for _ in range(3):
            t = time.process_time()
            ids, images = add_images([1, 2, 3], req.messages, _image_ctx(n))
            best = min(best, time.process_time() - t)
        assert len(images) == n and len(ids) == 3 + n * 1225
        return best

    small, large = cpu_s(200), cpu_s(800)
    assert large < 8 * max(small, 1e-3), (small, large)


def test_images_past_the_limit_are_a_400_before_any_is_read(client):
    """vLLM's --limit-mm-per-prompt: 1,000 images past a limit of 64 are refused by count
    (the 68-byte-header attack); 64 are taken."""
    many = _chat(*[_url(_png_header(1036, 1036))] * 1000)
    r = client.post("/v1/chat/completions", json=many)
    assert r.status_code == 400, r.text
    assert "--limit-mm-per-prompt" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json=_chat(*[_url(_png_header(1, 1))] * 64))
    assert r.status_code == 200, r.text


def test_image_prompt_beyond_the_context_is_a_400_before_its_ids_are_built(client):
    r = client.post("/v1/chat/completions", json=_chat(*[_url(_png_header(1036, 1036))] * 8))
    assert r.status_code == 400, r.text  # 8 x 1225 tokens > the 8192-token context
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "8192" in err["message"]


def test_decompression_bomb_header_is_a_400(client):
    """A header claiming 20000 x 20000 (400M pixels, past Pillow's ~179M bomb limit) raised
    DecompressionBombError: a 500. A 400 naming the bomb."""
    r = client.post("/v1/chat/completions", json=_chat(_url(_png_header(20000, 20000))))
    assert r.status_code == 400, r.text
    assert "decompression bomb" in r.json()["error"]["message"]


def test_limit_mm_per_prompt_flag():
    from cbbench.server.limits import parse_image_limit

    assert parse_image_limit('{"image": 3}') == 3 and parse_image_limit("7") == 7
    for bad in ('{"video": 1}', "-1", "x", '{"image": 1.5}', "99999"):
        with pytest.raises(ValueError):
            parse_image_limit(bad)


def test_many_images_never_hold_the_server(tmp_path):
    """`cbbench serve` as a user starts it: requests of 1,000 and 5,000 one-pixel and
    1036x1036 headers are answered 4xx at once while /health keeps answering, and SIGTERM then
    stops the server (it waited for SIGKILL while the loop was blocked). The bounds are relative
    to /health's own latency measured first, in this test, so a loaded machine does not fail it;
    the figures are printed (pytest -s) for the report."""
    import signal
    import threading
    import time

    from helpers import PROCESS_STOP_TIMEOUT_S, SERVE_MODEL, serve_process

    def health_ms(c: httpx.Client) -> float:
        t = time.perf_counter()
        assert c.get("/health").status_code == 200
        return (time.perf_counter() - t) * 1e3

    with serve_process("--engine", "sim", "--model", SERVE_MODEL, "--gpu", "h200") as run:
        with httpx.Client(base_url=run.url, timeout=60.0) as c:
            baseline = sorted(health_ms(c) for _ in range(20))[10]
            for n, (w, h) in [(1000, (1, 1)), (5000, (1, 1)), (1000, (1036, 1036)),
                              (5000, (1036, 1036))]:
                body = json.dumps(_chat(*[_url(_png_header(w, h))] * n)).encode()
                during: list[float] = []
                done = threading.Event()

                def poll(done: threading.Event, during: list[float]) -> None:
                    with httpx.Client(base_url=run.url, timeout=60.0) as h2:
                        while not done.is_set() or len(during) < 3:  # at least 3, overlapping
                            during.append(health_ms(h2))

                poller = threading.Thread(target=poll, args=(done, during))
                poller.start()
                t = time.perf_counter()
                r = c.post("/v1/chat/completions", content=body,
                           headers={"content-type": "application/json"})
                answer_ms = (time.perf_counter() - t) * 1e3
                done.set()
                poller.join()
                print(f"{n} images {w}x{h} ({len(body)} B): {r.status_code} in {answer_ms:.1f} ms; "
                      f"/health baseline {baseline:.1f} ms, worst during {max(during):.1f} ms")
                assert 400 <= r.status_code < 500 and "--limit-mm-per-prompt" in r.text
                # The 5,000-image attack took > 300 s; a bounded answer is well under a second
                # even on a loaded 2-core machine (this test's client encodes and sends 0.8 MB).
                assert answer_ms < max(100.0, 40 * baseline), answer_ms
                assert max(during) < max(50.0, 40 * baseline), (during, baseline)
        run.proc.send_signal(signal.SIGTERM)
        run.proc.wait(PROCESS_STOP_TIMEOUT_S)  # raises TimeoutExpired if SIGTERM is ignored
        assert run.proc.returncode is not None
