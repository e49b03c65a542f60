"""Prompt text <-> token ids for the server.

With ``--tokenizer`` (a ``tokenizer.json``, or a folder that holds one: load/prompts.py
load_tokenizer, the client's loader) the ``tokenizers`` library encodes prompts and decodes outputs for real. Without one, a documented fallback:

- prompts: each whitespace-separated word is one token, so a prompt's token count is its word
  count on every run. A word that is a token id written in decimal (``"1234"``) is that id; any
  other word's id is a stable hash of it (crc32) modulo the vocabulary;
- outputs: the simulated engine produces no token ids, so every token is the text ``" tok"``;
  the torch engine without a tokenizer writes each id as text, ``" 1234"``. With a tokenizer
  the simulated engine's reply is scripted instead (``placeholder_reply_ids``): its text is
  ``"tok tok ..."``, decoded from those ids;
- /detokenize writes ids the same way, so ids -> text -> ids round-trips (text -> ids -> text
  does not: a hash has no inverse).
"""

from __future__ import annotations

import zlib
from typing import Protocol

SIM_TOKEN_TEXT = " tok"
# With a tokenizer, the simulated reply's first token has no leading space: chat templates
# trim a message's content (Llama-3's `message['content'] | trim`), so the next turn re-encodes
# a reply starting " tok" from "tok", another id, and its first block would miss the cache.
SIM_FIRST_TOKEN_TEXT = SIM_TOKEN_TEXT.lstrip()
# What /tokenize and /detokenize say they used.
TOKENIZER_KIND = "tokenizer.json"
FALLBACK_KIND = "word-per-token fallback (no --tokenizer)"
MAX_CACHED_WORDS = 1 << 16  # the fallback's word -> id cache starts over beyond this
MAX_CACHED_WORD_CHARS = 64  # longer words are hashed every time: the cache stays small
MAX_ID_DIGITS = 18  # a decimal word this long or shorter may be an id (and fits int())


class TokenDecoder(Protocol):
    """Per-request, stateful: text for each new token as it arrives."""

    def push(self, token_id: int | None) -> str: ...
    def flush(self) -> str: ...


class TextCodec(Protocol):
    kind: str  # TOKENIZER_KIND or FALLBACK_KIND

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_strs(self, ids: list[int]) -> list[str]: ...
    def decoder(self) -> TokenDecoder: ...


# ---- fallback ----------------------------------------------------------------------------------
class _FallbackDecoder:
    def push(self, token_id: int | None) -> str:
        return SIM_TOKEN_TEXT if token_id is None else f" {token_id}"

    def flush(self) -> str:
        return ""


class HashedWordCodec:
    """No tokenizer: one token per whitespace word; a decimal id is itself, any other word is
    hashed into the vocabulary. There are no special tokens."""

    kind = FALLBACK_KIND

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = max(1, vocab_size)
        # Prompts reuse words: a dict lookup is a tenth of a hash, and encoding runs on the
        # event loop, inside every request's time to first token.
        self._ids: dict[str, int] = {}

    def _id(self, word: str) -> int:
        if (len(word) <= MAX_ID_DIGITS and word.isdecimal() and word.isascii()
                and int(word) < self.vocab_size):
            return int(word)
        return zlib.crc32(word.encode()) % self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._ids
        words = text.split()
        try:
            return list(map(ids.__getitem__, words))
        except KeyError:  # new words: hash them once
            if len(ids) > MAX_CACHED_WORDS:
                ids.clear()
            for w in words:
                if w not in ids and len(w) <= MAX_CACHED_WORD_CHARS:
                    ids[w] = self._id(w)
            return [ids[w] if w in ids else self._id(w) for w in words]

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids)

    def token_strs(self, ids: list[int]) -> list[str]:
        return [str(i) for i in ids]

    def decoder(self) -> TokenDecoder:
        return _FallbackDecoder()


# ---- a real tokenizer --------------------------------------------------------------------------
class _IncrementalDecoder:
    """Decodes a window that starts one step back, so that a token's leading space (which
    SentencePiece-style decoders drop at the start of a text) survives, and holds text back
    while it ends in an incomplete UTF-8 character."""

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # the window starts here
        self._read = 0  # ids before this are already emitted

    def _text(self, start: int, end: int | None = None) -> str:
        return self._tok.decode(self._ids[start:end], skip_special_tokens=True)

    def push(self, token_id: int | None) -> str:
        if token_id is None:
            return SIM_TOKEN_TEXT
        self._ids.append(token_id)
        done = self._text(self._prefix, self._read)
        full = self._text(self._prefix)
        if len(full) > len(done) and not full.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return full[len(done) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back when the request ends."""
        done = self._text(self._prefix, self._read)
        full = self._text(self._prefix)
        self._prefix = self._read = len(self._ids)
        return full[len(done) :]


class TokenizerCodec:
    kind = TOKENIZER_KIND

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        """Special tokens included, as vLLM's /detokenize writes them."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_strs(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) or "" for i in ids]

    def decoder(self) -> TokenDecoder:
        return _IncrementalDecoder(self.tokenizer)


def placeholder_reply_ids(codec: TextCodec, max_tokens: int) -> list[int] | None:
    """The ids the simulated engine's reply of ``max_tokens`` tokens is scripted as, with a
    tokenizer: "tok", then " tok" each (decoded, ``"tok tok ..."``), as the in-process simulator
    scripts a session's replies (targets/engine_feed.py). The prefix cache then registers the
    reply's blocks as they are computed, and the next turn, which re-encodes the reply from its
    text, finds them, as a real engine's generated ids are found. None without a tokenizer
    (the word-per-token fallback writes placeholder text), or where either text is not one
    token in it."""
    if not isinstance(codec, TokenizerCodec) or max_tokens <= 0:
        return None
    first = codec.encode(SIM_FIRST_TOKEN_TEXT, add_special_tokens=False)
    rest = codec.encode(SIM_TOKEN_TEXT, add_special_tokens=False)
    if len(first) != 1 or len(rest) != 1:
        return None
    return first + rest * (max_tokens - 1)


def make_codec(tokenizer, vocab_size: int) -> TextCodec:
    return TokenizerCodec(tokenizer) if tokenizer is not None else HashedWordCodec(vocab_size)
