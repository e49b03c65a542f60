"""Prompts for HTTP targets: what each workload request sends as `prompt` (or chat content).

- Text workloads send their text; token-id workloads send the ids as a `prompt` list of ints on
  /v1/completions (OpenAI-compatible servers accept token-id prompts and add no BOS to them),
  or, for chat (needs --tokenizer), text that re-encodes to one token per id (IdText): the ids
  decoded, where that text encodes back to the very ids (a user's ids of real text), else one
  single-token word per id, the same word for the same id. Random ids (random --prefix-len,
  shared-prefix, Mooncake's blocks: ids below 512, Llama-3's bytes and word pieces) decode
  to fragments that merge when encoded again (300 ids read back as 261-279 tokens); the words
  keep the length exact and a shared id prefix a shared text prefix of as many tokens; by
  the length rule below the template's BOS is one of prompt_len's, so the last id goes.
- Length-only workloads (the built-in sharegpt) get synthetic text: words drawn from a pool of
  common English words, in a random order per request (deterministic per seed and request id),
  so a server's prefix cache cannot share more than a few tokens between prompts.

Length rule (BOS): a workload's prompt_len is the token count the server sees, special tokens
included, as vLLM's benchmark measures it (`len(tokenizer(prompt).input_ids)` adds Llama-3's
BOS). So the synthetic text carries prompt_len - k content tokens, with k the special tokens
the tokenizer adds to a plain encode (1 for Llama-3's <|begin_of_text|>):
- with --tokenizer (a tokenizer.json) the count is exact: the text is encoded, and words are
  dropped or added until it encodes to exactly prompt_len - k tokens (k read from the file);
- without it, an approximation: every pool word is one token after a space in the Llama-3
  and GPT (cl100k/o200k) tokenizers, so prompt_len - 1 words (one BOS assumed) ~ prompt_len.
A text prompt (a JSONL line's ``prompt``) is counted by the same rule: with --tokenizer,
``count_prompt_tokens`` (special tokens included); without it, ~4 characters a token.
For chat the server's template adds role and header tokens on top; the run's
prompt-token mismatch summary shows by how much. prompt_len is the same text count for every
--api; with a tokenizer_config.json beside --tokenizer, --api chat also counts each prompt
inside its chat template (load/chat_template.py: the template writes its BOS itself, so it is
counted once), and the template's excess over prompt_len is chat_template_tokens_added_mean (9
on Llama-3). A session turn's content is counted alone (``count_tokens``), trimmed as Llama-3's
template trims it: the template adds the rest around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cbbench.errors import UsageError
from cbbench.load.workload_types import WorkloadRequest

# One token each after a space (and alone) in the Llama-3 tokenizer; common English words that
# BPE vocabularies keep whole. Checked against Llama-3.1's tokenizer.json.
_WORDS = """the of and to in is that for it as with was on be at by this have from or one had not
    but what all were when we there can an your which their said if do will each about how up
    out them then she many some so these would other into has more her two like him see time
    could no make than first been its who now people my made over did down only way find use
    may water long little very after words called just where most know"""
WORD_POOL = tuple(_WORDS.split())
ASSUMED_SPECIAL_TOKENS = 1  # without a tokenizer: one BOS, as Llama-3 adds
PROMPT_RNG_STREAM = 7  # a separate random stream from request sampling and arrivals
MAX_FIT_ROUNDS = 16  # drop/add rounds to hit an exact length (one suffices for the pool)
MIN_SINGLE_TOKEN_WORDS = 8  # fewer than this: fall back to the whole pool, best effort
ID_TEXT_WORDS = 4096  # single-token words IdText draws on (one per id below it)

# synthetic_server: sized exactly with the server's /tokenize (targets/apis/server_tokenize.py).
PROMPT_KINDS = ("text", "token_ids", "decoded", "synthetic_exact", "synthetic_server",
                "synthetic_approx")


TOKENIZER_FILE = "tokenizer.json"  # what a Hugging Face model folder holds


def tokenizer_file(path: str) -> str:
    """--tokenizer's file: the path itself, or a Hugging Face model folder's tokenizer.json
    (its tokenizer_config.json beside it gives the chat template: load/chat_template.py)."""
    p = Path(path)
    if p.is_dir():
        if not (p / TOKENIZER_FILE).is_file():
            raise UsageError(f"--tokenizer {path}: a folder without a {TOKENIZER_FILE} (give the "
                             "model folder, or the file itself)")
        return str(p / TOKENIZER_FILE)
    return path


def load_tokenizer(path: str):
    """A `tokenizers.Tokenizer` from a tokenizer.json file or a model folder holding one
    (UsageError when it cannot load). A device or FIFO is refused before the library reads
    it: it read /dev/zero until memory ran out."""
    path = tokenizer_file(path)
    if not Path(path).is_file():
        raise UsageError(f"--tokenizer {path}: not a tokenizer.json file")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            "--tokenizer needs the 'tokenizers' package: pip install 'cbbench[tokenizer]'"
        ) from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad files
        raise UsageError(f"cannot load tokenizer {path}: {e}") from None


def count_tokens(tokenizer, text: str) -> int:
    """The text's own tokens, no special ones: a chat message's content (its template adds the
    rest), a piece of synthetic text."""
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def count_prompt_tokens(tokenizer, text: str) -> int:
    """A whole prompt's tokens as the server counts them, special tokens included: the length
    rule above (vLLM's ``len(tokenizer(prompt).input_ids)``; Llama-3's BOS counted)."""
    return len(tokenizer.encode(text, add_special_tokens=True).ids)


def special_tokens_added(tokenizer) -> int:
    """How many tokens (BOS, EOS) a plain encode adds around the text."""
    return len(tokenizer.encode("", add_special_tokens=True).ids)


@dataclass
class _ExactFitter:
    tokenizer: object
    pool: tuple[str, ...]
    special: int

    @classmethod
    def for_tokenizer(cls, tokenizer) -> _ExactFitter:
        single = tuple(w for w in WORD_POOL if count_tokens(tokenizer, " " + w) == 1)
        pool = single if len(single) >= MIN_SINGLE_TOKEN_WORDS else WORD_POOL
        return cls(tokenizer, pool, special_tokens_added(tokenizer))

    def fit(self, prompt_len: int, rng: np.random.Generator) -> str:
        target = max(1, prompt_len - self.special)
        words = [self.pool[i] for i in rng.integers(0, len(self.pool), target)]
        text = " ".join(words)
        for _ in range(MAX_FIT_ROUNDS):
            n = count_tokens(self.tokenizer, text)
            if n == target:
                break
            if n > target:  # one word per excess token (a word is >= 1 token)
                words = words[: max(1, len(words) - (n - target))]
            else:
                words += [self.pool[i] for i in rng.integers(0, len(self.pool), target - n)]
            text = " ".join(words)
        return text  # the run's prompt-token mismatch shows any residue


@dataclass
class IdText:
    """Token ids as chat text that re-encodes (``add_special_tokens=False``) to one token per
    id, special ids (a BOS: the chat template's to add) left out.

    The ids' own text when it encodes back to the very ids; else one word per id, ``words[id %
    len(words)]`` joined by spaces: each word is one token alone and after a space, and a
    space starts a new pre-token (Llama-3, GPT, SentencePiece and word-level tokenizers), so
    the text is exactly one token per id, and requests sharing their first P ids share text
    that encodes to the same P tokens (a server's prefix cache sees the workload's sharing).
    With up to 4,096 words (Llama-3.1 has them all) the workloads' ids below 512 get a word
    each, so two ids differ in the text where they differ in the workload. The choice is the
    request's own (the same on every worker): random ids that round-trip whole by chance are
    out of reach past a few ids (an adjacent pair of Llama-3 ids below 512 does half the time),
    so requests sharing a block-long prefix all take the words."""

    tokenizer: Any  # a tokenizers.Tokenizer
    words: tuple[str, ...]
    special: frozenset[int]

    @classmethod
    def for_tokenizer(cls, tokenizer) -> IdText:
        words: list[str] = []
        seen: set[str] = set()
        for i in range(tokenizer.get_vocab_size()):
            if len(words) >= ID_TEXT_WORDS:
                break
            w = tokenizer.decode([i]).strip()
            if (w in seen or not (w.isascii() and w.isalpha() and w.islower())
                    or count_tokens(tokenizer, w) != 1 or count_tokens(tokenizer, " " + w) != 1):
                continue
            seen.add(w)
            words.append(w)
        if len(words) < MIN_SINGLE_TOKEN_WORDS:  # an odd vocabulary: best effort, as the fitter
            words = list(WORD_POOL)
        added = tokenizer.get_added_tokens_decoder()
        special = frozenset(i for i, t in added.items() if t.special)
        return cls(tokenizer, tuple(words), special)

    def text(self, ids: Sequence[int], prompt_len: int | None = None) -> str:
        """``prompt_len``: the words are synthetic text, so they follow the length rule (the
        chat template writes the tokenizer's special tokens): the last ids past prompt_len - k
        are left out, as vLLM's random dataset draws input_len - k tokens of text. Without
        it (a session turn's content, counted alone), one word per id."""
        content = [i for i in ids if i not in self.special]
        decoded = self.tokenizer.decode(list(ids))  # special tokens skipped
        if self.tokenizer.encode(decoded, add_special_tokens=False).ids == content:
            return decoded
        if prompt_len is not None:
            content = content[:max(1, prompt_len - special_tokens_added(self.tokenizer))]
        return " ".join(self.words[i % len(self.words)] for i in content)


def prompt_rng(request_id: int, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, request_id, PROMPT_RNG_STREAM])


def approx_words(prompt_len: int, rng: np.random.Generator) -> list[str]:
    """The words of a prompt sized without a tokenizer (one BOS assumed)."""
    n = max(1, prompt_len - ASSUMED_SPECIAL_TOKENS)
    return [WORD_POOL[i] for i in rng.integers(0, len(WORD_POOL), n)]


def synthetic_prompt(
    prompt_len: int, request_id: int, seed: int, fitter: _ExactFitter | None = None
) -> str:
    rng = prompt_rng(request_id, seed)
    if fitter is not None:
        return fitter.fit(prompt_len, rng)
    return " ".join(approx_words(prompt_len, rng))


def build_prompts(
    wreqs: Sequence[WorkloadRequest], api: str, seed: int, tokenizer=None
) -> tuple[list[str | list[int]], dict[str, int]]:
    """The prompt each request sends, and how many of each kind (PROMPT_KINDS) were built."""
    fitter = None
    id_text = None
    prompts: list[str | list[int]] = []
    kinds = dict.fromkeys(PROMPT_KINDS, 0)
    for w in wreqs:
        if w.prompt is not None:
            prompts.append(w.prompt)
            kinds["text"] += 1
        elif (ids := w.token_ids()) is not None:
            if api == "completions":
                prompts.append(list(ids))
                kinds["token_ids"] += 1
            elif tokenizer is None:
                raise UsageError(
                    f"request {w.id} carries token ids, which the {api} API cannot take: give "
                    "--tokenizer (a tokenizer.json) to decode them, or use --api completions"
                )
            else:
                if id_text is None:
                    id_text = IdText.for_tokenizer(tokenizer)
                prompts.append(id_text.text(ids, w.prompt_len))
                kinds["decoded"] += 1
        else:
            if tokenizer is not None and fitter is None:
                fitter = _ExactFitter.for_tokenizer(tokenizer)
            if fitter is not None and w.prompt_len <= fitter.special:  # vLLM refuses it too
                raise UsageError(
                    f"request {w.id}: a {w.prompt_len}-token prompt has no room for text: the "
                    f"tokenizer adds {fitter.special} special token(s) to every prompt (give a "
                    "longer input)")
            prompts.append(synthetic_prompt(w.prompt_len, w.id, seed, fitter))
            kinds["synthetic_exact" if fitter else "synthetic_approx"] += 1
    return prompts, {k: v for k, v in kinds.items() if v}
