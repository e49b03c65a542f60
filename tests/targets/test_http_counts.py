"""Token counts with their source, and short outputs, against the fake server playing the
servers that send no usage, several tokens per event, empty-text events, or ignore ignore_eos
(issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fake_openai import (
    EOS_AFTER,
    endpoint_options,
    make_tiny_tokenizer,
    prompt_requests,
)

from cbbench.analysis.summary.metrics import summarize
from cbbench.targets.http import run_http

LLAMA3_CONFIG = (
    Path(__file__).resolve().parents[3] / "shared" / "tokenizers" / "llama-3.1"
    / "tokenizer_config.json"
)


LOAD_DEPENDENT = ("fell behind", "event loop")  # a loaded machine may add these lines


def _ours(notes: list[str]) -> list[str]:
    """The warnings about counts: what a busy machine adds about the client is left out."""
    return [n for n in notes if not any(w in n for w in LOAD_DEPENDENT)]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> str:
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_server_ignoring_ignore_eos_is_counted_and_warned(fresh_fake_server, notices):
    # 6 requests for 8 tokens; the 4 "eos" ones come back with EOS_AFTER, finish_reason stop.
    prompts = ["fault:eos x"] * 4 + ["x"] * 2
    notes = notices  # the logged notices (conftest)
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests(prompts, output_len=8), np.zeros(6))
    assert all(r.ok for r in run.records) and all(r.max_tokens == 8 for r in run.records)
    assert [r.output_tokens for r in run.records] == [EOS_AFTER] * 4 + [8, 8]
    assert [r.finish_reason for r in run.records] == ["stop"] * 4 + ["length"] * 2
    short = summarize(run.records, run.duration_s)["short_outputs"]
    assert (short["count"], short["checked"], short["finish_reason_stop"]) == (4, 6, 4)
    assert short["share"] == pytest.approx(4 / 6)
    assert short["mean_shortfall"] == pytest.approx(8 - EOS_AFTER)
    warned = [n for n in notes if "max_tokens" in n]
    assert len(warned) == 1 and "ignore_eos" in warned[0] and "--no-ignore-eos-field" in warned[0]
    assert "4 of 6" in warned[0]

    # A full-length run: short_outputs is 0 and nothing is said.
    notes.clear()
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests(["x"] * 3, output_len=5), np.zeros(3))
    assert summarize(run.records, run.duration_s)["short_outputs"]["count"] == 0
    assert _ours(notes) == []


def test_no_usage_names_the_method_and_warns_when_counts_disagree(fresh_fake_server, tiny_tokenizer, notices):
    # glued: one token per event, no usage; the streamed text re-tokenizes to 1 token ("aaaa"
    # is one unknown word). Events are detected as single tokens (each event's text alone is one
    # token), so events are the count, and the tokenizer's disagreement is reported.
    notes = notices  # the logged notices (conftest)
    opts = endpoint_options(fresh_fake_server.url, tokenizer=tiny_tokenizer)
    run = run_http(opts, prompt_requests(["fault:glued x"] * 4, output_len=4), np.zeros(4))
    for r in run.records:
        assert r.output_tokens_method == "events" and r.output_tokens == 4
        # one_token_events: this request's events that are one token each, tokenized alone
        assert r.output_token_counts == {"events": 4, "tokenizer": 1, "one_token_events": 4}
    counts = run.info["token_counts"]
    assert counts["output_method"] == {"events": 4}
    assert counts["one_token_per_event"]["detected"] is True
    assert counts["one_token_per_event"]["basis"] == "tokenizer"
    assert counts["disagreement"]["tokenizer_vs_events"]["disagree"] == 4
    assert counts["prompt_method"] == {"workload": 4}
    warned = [n for n in notes if "disagree" in n]
    assert len(warned) == 1 and "tokenizer vs events differ on 4 of 4" in warned[0]

    # pairs: two tokens per event, no usage: the tokenizer is the count, and it disagrees too.
    notes.clear()
    run = run_http(opts, prompt_requests(["fault:pairs x"] * 2, output_len=3), np.zeros(2))
    assert [(r.output_tokens_method, r.output_tokens) for r in run.records] == [("tokenizer", 6)] * 2
    counts = run.info["token_counts"]
    assert counts["one_token_per_event"]["detected"] is False
    assert counts["disagreement"]["tokenizer_vs_events"]["disagree"] == 2  # kept in the summary
    # ... but not warned: the events are known not to be tokens (the detection says so), so
    # their differing from the tokenizer is no disagreement between two token counts.
    assert not [n for n in notes if "disagree" in n], notes

    # No usage and no tokenizer: events, flagged as unverified.
    notes.clear()
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests(["fault:nousage x"] * 2), np.zeros(2))
    assert [r.output_tokens_method for r in run.records] == ["events"] * 2
    assert any("--tokenizer" in n and "stream events" in n for n in notes)

    # With usage, it is the count; the events agree, which shows one token per event.
    notes.clear()
    run = run_http(opts, prompt_requests(["x"] * 3, output_len=4), np.zeros(3))
    assert [r.output_tokens_method for r in run.records] == ["usage"] * 3
    assert run.records[0].output_token_counts == {
        "events": 4, "usage": 4, "tokenizer": 4, "one_token_events": 4,
    }
    assert run.info["token_counts"]["one_token_per_event"] == {
        "detected": True, "basis": "usage", "share": 1.0, "checked": 3,
    }
    assert _ours(notes) == []


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_empty_text_events_are_tokens_but_not_token_times(fresh_fake_server, api, notices):
    # 6 tokens, of which 3 have empty text, then an empty closing chunk with the finish reason.
    notes = notices  # the logged notices (conftest)
    run = run_http(endpoint_options(fresh_fake_server.url, api=api), prompt_requests(["fault:emptytok x"] * 2, output_len=6),
                   np.zeros(2))
    for r in run.records:
        assert r.ok and r.output_tokens == 6 and r.output_tokens_method == "events"
        assert len(r.token_times_s) == 3 and r.finish_reason == "length"
    assert summarize(run.records, run.duration_s)["short_outputs"]["count"] == 0
    assert not [n for n in notes if "max_tokens" in n]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_empty_events_past_max_tokens_are_not_tokens(fresh_fake_server, api, notices):
    """A server that follows each of its 6 tokens with an empty-text chunk and sends no usage:
    6 text and 5 empty events. Counted as tokens they gave 11 output tokens for max_tokens 6
    (throughput about twice, TPOT about half the truth) with no word; a count past the
    max_tokens the request sent cannot be right, so the empty events are not counted there,
    and the run says so once. The split-character case (emptytok: 3 text and 3 empty events
    for max_tokens 6) still counts its empty events (the test above)."""
    notes = notices  # the logged notices (conftest)
    prompts = ["fault:emptypad x"] * 3 + ["fault:emptytok x"]
    run = run_http(endpoint_options(fresh_fake_server.url, api=api),
                   prompt_requests(prompts, output_len=6), np.zeros(4))
    for r in run.records:
        assert r.ok and r.output_tokens == 6 and r.output_tokens_method == "events", r
    assert [len(r.token_times_s) for r in run.records] == [6, 6, 6, 3]
    s = summarize(run.records, run.duration_s)
    assert s["total_output_tokens"] == 24  # was 3 * 11 + 6 = 39
    assert s["short_outputs"]["count"] == 0
    warned = [n for n in notes if "empty-text events" in n]
    assert len(warned) == 1, notes
    assert "3 of 4 requests" in warned[0] and "6 text and 5 empty events for max_tokens 6" \
        in warned[0]


def test_no_output_at_all_says_why(fresh_fake_server):
    run = run_http(endpoint_options(fresh_fake_server.url), prompt_requests(["fault:eosfirst x"]), [0.0])
    rec = run.records[0]
    assert rec.error_type == "bad_event" and "finish_reason 'stop'" in rec.error


def test_short_counts_at_finish_length_are_called_a_counting_problem():
    from cbbench.analysis.records import RequestRecord
    from cbbench.analysis.summary.token_counts import short_output_figures, short_output_warning

    def rec(out: int, finish: str) -> RequestRecord:
        return RequestRecord(0, 5, out, 0.0, token_times_s=[0.1, 0.2], max_tokens=10,
                             finish_reason=finish)

    so = short_output_figures([rec(9, "length"), rec(10, "length")])
    assert (so.count, so.finish_reason_length, so.finish_reason_stop) == (1, 1, 0)
    line = short_output_warning(so, ignore_eos_sent=True)
    assert "counted shorter" in line and "ignore_eos" not in line
    so = short_output_figures([rec(4, "stop"), rec(10, "length")])
    assert "ignore_eos" in short_output_warning(so, ignore_eos_sent=True)
    assert "--no-ignore-eos-field" in short_output_warning(so, ignore_eos_sent=False)
    assert short_output_warning(short_output_figures([rec(10, "length")] * 3), True) is None


def test_chat_prompt_tokens_from_the_tokenizers_chat_template(fresh_fake_server, tmp_path, notices):
    # A tokenizer_config.json beside the tokenizer, with a template that puts BOS and two
    # words around the message: 2 tokens on top of the workload's count (which has the BOS).
    tok = make_tiny_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>",
        "chat_template": "{{ bos_token }} user: {{ messages[0]['content'] }}"
                         "{% if add_generation_prompt %} assistant:{% endif %}",
    }))
    notes = notices  # the logged notices (conftest)
    run = run_http(endpoint_options(fresh_fake_server.url, api="chat", tokenizer=tok),
                   prompt_requests(["fault:nousage x"] * 3), np.zeros(3))
    assert [r.prompt_token_counts for r in run.records] == [{"chat_template": 5}] * 3
    counts = run.info["token_counts"]
    assert counts["prompt_method"] == {"chat_template": 3}
    assert counts["chat_template_tokens_added_mean"] == 2
    assert not [n for n in notes if "chat template" in n]


@pytest.mark.skipif(not LLAMA3_CONFIG.exists(), reason="no Llama-3.1 tokenizer in shared/")
def test_llama3_chat_template_adds_nine_tokens():
    # What llama.cpp's server added per request in issue 20 (usage there: 9).
    from cbbench.load.chat_template import chat_prompt_tokens
    from cbbench.load.prompts import load_tokenizer

    path = str(LLAMA3_CONFIG.with_name("tokenizer.json"))
    tok = load_tokenizer(path)
    prompt = "The quick brown fox jumps over the lazy dog"
    plain = len(tok.encode(prompt).ids)  # with the BOS, as the workload counts it
    assert chat_prompt_tokens(path, tok, [prompt, [1, 2]]) == [plain + 9, None]


def test_chat_without_usage_warns_about_template_tokens(fresh_fake_server, notices):
    notes = notices  # the logged notices (conftest)
    run_http(endpoint_options(fresh_fake_server.url, api="chat"), prompt_requests(["fault:nousage x"]), [0.0])
    assert any("chat template" in n for n in notes)


def test_token_count_fallbacks(fresh_fake_server, tiny_tokenizer):
    wreqs = prompt_requests(["fault:nousage", "fault:pairs"], output_len=3)
    run = run_http(endpoint_options(fresh_fake_server.url), wreqs, [0.0, 0.0])
    assert [r.output_tokens for r in run.records] == [3, 3]  # events
    assert run.info["token_count_method"] == {"events": 2}
    run = run_http(endpoint_options(fresh_fake_server.url, tokenizer=tiny_tokenizer), wreqs, [0.0, 0.0])
    assert [r.output_tokens for r in run.records] == [3, 6]  # " a b" per event is 2 tokens
    assert run.info["token_count_method"] == {"tokenizer": 2}


# ---- issue 37, rule 7: a --tokenizer folder's chat template renders in a bounded sandbox -------
@pytest.mark.parametrize("template", [
    "{{ 1/0 }}",  # ZeroDivisionError: a traceback
    "{{ messages + 1 }}",  # TypeError
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",  # RecursionError
    # Nested loops of 10^5 x 10^5 (the sandbox caps each range, not their product): a hang.
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    "{{ 'a' * 10**9 }}",  # a 1 GB string
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",  # 100 MB of output
])
def test_a_hostile_chat_template_costs_its_count_not_the_run(tmp_path, template):
    import time

    from cbbench.load.chat_template import RENDER_TIME_LIMIT_S, chat_prompt_tokens

    tok = make_tiny_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    t = time.monotonic()
    counts = chat_prompt_tokens(str(tmp_path / "tokenizer.json"), tok, ["hello world"] * 2)
    assert counts == [None, None]
    # Two renders, each within its limit (wall time on a loaded machine: a generous bound).
    assert time.monotonic() - t < 2 * RENDER_TIME_LIMIT_S + 20


def test_events_known_to_carry_several_tokens_are_no_disagreement_with_usage():
    # serve --stream-interval 4, run --save-detailed: usage 30 over 9 events on every request.
    # "output token counts disagree: events vs usage differ on 24 of 24 requests" though the
    # detection had found several tokens per event and the run counted usage (right).
    from cbbench.analysis.records import RequestRecord
    from cbbench.analysis.summary.token_counts import one_token_per_event, output_count_summary

    def rec(i: int, counts: dict) -> RequestRecord:
        r = RequestRecord(i, 64, counts["usage"], 0.0, token_times_s=[0.1 * k for k in range(9)])
        r.output_token_counts, r.output_tokens_method = counts, "usage"
        return r

    several = [rec(i, {"events": 9, "usage": 30}) for i in range(24)]
    detection = one_token_per_event(several)
    assert detection["detected"] is False and detection["basis"] == "usage"
    summary, warnings = output_count_summary(several, detection)
    assert summary["disagreement"]["events_vs_usage"]["disagree"] == 24  # the figures stay
    assert warnings == []
    # Two token counts that differ are still a disagreement, events or not (the case the
    # warning is for, as test_no_usage_names_the_method_and_warns_when_counts_disagree's
    # tokenizer against one-token events): here the tokenizer against usage.
    retokenized = [rec(i, {"events": 9, "usage": 30, "tokenizer": 27}) for i in range(24)]
    summary, warnings = output_count_summary(retokenized, one_token_per_event(retokenized))
    assert len(warnings) == 1 and "tokenizer vs usage differ on 24 of 24" in warnings[0]
