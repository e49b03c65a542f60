"""What a worker would say on the console is said by the parent, once: its streams' notes
counted over every worker's requests ("output token counts disagree: 10 of 10 requests ..."),
and its other notices (the /tokenize sizing's) once however many workers said them. The
workers ran with the `cbbench` logger at WARNING, so these `log.info("warning: ...")` lines
were dropped: said with one process, nothing with two (and nothing in the JSON)."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI
from helpers import invoke_app

from cbbench.targets.checks import EMPTY_PAST_MAX, StreamNotes

N = 10


@pytest.fixture(scope="module")
def server():
    with FakeOpenAI() as s:  # no /tokenize: a 404
        yield s


def _said(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("cbbench: ")]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_streams_note_is_said_once_over_every_workers_requests(server, tmp_path, workers):
    wl = tmp_path / "w.jsonl"
    # emptypad: empty-text events past max_tokens and no usage, on every request
    wl.write_text("".join(json.dumps({"prompt": f"fault:emptypad p{i}", "output_len": 3}) + "\n"
                          for i in range(N)))
    res = invoke_app(["run", "--endpoint", server.url, "--workload", str(wl), "--num-requests",
                      str(N), "--workers", workers, "--summary-only"])
    assert res.exit_code == 0, res.output
    notes = [line for line in _said(res.output) if "empty-text events" in line]
    assert len(notes) == 1, _said(res.output)
    assert f"output token counts disagree: {N} of {N} requests sent empty-text" in notes[0]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_tokenize_notice_is_said_once(server, tmp_path, workers):
    res = invoke_app(["run", "--endpoint", server.url, "--workload", "random", "--input-len",
                      "20", "--output-len", "3", "--num-requests", str(N), "--workers", workers,
                      "--summary-only"])
    assert res.exit_code == 0, res.output
    sizing = [line for line in _said(res.output) if "did not size prompts" in line]
    assert len(sizing) == 1, _said(res.output)
    assert "/tokenize did not size prompts (HTTP 404)" in sizing[0]


def test_notes_of_two_processes_are_counted_as_one():
    a, b = StreamNotes(), StreamNotes()
    a.counted, b.counted = 5, 5
    a.add(EMPTY_PAST_MAX, lambda: "first")
    a.add(EMPTY_PAST_MAX, lambda: "never asked")
    b.add(EMPTY_PAST_MAX, lambda: "second")
    a.absorb(b)
    (line,) = a.warnings()
    assert "3 of 10 requests" in line and "(first)" in line
