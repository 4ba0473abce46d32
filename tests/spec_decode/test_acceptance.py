"""The acceptance model behind the goodput controller's choices: with few verdicts it is the
geometric one (1 + a + .. + a^k tokens, a^(k+1) for drafts made ahead to be used); from
verdicts and guesses made ahead it learns how far runs of accepted drafts really reach, which
the geometric model misjudges when drafts agree in runs; a request's own runs take over from
the engine's as its verdicts come."""
import math
import random

import pytest

from vllm.spec_decode.acceptance import (AcceptedRuns, expected_tokens, hazards_of,
                                         tokens_and_hits)


@pytest.mark.parametrize("alphas", [[0.7], [0.2, 0.9], [0.0, 0.3, 0.75, 1.0],
                                    [0.0, 0.1, 0.3, 0.5, 0.75, 0.9, 0.99, 1.0, 0.6]])
def test_without_verdicts_the_runs_are_geometric(alphas):
    """Both the few-request and the numpy path, each request at its own rate."""
    runs = AcceptedRuns(9, 0.98)
    hazards = [runs.hazards([1.0 - a] * 9) for a in alphas]
    odds = tokens_and_hits(hazards, 8)
    assert odds.tokens == pytest.approx([sum(expected_tokens(a, k) for a in alphas)
                                         for k in range(9)])
    assert odds.all_hit == pytest.approx([math.prod(a ** (k + 1) for a in alphas)
                                          for k in range(9)])
    assert odds.hits == pytest.approx([sum(a ** (k + 1) for a in alphas) for k in range(9)])
    # a request drafts are not made ahead for (sampled) is never a hit
    masked = tokens_and_hits(hazards, 8, [False] + [True] * (len(alphas) - 1))
    assert masked.tokens == odds.tokens and masked.all_hit == [0.0] * 9
    assert masked.hits == pytest.approx([sum(a ** (k + 1) for a in alphas[1:])
                                         for k in range(9)])


def test_expected_tokens():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_independent_verdicts_give_flat_hazards():
    rng = random.Random(0)
    runs = AcceptedRuns(5, 0.999)
    for _ in range(3000):
        k = rng.choice([2, 4])
        runs.record(k, next((j for j in range(k) if rng.random() >= 0.7), k))
    hazards = runs.hazards([0.3] * 5)
    assert hazards[:4] == pytest.approx([0.3] * 4, abs=0.04)
    assert hazards[4] == pytest.approx(0.3)  # never reached: the prior (the geometric hazard)


def test_runs_that_come_whole_are_told_from_the_geometric_model():
    """Drafts that are either rejected at once or accepted for good (a boilerplate stretch):
    half the verifications of 8 accept none, half all 8 and the guess made ahead after them.
    The geometric fit (a = accepted / (accepted + rejections) = 0.89) foresees a^9 = 0.35 for
    drafts made ahead at k = 8 to be used and 2.7 tokens at k = 2; the runs, 0.5 and 2.0."""
    runs = AcceptedRuns(9, 0.995)
    for i in range(400):
        whole = i % 2 == 0
        runs.record(8, 8 if whole else 0)
        if whole:
            runs.record_position(9, True)
    a = 8 * 0.5 / (8 * 0.5 + 0.5)
    odds = tokens_and_hits([runs.hazards([1.0 - a] * 9)], 8)
    assert odds.all_hit[8] == pytest.approx(0.5, abs=0.02) and a ** 9 < 0.36
    assert odds.tokens[2] == pytest.approx(2.0, abs=0.03) and expected_tokens(a, 2) > 2.6
    assert odds.all_hit[0] == pytest.approx(0.5, abs=0.02)


def test_a_request_s_own_runs_take_over_from_the_engine_s():
    engine = [0.5, 0.0, 0.0, 0.0, 0.0]  # rejected at once or accepted whole
    request = AcceptedRuns(5, 0.98)
    assert request.hazards(engine) == engine  # no verdicts: the engine's
    for _ in range(30):
        request.record(4, 1)  # always the second draft rejected
    hazards = request.hazards(engine)
    assert hazards[0] < 0.1 and hazards[1] > 0.85 and hazards[2:] == engine[2:]
    assert 2.0 < tokens_and_hits([hazards], 4).tokens[4] < 2.5  # ~2 accepted drafts


def test_old_verdicts_fade():
    runs = AcceptedRuns(3, 0.9)
    for _ in range(200):
        runs.record(2, 2)
    for _ in range(200):
        runs.record(2, 0)
    # ~10 verdicts' weight (1 / (1 - decay)) against the prior's 4 at 0.5
    assert runs.hazards([0.5] * 3)[0] == pytest.approx((10 + 2) / 14, abs=0.01)
    for _ in range(3000):  # many rescalings of the growing weights
        runs.record(2, 2)
    assert runs.hazards([0.5] * 3)[0] == pytest.approx(2 / 14, abs=0.01)


def test_many_requests_stacked_read_as_each_one():
    """hazards_of (one array for a decision over many requests) equals each request's own
    hazards, a request without verdicts reading the prior."""
    rng = random.Random(1)
    runs = []
    for i in range(6):
        r = AcceptedRuns(5, 0.98)
        for _ in range(i * 7):
            k = rng.choice([2, 4])
            r.record(k, rng.randint(0, k))
        runs.append(r if i else None)
    prior = [0.3, 0.2, 0.25, 0.1, 0.4]
    stacked = hazards_of(runs, prior)
    for row, r in zip(stacked.tolist(), runs):
        assert row == pytest.approx(prior if r is None else r.hazards(prior))
    assert tokens_and_hits(stacked, 4).tokens == pytest.approx(
        tokens_and_hits([prior if r is None else r.hazards(prior) for r in runs], 4).tokens)
