"""What `cbbench serve`'s HTTP layer adds to TTFT: client TTFT - engine TTFT, per request.

    python tests/bench/bench_serve_overhead.py --rate 20 --num-requests 600 [--server-cbbench PATH]

Starts `cbbench serve --engine sim --gpu h200 --model llama-3-8b --request-log LOG` (the
`cbbench` next to this Python unless --server-cbbench names another install, e.g. an older
commit's venv), replays the sharegpt workload against it with this install's
`cbbench run --endpoint` at --rate (the same client for every server), each in its own process
as a user runs them, then pairs the client's records with the request log.

- engine TTFT: the log's first_token - submitted (the engine's own TTFT: from the hand-over to
  the engine, waiting for the running iteration to end included, as in-process and in vLLM);
- client TTFT: the client's, counted from its actual send (the result's ttft_ms - send_lag_ms),
  so a client that fell behind its schedule does not inflate the server's share;
- added = client TTFT - engine TTFT per request; its p50 is the figure; the stages split it:
  in (client send -> handed to the engine: network, HTTP parsing, validation, tokenization) and
  out (token made -> client read: the hop to the event loop, SSE framing, socket, client).
  When the client's result has its clock's epoch (summary.http.t0_epoch_s), the parts outside
  the server's stamps too: client send -> app arrival, and socket write -> client read.

Pairing: a client record goes with the log line of the response id it recorded
(server_request_id; the log's id). --lengths is kept for comparing with earlier figures, which
paired by distinct (prompt, output) lengths. Not collected by pytest. Results:
results/serve_overhead.md.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

SERVE_ARGS = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
LOG_SETTLE_S = 1.0
MS = 1000.0


def start_server(cbbench: str, log: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [cbbench, "serve", *SERVE_ARGS, "--port", "0", "--request-log", str(log), *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if m := re.search(r"ready at (http://\S+)/v1", line):
            return proc, m.group(1)
    proc.kill()
    raise SystemExit(f"the server did not start: {' '.join(cmd)}")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


def pair(records: list[dict], log: list[dict]) -> tuple[list[tuple[dict, dict]], int]:
    """(client record, log line) pairs of the completed requests, joined by the response id,
    and how many completed records found no line."""
    lines = {e["id"]: e for e in log if e["finish"] in ("length", "stop")}
    pairs, unpaired = [], 0
    for r in records:
        if r["error"] is not None:
            continue
        e = lines.get(r.get("server_request_id"))
        if e is not None:
            pairs.append((r, e))
        else:
            unpaired += 1
    return pairs, unpaired


def p50(xs) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), 50))


def varied_workload(path: Path, n: int, prompt_len: int, output_len: int) -> None:
    """N requests whose (prompt, output) lengths are all distinct (up to prompt_len x
    output_len requests), spread evenly around the given means (earlier figures paired by them)."""
    if n > prompt_len * output_len:
        raise SystemExit(f"--lengths {prompt_len},{output_len} pairs at most {prompt_len * output_len} requests")
    lines = []
    for i in range(n):
        p = prompt_len // 2 + i % prompt_len
        o = output_len // 2 + (i // prompt_len) % output_len
        lines.append(json.dumps({"prompt_len": p, "output_len": o}) + "\n")
    path.write_text("".join(lines))


def measure(server: str, client: str, rate: float, n: int, seed: int, extra: list[str],
            lengths: tuple[int, int] | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="serve-overhead-"))
    log, result = work / "requests.jsonl", work / "result.json"
    workload = "sharegpt"
    if lengths is not None:
        workload = str(work / "varied.jsonl")
        varied_workload(Path(workload), n, *lengths)
    proc, url = start_server(server, log, extra)
    try:
        cmd = [
            client, "run", "--endpoint", url, "--workload", workload, "--request-rate", str(rate),
            "--num-requests", str(n), "--seed", str(seed), "--output", str(result),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"cbbench run failed ({run.returncode}): {run.stderr[-2000:]}")
        time.sleep(LOG_SETTLE_S)
    finally:
        stop(proc)
    res = json.loads(result.read_text())
    entries = [json.loads(x) for x in log.read_text().splitlines()]
    shutil.rmtree(work, ignore_errors=True)
    pairs, unpaired = pair(res["requests"], entries)
    client = [(r["ttft_ms"] - r["send_lag_ms"]) for r, _ in pairs]
    engine = [(e["first_token"] - e["submitted"]) * MS for _, e in pairs]
    added = [c - g for c, g in zip(client, engine)]
    stages = {
        "http_in_ms": [(e["submitted"] - e["arrival"]) * MS for _, e in pairs],
        "engine_hop_in_ms": [(e["admitted"] - e["submitted"]) * MS for _, e in pairs],
        "http_out_ms": [(e["first_token_sent"] - e["first_token"]) * MS for _, e in pairs],
    }
    http = res["summary"].get("http", {})
    t0 = http.get("t0_epoch_s")  # the client's run clock on the epoch: both sides on one clock
    if t0 is not None:
        stages["client_to_app_ms"] = [
            (e["arrival"] - (t0 + r["intended_start_s"] + r["send_lag_ms"] / MS)) * MS
            for r, e in pairs
        ]
        stages["socket_to_client_ms"] = [
            (t0 + r["intended_start_s"] + r["ttft_ms"] / MS - e["first_token_sent"]) * MS
            for r, e in pairs
        ]
    return {
        "rate": rate,
        "workload": "sharegpt" if lengths is None else f"varied {lengths[0]},{lengths[1]}",
        "num_requests": n,
        "completed": len(pairs),
        "unpaired": unpaired,
        "client_ttft_p50_ms": p50(client),
        "engine_ttft_p50_ms": p50(engine),
        "added_p50_ms": p50(added),
        "added_p90_ms": float(np.percentile(added, 90)),
        "added_min_ms": min(added),
        "p50_difference_ms": p50(client) - p50(engine),
        **{k + "_p50": p50(v) for k, v in stages.items()},
        "send_lag_p50_ms": http.get("send_lag_p50_ms"),
        "client_loop_lag_p50_ms": http.get("loop_lag_p50_ms"),
        "client_fell_behind": http.get("client_fell_behind"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, action="append", help="req/s (repeatable)")
    ap.add_argument("--num-requests", type=int, action="append", help="one per --rate")
    ap.add_argument("--seed", type=int, default=0)
    here = str(Path(sys.executable).with_name("cbbench"))
    ap.add_argument("--server-cbbench", default=here, help="the cbbench whose serve is measured")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument")
    ap.add_argument(
        "--lengths",
        help="PROMPT,OUTPUT: distinct lengths around these means (default: the sharegpt workload)",
    )
    ap.add_argument("--json", help="append the figures to this JSON-lines file")
    ap.add_argument("--label", help="a name for these figures (before, after, ...)")
    args = ap.parse_args()
    rates = args.rate or [20.0]
    counts = args.num_requests or [600] * len(rates)
    for rate, n in zip(rates, counts):
        lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else None
        out = measure(args.server_cbbench, here, rate, n, args.seed, args.serve_arg, lengths)
        out["load_avg_1m"] = os.getloadavg()[0]
        out["label"] = args.label
        print(json.dumps(out))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
