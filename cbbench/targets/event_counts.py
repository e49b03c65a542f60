"""Each stream event's token count and each request's reasoning, tool-call and cached tokens,
from what its stream carried (sse.py), the moment it ends.

Tokens per event, by the best method the stream allows (named on the record):

- ``continuous_usage``: the server put its running ``usage.completion_tokens`` on every chunk
  (vLLM's ``stream_options.continuous_usage_stats``, which the client asks for): an event's
  tokens are the growth of that count since the previous timed event, so tokens of empty-text
  events before it count with it, and any left over at the final usage with the last. Exact.
- ``tokenizer``: ``--tokenizer`` on the event's own text (a generated sequence need not be the
  tokenizer's encoding of its text, so this can be off by a token here and there).
- ``one_per_event``: neither: one token each (the run warns when usage shows more tokens than
  events: then per-token ITL is too long by the tokens-per-event factor).

A text event carries at least one new token, so running counts that do not rise at each text
event are not counts (a server that puts a placeholder usage, zeros, on every chunk and the
real one at the end: taken, every token sat on the last event and ITL came out 8x short); the
request is then counted by the next method, and the run says so.

Reasoning tokens: ``usage.completion_tokens_details.reasoning_tokens`` when the server sends it
(OpenAI's field) and it is no more than the completion tokens, else the tokens of reasoning
events; an event that straddles the reasoning/answer boundary is split by the exact total when
there is one, else by the tokenizer, else in proportion to its text.
"""

from __future__ import annotations

from cbbench.analysis.records import RequestRecord
from cbbench.targets.sse import REASONING, TOOL, SseStream

CONTINUOUS_USAGE = "continuous_usage"
TOKENIZER = "tokenizer"
ONE_PER_EVENT = "one_per_event"
EVENT_COUNT_METHODS = (CONTINUOUS_USAGE, TOKENIZER, ONE_PER_EVENT)


def _usage_int(usage: dict | None, *keys: str) -> int | None:
    v = usage
    for k in keys:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v if type(v) is int and v >= 0 else None


# count_events' notes: what it set aside for the run to say once (checks.StreamNotes).
RUNNING_NOT_RISING = "running_not_rising"
REASONING_ABOVE_COMPLETION = "reasoning_above_completion"


def utf8_safe(text: str) -> str:
    """`text` as the tokenizer takes it: a lone surrogate (JSON's "\\ud800" decodes to one, and
    UTF-8 cannot write it) becomes U+FFFD, and the halves of a pair split across two events
    are one character again."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def encode_texts(tokenizer, texts: list[str]) -> list:
    """tokenizer.encode_batch without special tokens. A text the tokenizer refuses (a lone
    surrogate: TypeError 'TextInputSequence must be str', raised in the request's task) is
    made safe first: on the rare stream that has one, not on every one."""
    try:
        return tokenizer.encode_batch(texts, add_special_tokens=False)
    except TypeError:
        return tokenizer.encode_batch([utf8_safe(t) for t in texts], add_special_tokens=False)


def _continuous_counts(st: SseStream) -> list[int] | None:
    """Each timed event's tokens from the running counts, or None where they did not rise at
    some text event (not counts: see the module doc)."""
    counts, prev = [], 0
    for r in st.running:
        if r is None or r <= prev:  # (every event carried one: event_token_counts checked)
            return None
        counts.append(r - prev)
        prev = r
    total = _usage_int(st.usage, "completion_tokens")
    if total is not None and total > prev:  # tokens of a closing chunk without text
        counts[-1] += total - prev
    return counts


def event_token_counts(st: SseStream, tokenizer) -> tuple[list[int], str, str | None]:
    """Tokens of each timed event, the method, and a note (RUNNING_NOT_RISING) where the
    running counts were there but are not counts."""
    n = len(st.times)
    note = None
    # Exact only when every timed event carried its running count.
    if n and len(st.running) == n and None not in st.running:
        counts = _continuous_counts(st)
        if counts is not None:
            return counts, CONTINUOUS_USAGE, None
        note = RUNNING_NOT_RISING
    if tokenizer is not None and st.pieces is not None and len(st.pieces) == n:
        return [len(e.ids) for e in encode_texts(tokenizer, st.pieces)], TOKENIZER, note
    return [1] * n, ONE_PER_EVENT, note


def _reasoning_per_event(st: SseStream, counts: list[int], tokenizer) -> list[float]:
    """Reasoning tokens of each event (mixed events estimated; see the module doc)."""
    out: list[float] = []
    for i, (kind, k) in enumerate(zip(st.kinds, counts)):
        if kind == REASONING:
            out.append(float(k))
        elif REASONING not in kind.split("+"):
            out.append(0.0)
        elif st.reasoning_pieces is not None and tokenizer is not None:
            r = len(encode_texts(tokenizer, [st.reasoning_pieces[i]])[0].ids)
            out.append(float(min(r, k)))
        elif st.reasoning_pieces is not None and st.pieces is not None and st.pieces[i]:
            # (pieces and reasoning_pieces are kept together: sse.py's keep_text)
            out.append(k * len(st.reasoning_pieces[i]) / len(st.pieces[i]))
        else:
            out.append(k / 2)
    return out


def count_events(rec: RequestRecord, st: SseStream, tokenizer,
                 completion: int | None = None) -> list[str]:
    """Put the stream's per-event and per-kind counts on its record. `completion`: the usage's
    completion tokens where the caller trusts them (checks.count_request). Returns the notes
    (RUNNING_NOT_RISING, REASONING_ABOVE_COMPLETION) for the run to say."""
    counts, method, note = event_token_counts(st, tokenizer)
    notes = [note] if note else []
    rec.event_tokens = counts
    rec.event_tokens_method = method
    rec.cached_tokens = _usage_int(st.usage, "prompt_tokens_details", "cached_tokens")
    exact = _usage_int(st.usage, "completion_tokens_details", "reasoning_tokens")
    if exact is not None and completion is not None and exact > completion:
        # Reasoning tokens are some of the completion tokens: more of them cannot be right
        # (800 over 8 output tokens was the run's reasoning figure). The stream's count it is.
        notes.append(REASONING_ABOVE_COMPLETION)
        exact = None
    # It runs as each request ends, in the run's event loop: a stream without reasoning (most,
    # and every /v1/completions one) skips the per-event walks. Its distinct kinds are few.
    seen = any(REASONING in kind for kind in set(st.kinds))
    if seen:
        reasoning = _reasoning_per_event(st, counts, tokenizer)
        mixed = [i for i, kind in enumerate(st.kinds) if "+" in kind and REASONING in kind]
        if exact is not None and len(mixed) == 1:  # the boundary event holds what is left
            pure = sum(r for i, r in enumerate(reasoning) if i != mixed[0])
            reasoning[mixed[0]] = float(min(max(exact - pure, 0), counts[mixed[0]]))
        first = next((i for i, kind in enumerate(st.kinds) if kind != REASONING), None)
    else:
        reasoning = [0.0] * len(counts)
        first = 0 if st.kinds else None
    if exact is not None:
        rec.reasoning_tokens = exact
    elif seen or st.chat:
        rec.reasoning_tokens = round(sum(reasoning))
    rec.first_output_s = st.times[first] if first is not None else None
    if st.tool_calls:
        rec.tool_calls = _tool_calls(st, counts, reasoning)
    return notes


def _tool_calls(st: SseStream, counts: list[int], reasoning: list[float]) -> list[dict]:
    """Each call's id, name and argument tokens (the non-reasoning tokens of the events that
    carried its text, shared evenly between the calls of one event)."""
    per_event: dict[int, int] = {}
    for call in st.tool_calls.values():
        for i in call.event_idx:
            per_event[i] = per_event.get(i, 0) + 1
    out = []
    for idx in sorted(st.tool_calls):
        call = st.tool_calls[idx]
        tokens = 0.0
        for i in call.event_idx:
            if i < len(counts) and TOOL in st.kinds[i]:
                tokens += (counts[i] - reasoning[i]) / per_event[i]
        out.append({"id": call.id, "name": call.name, "argument_tokens": round(tokens)})
    return out
