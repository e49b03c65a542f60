"""A request's own ``seed`` reproduces its tokens (seventh review): the noise is keyed by the
seed alone, as vLLM seeds a generator per request from it and OpenAI's API says repeated
requests with the same seed and parameters should return the same result. It was keyed by the
seed and the request's id, and a server's ids are a counter, so `cbbench serve` gave three
different texts to three identical seeded requests. A request without a seed keeps the run's
default seed mixed with its id, so the requests of a run each draw their own tokens (and
`cbbench run --seed` outputs are unchanged)."""

from __future__ import annotations

from runner_harness import Harness, prompt_ids

from cbbench.engine.core.request import Request, SamplingParams

PROMPT_LEN = 6
OUTPUT_LEN = 10
SAMPLED = SamplingParams(temperature=1.0)
SEEDED = SamplingParams(temperature=1.0, seed=42)


def _request(req_id: int, sampling: SamplingParams) -> Request:
    # The same prompt for every request: only the seed and the id can tell them apart.
    return Request(req_id, PROMPT_LEN, OUTPUT_LEN, prompt_token_ids=prompt_ids(0, PROMPT_LEN),
                   sampling=sampling)


def _generate(h: Harness, reqs: list[Request]) -> list[list[int]]:
    """Every request in one batch, prefill then decode to OUTPUT_LEN tokens."""
    h.step([(r, PROMPT_LEN) for r in reqs])
    for _ in range(OUTPUT_LEN - 1):
        h.step([(r, 1) for r in reqs])
    return [list(r.output_token_ids) for r in reqs]


def test_two_requests_with_the_same_seed_in_one_batch_draw_the_same_tokens():
    a, b = _generate(Harness(), [_request(3, SEEDED), _request(1000, SEEDED)])
    assert a == b
    # Alone, under another id and beside an unseeded neighbour: the same again.
    (alone,) = _generate(Harness(), [_request(77, SEEDED)])
    mixed, _ = _generate(Harness(), [_request(5, SEEDED), _request(6, SAMPLED)])
    assert alone == mixed == a
    # Another seed, other tokens.
    (other,) = _generate(Harness(), [_request(3, SamplingParams(temperature=1.0, seed=43))])
    assert other != a


def test_requests_without_a_seed_draw_their_own_tokens():
    a, b = _generate(Harness(), [_request(0, SAMPLED), _request(1, SAMPLED)])
    assert a != b
    # Still a pure function of the default seed and the id: the same id, the same tokens.
    (again,) = _generate(Harness(), [_request(1, SAMPLED)])
    assert again == b


def test_a_negative_seed_is_its_own_seed():
    """vLLM and `cbbench serve` take any int64 seed, and vLLM seeds a generator with it (torch
    maps a negative s to 2**64 - 1 + s: -1 is not 2**63 - 1). Folding to 63 bits made every
    negative seed s the seed s + 2**63, half the accepted seeds another's: `"seed": -1` drew
    the tokens of `"seed": 9223372036854775807` (ninth review)."""
    def tokens(seed: int) -> list[int]:
        (out,) = _generate(Harness(), [_request(0, SamplingParams(temperature=1.0, seed=seed))])
        return out

    assert tokens(-1) != tokens(2**63 - 1)
    assert tokens(-(2**63)) != tokens(0)
    assert tokens(-1) == tokens(-1)
