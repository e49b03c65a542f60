"""Sampled tokens follow the distribution Hugging Face's logits warpers define (eighth review).

The truth: transformers' TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper, the
order vLLM's sampler applies them (temperature, then top-k, then top-p over the top-k's
renormalized mass). Their rules: top-k keeps every token tied with the k-th largest logit;
top-p keeps a token while the mass strictly above it is below p, so the token that crosses p is
kept, and the top token always. Many draws from hand-built logits (one row per draw, each its
own seed: deterministic) are held to the exact target with a chi-square test, and no token
outside the target's support may ever be drawn; every setting shares one batch, so a row using
another row's parameters would fail too.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
warpers = pytest.importorskip("transformers.generation.logits_process")
stats = pytest.importorskip("scipy.stats")

from cbbench.engine.torch.sampler import Sampler, SamplingBatch  # noqa: E402

LOGITS = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0])
DRAWS = 3000  # per setting; chi-square p-values of a right rule sit far above MIN_P_VALUE
MIN_P_VALUE = 1e-4
# (temperature, top_k, top_p): each warper alone at several values, then combined, where the
# order matters (temperature before top-p changes the nucleus).
SETTINGS = [
    (0.5, 0, 1.0), (1.0, 0, 1.0), (2.0, 0, 1.0),
    (1.0, 1, 1.0), (1.0, 2, 1.0), (1.0, 5, 1.0),
    (1.0, 0, 0.3), (1.0, 0, 0.9), (2.0, 0, 0.5), (0.5, 0, 0.9),
    (2.0, 5, 0.9), (0.5, 2, 0.9), (2.0, 3, 0.6),
]


def hf_target(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    scores = warpers.TemperatureLogitsWarper(float(temperature))(None, logits[None].clone())
    if top_k > 0:
        scores = warpers.TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = warpers.TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores.double(), -1)[0].numpy()


def _draw(logits: torch.Tensor, settings: list[tuple[float, int, float]], n: int,
          first_seed: int = 0) -> np.ndarray:
    """Token counts [len(settings), vocab]: n draws per setting, the settings interleaved in
    one batch (row r has setting r % len(settings)) so neighbours differ in every parameter."""
    rows = [settings[r % len(settings)] for r in range(n * len(settings))]
    batch = SamplingBatch([t for t, _, _ in rows], [k for _, k, _ in rows],
                          [p for _, _, p in rows], list(range(first_seed, first_seed + len(rows))))
    tokens = Sampler().sample(logits.expand(len(rows), -1).contiguous(), batch).numpy()
    setting = np.arange(len(rows)) % len(settings)
    return np.stack([np.bincount(tokens[setting == s], minlength=logits.shape[0])
                     for s in range(len(settings))])


def _assert_follows(counts: np.ndarray, target: np.ndarray, what) -> None:
    support = target > 0
    assert counts[~support].sum() == 0, (what, counts, target)  # a token outside the support
    if support.sum() > 1:
        expected = target[support] / target[support].sum() * counts.sum()
        p_value = stats.chisquare(counts[support], expected).pvalue
        assert p_value > MIN_P_VALUE, (what, counts, np.round(target * counts.sum()))


def test_hf_targets_by_hand():
    """The truth as understood: probabilities [.5, .3, .15, .05]. top_p 0.75 keeps .5 and .3
    (.3 crosses 0.75: kept); top_p 0.45 the top token alone; top_k 2 the two best."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    np.testing.assert_allclose(hf_target(logits, 1.0, 0, 0.75), [.625, .375, 0, 0], atol=1e-6)
    np.testing.assert_allclose(hf_target(logits, 1.0, 0, 0.45), [1, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(hf_target(logits, 1.0, 2, 1.0), [.625, .375, 0, 0], atol=1e-6)
    # Temperature first: at 2 the probabilities flatten to ~[.38, .29, .21, .12], and top_p 0.7
    # then keeps three tokens (top-p first, at temperature 1, would keep two).
    assert (hf_target(logits, 2.0, 0, 0.7) > 0).sum() == 3


def test_sampled_frequencies_follow_hf_warpers_in_one_mixed_batch():
    counts = _draw(LOGITS, SETTINGS, DRAWS)
    for setting, row in zip(SETTINGS, counts, strict=True):
        _assert_follows(row, hf_target(LOGITS, *setting), setting)


# Ties at the k-th logit: bf16 logits (the models' lm_head output) tie often.
TIED = torch.tensor([2.0, 1.0, 1.0, 1.0, 0.0, -1.0])


@pytest.mark.parametrize("top_p", [1.0, 0.999, 0.9])
def test_top_k_keeps_every_token_tied_with_the_kth_with_or_without_top_p(top_p):
    """top_k 2 over logits [2, 1, 1, 1, ...] keeps the three tokens tied at 1 (HF's and vLLM's
    `logits < kth` rule). With a top_p set, the sorted path cut by rank and kept one of them:
    token 0 drew 71% where the truth is 48%."""
    counts = _draw(TIED, [(1.0, 2, top_p)], DRAWS)[0]
    _assert_follows(counts, hf_target(TIED, 1.0, 2, top_p), top_p)


def test_a_rows_tokens_do_not_depend_on_its_neighbours():
    """The same seeds and settings give the same tokens alone and beside rows with other
    settings (a neighbour's top_p sent every row down the sorted path, which cut ties at the
    k-th logit by rank, so a top_k row's tokens changed with its neighbours)."""
    for logits in (LOGITS, TIED):
        n = 200
        alone = Sampler().sample(logits.expand(n, -1).contiguous(),
                                 SamplingBatch([1.0] * n, [2] * n, [1.0] * n, list(range(n))))
        mixed_rows = [(1.0, 2, 1.0, s) for s in range(n)] + [(0.7, 0, 0.5, 99), (0.0, 3, 0.2, 5)]
        order = np.random.default_rng(0).permutation(len(mixed_rows))
        rows = [mixed_rows[i] for i in order]
        mixed = Sampler().sample(logits.expand(len(rows), -1).contiguous(),
                                 SamplingBatch(*(list(col) for col in zip(*rows, strict=True))))
        back = torch.empty(n, dtype=torch.int64)
        for pos, i in enumerate(order):
            if i < n:
                back[i] = mixed[pos]
        assert torch.equal(alone, back)


def test_seeds_same_tokens_different_seeds_different_tokens():
    n = 64
    flat = torch.zeros(2 * n, 50)  # uniform: any two seeds' draws collide by chance rarely
    same = Sampler().sample(flat, SamplingBatch([1.0] * 2 * n, [0] * 2 * n, [1.0] * 2 * n,
                                                list(range(n)) * 2))
    assert torch.equal(same[:n], same[n:])
    other = Sampler().sample(flat[:n], SamplingBatch([1.0] * n, [0] * n, [1.0] * n,
                                                     list(range(1000, 1000 + n))))
    assert (other != same[:n]).float().mean() > 0.8


@pytest.mark.parametrize("setting, same_as", [
    ((1.0, -1, 1.0), (1.0, 0, 1.0)),   # -1 (vLLM's) and 0: top-k off
    ((1.0, 100, 1.0), (1.0, 0, 1.0)),  # above the vocabulary: every token kept
    ((1.0, 0, 1.0), (1.0, 8, 1.0)),    # top-k of the whole vocabulary
])
def test_edge_values_that_turn_a_filter_off(setting, same_as):
    """Off, whatever the neighbours: top_p 0.5 beside them sends every row down the sorted
    path, where a top_p 1.0 row must keep every token too."""
    counts = _draw(LOGITS, [setting, (1.0, 3, 0.5)], DRAWS)[0]
    _assert_follows(counts, hf_target(LOGITS, *same_as), setting)
    assert (counts > 0).all()


def test_top_p_one_keeps_the_whole_tail_beside_a_top_p_row():
    """A top_p 1.0 row in the sorted path (a neighbour has top_p < 1) keeps every token: HF
    skips top_p 1.0, vLLM masks only where the mass at or below a token is <= 1 - p = 0. Its
    mass from the top rounds to 1.0 before the tail, and `mass before >= p` dropped the tail."""
    from cbbench.engine.torch.sampler import _apply_top_k_top_p

    logits = torch.tensor([[0.0] + [-20.0] * 10] * 2)  # the tail: 10 x 2e-9 of the mass
    rows = SamplingBatch([1.0, 1.0], [0, 0], [1.0, 0.5], [0, 1]).to_rows(logits.device)
    kept = torch.isfinite(_apply_top_k_top_p(logits / 1.0, rows, torch.tensor([True, True])))
    assert kept[0].all() and kept[1].sum() == 1


def test_greedy_and_near_greedy_rows():
    """temperature 0 with top_k / top_p set is the argmax; the smallest temperature that samples
    (SAMPLING_EPS) gives finite probabilities and the argmax; -inf logits are never drawn."""
    from cbbench.engine.core.request import SAMPLING_EPS

    logits = torch.tensor([[1.0, 5.0, float("-inf"), 4.0, float("-inf")]] * 4)
    tokens = Sampler().sample(logits, SamplingBatch(
        [0.0, 0.0, SAMPLING_EPS, SAMPLING_EPS], [3, 0, 0, 2], [1.0, 0.2, 1.0, 0.9], [1, 2, 3, 4]))
    assert tokens.tolist() == [1, 1, 1, 1]
    n = 2000
    drawn = _draw(logits[0], [(1.0, 0, 1.0), (2.0, 4, 0.95)], n)
    assert drawn[:, [2, 4]].sum() == 0
    for setting, row in zip([(1.0, 0, 1.0), (2.0, 4, 0.95)], drawn, strict=True):
        _assert_follows(row, hf_target(logits[0], *setting), setting)
