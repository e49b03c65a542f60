"""Soak: 1000 concurrent streaming requests against `cbbench serve --engine sim` on loopback,
10% of them hanging up at a random point. Afterwards the KV pool is whole again, nothing is
running or waiting, no response was a 5xx, and the server still answers /health.

The server runs as its own process (as a user would run it), so the client does not share its
GIL. Every wait is bounded; the test takes well under a minute.
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

NUM_REQUESTS = 1000
DISCONNECT_FRACTION = 0.10
MAX_TOKENS = 16
# Hang-ups ask for a long output (tens of seconds of simulated decoding) so that the hang-up
# surely lands mid-generation, and read a random number of tokens first.
HANG_UP_MAX_TOKENS = 20_000
HANG_UP_AFTER = (1, 64)
PROMPT_WORDS = (16, 256)
SEED = 0
RUN_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 15.0

def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def _one(client: httpx.AsyncClient, i: int, rng: random.Random, stats: dict) -> None:
    words = " ".join(f"w{rng.randrange(10_000)}" for _ in range(rng.randint(*PROMPT_WORDS)))
    hang_up_after = rng.randint(*HANG_UP_AFTER) if rng.random() < DISCONNECT_FRACTION else None
    req = {
        "prompt": words, "stream": True,
        "max_tokens": MAX_TOKENS if hang_up_after is None else HANG_UP_MAX_TOKENS,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/completions", json=req) as r:
        stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1
        if r.status_code != 200:
            await r.aread()
            return
        tokens = 0
        usage = None
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if '"usage"' in line:
                usage = line
                continue
            tokens += 1
            if hang_up_after is not None and tokens >= hang_up_after:
                stats["disconnected"] += 1
                stats["tokens"] += tokens
                return  # leaving the block closes the connection mid-stream
    stats["completed"] += 1
    stats["tokens"] += tokens
    if tokens != MAX_TOKENS or usage is None or f'"completion_tokens":{MAX_TOKENS}' not in usage:
        stats["short"] += 1


async def _soak(url: str) -> dict:
    stats = {"status": {}, "completed": 0, "disconnected": 0, "tokens": 0, "short": 0}
    limits = httpx.Limits(max_connections=NUM_REQUESTS + 10, max_keepalive_connections=NUM_REQUESTS + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=RUN_TIMEOUT_S) as client:
        rngs = [random.Random(SEED * 1_000_003 + i) for i in range(NUM_REQUESTS)]
        t0 = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(_one(client, i, rngs[i], stats) for i in range(NUM_REQUESTS))),
            RUN_TIMEOUT_S,
        )
        stats["duration_s"] = time.perf_counter() - t0
    return stats


@pytest.mark.slow
def test_soak_1000_streams_with_disconnects(sim_serve_process):
    url = sim_serve_process.url
    stats = asyncio.run(_soak(url))
    with httpx.Client(base_url=url, timeout=10.0) as c:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            m = _metrics(c.get("/metrics").text)
            idle = (
                m["cbbench_num_requests_running"] == 0
                and m["cbbench_num_requests_waiting"] == 0
                and m["cbbench_kv_cache_blocks_used"] == 0
            )
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        health = c.get("/health").status_code
    n5xx = sum(v for k, v in stats["status"].items() if k >= 500)
    finished = m["cbbench_requests_finished_total"]
    aborted = m["cbbench_requests_aborted_total"]
    print(
        f"\nsoak: {NUM_REQUESTS} streams in {stats['duration_s']:.2f} s "
        f"({NUM_REQUESTS / stats['duration_s']:.0f} req/s, "
        f"{stats['tokens'] / stats['duration_s']:.0f} streamed tok/s); completed "
        f"{stats['completed']}, client hang-ups {stats['disconnected']}, engine aborts "
        f"{aborted:.0f}, finished {finished:.0f}; statuses {stats['status']}; "
        f"KV blocks used after: {m['cbbench_kv_cache_blocks_used']:.0f} of "
        f"{m['cbbench_kv_cache_blocks_total']:.0f}"
    )
    assert n5xx == 0, stats["status"]
    assert stats["status"] == {200: NUM_REQUESTS}
    assert stats["short"] == 0
    assert stats["completed"] + stats["disconnected"] == NUM_REQUESTS
    assert 0 < stats["disconnected"] < 2 * DISCONNECT_FRACTION * NUM_REQUESTS
    assert idle, m
    # Every request ended exactly once in the engine: finished, or aborted by its hang-up.
    assert aborted == stats["disconnected"]
    assert finished == stats["completed"]
    assert m["cbbench_requests_rejected_total"] == 0
    assert health == 200
