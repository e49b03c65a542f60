"""SseStream against the event-stream rules (WHATWG HTML, "Server-sent events": CR, LF or CRLF
ends a line; an event's `data:` lines are joined with LF; it is dispatched at the blank line
after them, and one the stream ends inside is dropped), checked on the same bytes against the
OpenAI SDK's decoder (openai._streaming.SSEDecoder), read at every split into network reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbbench.targets.sse import SseStream
from cbbench.targets.transport import HttpFailure

SSEDecoder = pytest.importorskip("openai._streaming").SSEDecoder


def _event(text: str, finish: str | None) -> bytes:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}).encode()


def _sdk_texts(reads: list[bytes]) -> list[str]:
    """The token texts the OpenAI SDK reads from these bytes (it stops at [DONE])."""
    texts = []
    for sse in SSEDecoder().iter_bytes(iter(reads)):
        if sse.data.startswith("[DONE]"):
            break
        texts.append(sse.json()["choices"][0]["text"])
    return texts


def _ours(reads: list[bytes]) -> tuple[list[str], list[float]]:
    times: list[float] = []
    s = SseStream(False, times, keep_text=True)
    for i, r in enumerate(reads):
        s.feed(r, float(i))
    s.close(float(len(reads)))
    assert s.pieces is not None
    return s.pieces, times


def _split(body: bytes, cuts: list[int]) -> list[bytes]:
    at = [0, *sorted(c % (len(body) + 1) for c in cuts), len(body)]
    return [body[a:b] for a, b in zip(at, at[1:])]


def _stream(eol: bytes, events: list[tuple[str, bool, bool]]) -> bytes:
    """A completions stream: per event, its text, whether its JSON spans two `data:` lines (as
    sse-starlette writes data with newlines in it), and whether a comment and an `event:` line
    come before it; the last event finishes, then [DONE]."""
    out = b": ping" + eol + eol
    for i, (text, two_lines, extra) in enumerate(events):
        data = _event(text, "length" if i == len(events) - 1 else None)
        if extra:
            out += b": keep-alive" + eol + b"event: completion" + eol
        if two_lines:
            head, _, rest = data.partition(b", ")
            out += b"data: " + head + b"," + eol + b"data: " + rest + eol
        else:
            out += b"data: " + data + eol
        out += eol
    return out + b"data: [DONE]" + eol + eol


EOLS = st.sampled_from([b"\n", b"\r\n", b"\r"])
EVENTS = st.lists(st.tuples(st.sampled_from(["a", " b", "\u00e9"]), st.booleans(), st.booleans()),
                  min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(EOLS, EVENTS, st.lists(st.integers(0, 10_000), max_size=4))
def test_tokens_match_the_openai_sdk_at_every_split(eol, events, cuts):
    """Before: a bare-CR stream ended as stream_cut with 0 tokens (no line was ever ended), and
    an event whose JSON spans two `data:` lines failed as bad_event (each line was parsed alone)."""
    reads = _split(_stream(eol, events), cuts)
    texts, times = _ours(reads)
    assert texts == _sdk_texts(reads) == [text for text, _, _ in events]
    assert len(times) == len(events)


def test_two_data_lines_are_one_event():
    body = _stream(b"\n", [("a", True, False)])
    assert _ours([body])[0] == ["a"]


def test_bare_cr_ends_lines():
    body = _stream(b"\r", [("a", False, False), ("b", False, False)])
    assert _ours([body])[0] == ["a", "b"]


def test_a_crlf_split_between_its_cr_and_lf_is_one_line_end():
    ev = b"data: " + _event("a", "length") + b"\r"
    assert _ours([ev, b"\n\r", b"\n"])[0] == ["a"]


def test_event_time_is_the_read_that_ended_its_data():
    """A token's time: the read that ended its (last) `data:` line, not the blank line's read."""
    one = b"data: " + _event("a", None) + b"\n"
    first, _, rest = _event("b", "length").partition(b", ")
    reads = [one, b"\n", b"data: " + first + b",\n", b"data: " + rest + b"\n", b"\n",
             b"data: [DONE]\n\n"]
    assert _ours(reads)[1] == [0.0, 3.0]


@pytest.mark.parametrize("tail", [b'data: {"choices":[{"te', b"data: " + _event("b", "length")])
def test_an_event_the_body_ends_inside_is_dropped(tail):
    """Before: a body cut inside an event's JSON read as bad_event (the cut line was parsed), and
    a last event with no blank line after it was counted; the SDK drops it: the stream was cut."""
    reads = [b"data: " + _event("a", None) + b"\n\n", tail]
    assert _sdk_texts(reads) == ["a"]
    with pytest.raises(HttpFailure) as e:
        _ours(reads)
    assert e.value.error_type == "stream_cut"


def _spec_data(body: bytes) -> list[bytes]:
    """The data of each event the WHATWG rules dispatch from a whole stream: one leading BOM
    dropped, CRLF, LF or CR ends a line, `data` lines joined with LF (one space after the
    colon removed), other fields and `:` comments skipped, an event with no data not dispatched."""
    body = body[3:] if body.startswith(b"\xef\xbb\xbf") else body
    out, buf = [], None
    for line in body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")[:-1]:
        if not line:
            if buf is not None:
                out.append(buf)
            buf = None
            continue
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"data":
            buf = value if buf is None else buf + b"\n" + value
    return out


def _texts_of(data: list[bytes]) -> list[str]:
    texts = []
    for d in data:
        if d == b"[DONE]":
            break
        texts.append(json.loads(d)["choices"][0]["text"])
    return texts


LINE = st.sampled_from([b": ping", b"id: 7", b"retry: 1000", b"event: completion", b"data"])
EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "\u00e9"]), st.lists(st.tuples(LINE, EOL),
                                                                     max_size=2), EOL, EOL),
                min_size=1, max_size=3),
       st.booleans(), st.lists(st.integers(0, 10_000), max_size=4))
def test_mixed_line_ends_and_fields_match_the_spec_at_every_split(events, bom, cuts):
    """Each line's end chosen apart (a stream may mix them), other fields and comments around
    the events, a BOM at the start; whole or cut anywhere, the texts are the spec's. Before: one
    read `data: {..}\\r\\rdata: {..}\\n\\n` took the one-event fast path and failed bad_event."""
    body = b"\xef\xbb\xbf" if bom else b""
    for i, (text, extra, eol, blank) in enumerate(events):
        for line, e in extra:
            body += line + e
        if eol == b"\r" and blank == b"\n":  # CR then LF is one line end, not two
            blank = b"\r"
        body += b"data: " + _event(text, "length" if i == len(events) - 1 else None) + eol + blank
    body += b"data: [DONE]\n\n"
    want = _texts_of(_spec_data(body))
    assert want == [text for text, _, _, _ in events]
    assert _ours([body])[0] == want
    assert _ours(_split(body, cuts))[0] == want


@pytest.mark.parametrize("read", [b"data: A\r\rdata: B\n\n", b"data: A\r: ping\n\n"])
def test_one_read_mixing_a_bare_cr_with_lf(read):
    body = read.replace(b"A", _event("a", None)).replace(b"B", _event("b", "length"))
    want = _texts_of(_spec_data(body))
    assert _ours([body, b"data: " + _event("c", "length") + b"\n\n"])[0] == [*want, "c"]
