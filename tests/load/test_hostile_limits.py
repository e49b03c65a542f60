"""Every new input has the limit its neighbours have (issue 25, rules 5 and 6).

Each case was accepted (or a traceback, or ran until memory was gone) before it was checked up
front with the neighbouring check's message: the 30-day schedule limit, the 30-day delay limit,
the memory checks of --num-requests and --input-len, --seed's range form, a CSV trace's count
and date checks, a result file's numbers. And session files get the checks request files get:
token ids against the vocabulary, one message field, a length that agrees with the ids.
"""

from __future__ import annotations

import json

import pytest
from helpers import invoke_app, one_line

SIM = ["--engine", "sim", "--gpu", "h200", "--model", "llama-3-8b"]


def cli(*args):
    return invoke_app([str(a) for a in args])


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- schedules and delays ----------------------------------------------------------------------
def test_time_scale_keeps_the_30_day_schedule_limit(tmp_path):
    """`--time-scale` multiplied the schedule after the 30-day check (a 301-digit duration,
    exit 0)."""
    w = jsonl(tmp_path / "t.jsonl", [{"prompt_len": 8, "output_len": 2, "arrival_s": float(i)}
                                     for i in range(3)])
    out = tmp_path / "r.json"
    one_line(cli("run", *SIM, "--workload", w, "--arrival", "trace", "--time-scale", "1e300",
                 "--output", out), "the arrival schedule spans", "(30 days)", "--time-scale")
    assert not out.exists()


def test_duration_with_a_tiny_burstiness_is_refused_not_drawn_until_memory_is_gone(tmp_path):
    one_line(cli("run", *SIM, "--duration", "60s", "--request-rate", "10", "--burstiness",
                 "1e-300", "--output", tmp_path / "r.json"),
             "--duration 60 s with --burstiness 1e-300", "of memory")


@pytest.mark.parametrize("turn, text", [
    ({"user_len": 8, "output_len": 2, "think_time_ms": 1e15}, "at most 2592000000 ms (30 days)"),
    ({"user_len": 10**12, "output_len": 2}, "of token ids, more than"),
    # beyond the list: the request file's field checks, for a turn
    ({"user": "hi", "user_len": 8, "output_len": 2}, "give 'user' or 'user_len', not both"),
    ({"user_token_ids": [1, 2], "user_len": 8, "output_len": 2}, "'user_len' disagrees"),
    ({"user": "hi", "user_token_ids": [1, 2], "output_len": 2}, "not both"),
], ids=["think-time-1e15", "user-len-1e12", "user-and-user-len", "user-len-disagrees",
        "user-and-ids"])
def test_a_session_turn_has_its_neighbours_limits(tmp_path, turn, text):
    first = {"user_len": 8, "output_len": 2}
    w = jsonl(tmp_path / "s.jsonl", [{"turns": [first, turn]}])
    one_line(cli("run", *SIM, "--workload", w, "--output", tmp_path / "r.json"), text)


def test_a_session_turn_beyond_the_context_builds_no_prompt(tmp_path):
    """A turn that can never fit is rejected at arrival without its ids being made (as a
    request's is): 10**9 tokens would be 36 GB of ids; the session ends there, the run goes
    on and the other session completes."""
    w = jsonl(tmp_path / "s.jsonl", [
        {"turns": [{"user_len": 8, "output_len": 2}, {"user_len": 10**8, "output_len": 2}]},
        {"turns": [{"user_len": 8, "output_len": 2}, {"user_len": 8, "output_len": 2}]},
    ])
    out = tmp_path / "r.json"
    res = cli("run", *SIM, "--enable-prefix-caching", "--workload", w, "--max-error-rate", "1",
              "--output", out)
    assert res.exit_code == 0, (res.output, res.exception)
    reqs = json.loads(out.read_text())["requests"]
    assert sum(r["error_type"] == "rejected" for r in reqs) == 1
    assert sum(r["error"] is None for r in reqs) == 3


def test_an_out_of_vocabulary_token_in_a_session_turn_is_one_line_before_the_run(tmp_path):
    """Rule 6: one such id failed every request of its engine step (12 good sessions lost)."""
    pytest.importorskip("torch")
    good = [{"turns": [{"user_token_ids": [5, 6, 7], "output_len": 2}]} for _ in range(12)]
    bad = {"session_id": "evil", "turns": [{"user_token_ids": [5], "output_len": 2},
                                           {"user_token_ids": [99_999_999], "output_len": 2}]}
    w = jsonl(tmp_path / "s.jsonl", [*good, bad])
    out = tmp_path / "r.json"
    one_line(cli("run", "--engine", "torch", "--device", "cpu", "--model", "tiny",
                 "--num-kv-blocks", "64", "--workload", w, "--output", out),
             "session evil turn 2: token id 99999999 is outside the model's vocabulary")
    assert not out.exists()


# ---- sizes and counts -------------------------------------------------------------------------
def test_workers_beyond_memory_are_refused(tmp_path, monkeypatch):
    import cbbench.load.limits as limits

    monkeypatch.setattr(limits, "available_host_bytes", lambda: 8 << 30)
    one_line(cli("run", "--endpoint", "http://127.0.0.1:9", "--served-model", "m",
                 "--workers", "1024", "--output", tmp_path / "r.json"),
             "--workers 1024 needs about", "(~60 MB a worker)", "available on this host")


@pytest.mark.parametrize("flag", ["--input-len", "--output-len", "--prefix-len"])
def test_random_lengths_beyond_int64_are_one_line(tmp_path, flag):
    one_line(cli("run", *SIM, "--workload", "random", flag, str(2**63),
                 "--output", tmp_path / "r.json"), f"{flag} must be in [")


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("row, text", [
    ("2023-11-16 18:15:46.6805900,²,10", "ContextTokens must be a whole number"),
    ("2023-11-16 18:15:46.6805900," + "9" * 5000 + ",10", "at most 18 digits"),
    ("2023-02-31 18:15:46.6805900,100,10", "is not a valid date"),
    # beyond the list: a UTC offset of 99 hours, shifted silently
    ("2024-05-10 00:00:00.009930+99:99,100,10", "is not a valid date"),
], ids=["superscript-two", "5000-digits", "feb-31", "offset-99h"])
def test_a_csv_trace_cell_beyond_its_kind_is_one_line(tmp_path, row, text):
    t = tmp_path / "azure.csv"
    t.write_text(AZURE_HEAD + "2023-11-16 18:15:45.0000000,100,10\n" + row + "\n")
    line = one_line(cli("run", *SIM, "--workload", t, "--output", tmp_path / "r.json"), text)
    assert len(line) < 400  # a 5000-digit cell is not printed whole


def test_burstgpt_digits_of_another_script_are_refused(tmp_path):
    """Beyond the issue's list: re's \\d took '٣' (Arabic-Indic 3) as a timestamp digit."""
    t = tmp_path / "b.csv"
    t.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "0,m,10,5,15,x\n\u0663,m,10,5,15,x\n")
    one_line(cli("run", *SIM, "--workload", t, "--output", tmp_path / "r.json"),
             "Timestamp must be a number >= 0")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    out = d / "base.json"
    assert cli("run", *SIM, "--num-requests", "5", "--output", out).exit_code == 0
    return out


@pytest.mark.parametrize("command", ["gate", "compare", "report"])
def test_a_401_digit_integer_in_a_result_is_one_line_exit_2(base, tmp_path, command):
    """gate exited 1 (its code for "regressed") on an OverflowError; compare and report were
    tracebacks (beyond the issue's list)."""
    data = json.loads(base.read_text())
    text = json.dumps(data).replace(
        f'"p50": {json.dumps(data["summary"]["ttft_ms"]["p50"])}', '"p50": ' + "1" * 401, 1)
    big = tmp_path / "big.json"
    big.write_text(text)
    args = {"gate": ["gate", base, "--baseline", big], "compare": ["compare", base, big],
            "report": ["report", base, big, "--out", tmp_path / "rep"]}[command]
    one_line(cli(*args), "an integer of 401 digits")
