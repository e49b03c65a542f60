"""Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors) made to switch ``triton.language``
once a launch instead of once a device-function call, and to skip integer-overflow checks whose
verdict it throws away.

A launch switches the language to the interpreter's semantics for its whole grid (the
interpreter's ``_patch_lang``) and switches it back when the grid is done. Triton 3.9 also
calls ``_patch_lang`` on every call of a ``@triton.jit`` device function inside the grid
(``tl.max``, ``tl.sum``, ``tl.cdiv``, :func:`.triton_dot.attention_dot`), and each call walks
every member of ``triton.language`` again (~4 ms) to set what is already set: a split-K decode
launch makes ~1,700 such calls, ~40% of its time. Here a call whose language modules this
launch has already switched does nothing; any other call switches them as before. Switching is
idempotent per module (the same interpreter functions are set), so the kernels compute exactly
what they computed. Compiled kernels never come here (:mod:`.triton_common` installs this only
when interpreted).

Overflow checks: every ``+``, ``-`` and ``*`` on int32 (offsets, indices: most of a kernel's
integer work) also recomputes itself in int64, compares against int32's range and hands the
verdict to ``device_assert``, which drops it unless the options ask for ``debug``, and the
interpreter's options never do (``InterpreterOptions().debug`` is False and nothing sets it).
That discarded work was ~25% of an interpreted decode launch. With ``debug`` off the builder's
``sanitize_overflow`` is turned off, so the check is not computed; with ``debug`` on it stays.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import triton.language as tl
from triton.runtime import interpreter

_switched: set[int] = set()  # ids of the language modules the running launch has switched
_real_patch_lang: Any = None


def _language_modules(fn: Any) -> set[int]:
    """The modules ``_patch_lang(fn)`` switches: ``triton.language`` and ``triton.language.core``
    where ``fn``'s globals hold them (the interpreter's own rule, by identity)."""
    lang, core = tl, tl.core
    return {id(v) for v in fn.__globals__.values() if v is lang or v is core}


def _patch_lang_once(fn: Any) -> Any:
    modules = _language_modules(fn)
    if modules and modules <= _switched:
        return interpreter._LangPatchScope()  # already switched: nothing to set or undo
    scope = _real_patch_lang(fn)
    _switched.update(modules)
    restore = scope.restore

    def restore_and_forget() -> None:  # the launch's scope: its grid is done
        _switched.clear()
        restore()

    scope.restore = restore_and_forget
    return scope


def switch_language_once_a_launch() -> None:
    """Install the shortcut (idempotent); a Triton without the hook it wraps is left as it is."""
    global _real_patch_lang
    if _real_patch_lang is not None or not hasattr(interpreter, "_LangPatchScope"):
        return
    if not callable(getattr(interpreter, "_patch_lang", None)):
        return
    _real_patch_lang = interpreter._patch_lang
    interpreter._patch_lang = _patch_lang_once


def skip_discarded_overflow_checks() -> None:
    """Turn off the interpreter builder's ``sanitize_overflow`` where ``debug`` is off (the
    checks' only outcome, a device assert, is dropped then); a Triton without the fields is left
    as it is."""
    builder: Any = getattr(interpreter, "interpreter_builder", None)
    options: Any = getattr(builder, "options", None)
    if getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return  # no builder or options, debug on, or the checks already off
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
