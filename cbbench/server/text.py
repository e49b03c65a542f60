"""Prompt text <-> token ids for the server.

With ``--tokenizer`` (a ``tokenizer.json``, or a folder that holds one) the ``tokenizers``
library encodes prompts and decodes outputs for real. Without one, a documented fallback:

- prompts: each whitespace-separated word is one token, its id a stable hash of the word
  (crc32) modulo the vocabulary, so a prompt's token count is its word count on every run;
- outputs: the simulated engine produces no token ids, so every token is the text ``" tok"``;
  the torch engine without a tokenizer writes each id as text, ``" 1234"``.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Protocol

SIM_TOKEN_TEXT = " tok"
TOKENIZER_FILE = "tokenizer.json"


class TokenDecoder(Protocol):
    """Per-request, stateful: text for each new token as it arrives."""

    def push(self, token_id: int | None) -> str: ...
    def flush(self) -> str: ...


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decoder(self) -> TokenDecoder: ...


def load_tokenizer(path: str):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json file or a folder holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / TOKENIZER_FILE
    if not p.is_file():
        raise ValueError(f"no tokenizer at {path} (expected a {TOKENIZER_FILE} or its folder)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(
            "--tokenizer needs the `tokenizers` package: pip install 'cbbench[tokenizer]'"
        ) from None
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # the library raises a bare Exception on a malformed file
        raise ValueError(f"cannot load the tokenizer {p}: {e}") from None


# ---- fallback ----------------------------------------------------------------------------------
class _FallbackDecoder:
    def push(self, token_id: int | None) -> str:
        return SIM_TOKEN_TEXT if token_id is None else f" {token_id}"

    def flush(self) -> str:
        return ""


class HashedWordCodec:
    """No tokenizer: one token per whitespace word, ids hashed into the vocabulary."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = max(1, vocab_size)

    def encode(self, text: str) -> list[int]:
        v = self.vocab_size
        return [zlib.crc32(w.encode()) % v for w in text.split()]

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
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decoder(self) -> TokenDecoder:
        return _IncrementalDecoder(self.tokenizer)


def make_codec(tokenizer, vocab_size: int) -> TextCodec:
    return TokenizerCodec(tokenizer) if tokenizer is not None else HashedWordCodec(vocab_size)
