"""The rejection sampler is lossless: with drafts drawn from a deliberately different draft
distribution p, the emitted tokens follow the target's distribution q (chi-square on a small
vocabulary), for the first token and for the token after an accepted draft; and a wrong rule
(accepting every draft) fails the same test."""
import math

import torch

from vllm.model_executor.rejection_sampler import RejectionSampler
from vllm.model_executor.sampler import SamplingBatch
from vllm.sampling_params import SamplingParams

VOCAB = 6
CRITICAL_P = 1e-4  # the tests fail when the statistic's p-value is below this


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    expected = probs * n
    stat = ((counts - expected) ** 2 / expected.clamp_min(1e-12)).sum().item()
    dof = (probs > 0).sum().item() - 1
    return torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)).item()


def run(q_logits: torch.Tensor, p: torch.Tensor, num_drafts: int, trials: int, seed: int,
        sampler: RejectionSampler):
    """Emitted sequences for `trials` independent requests, drafts drawn from p."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=1.0)
    outs = []
    for _ in range(trials):
        drafts = torch.multinomial(p[:num_drafts], 1, generator=gen).squeeze(1).tolist()
        batch = SamplingBatch.build([params] * (num_drafts + 1), [[0]] * (num_drafts + 1),
                                    [[]] * (num_drafts + 1), [None] * (num_drafts + 1), VOCAB,
                                    "cpu")
        outs.append(sampler.verify(q_logits[:num_drafts + 1], batch, [drafts],
                                   [p[:num_drafts]], [False], [gen])[0])
    return outs


def setup():
    torch.manual_seed(0)
    q_logits = torch.randn(3, VOCAB) * 1.5  # target, per position
    p = torch.softmax(torch.randn(3, VOCAB) * 1.5, dim=-1)  # a different draft distribution
    return q_logits, p, torch.softmax(q_logits, dim=-1)


def test_first_token_follows_target():
    q_logits, p, q = setup()
    outs = run(q_logits, p, 2, 6000, 1, RejectionSampler())
    counts = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=VOCAB).double()
    assert chi_square_pvalue(counts, q[0].double()) > CRITICAL_P
    # the draft is neither always accepted nor always rejected
    accepted = sum(len(o) > 1 for o in outs)
    assert 0.1 * len(outs) < accepted < 0.95 * len(outs)


def test_second_token_follows_target():
    q_logits, p, q = setup()
    outs = run(q_logits, p, 2, 8000, 2, RejectionSampler())
    # q rows do not depend on context here, so the second emitted token follows q[1]
    second = torch.tensor([o[1] for o in outs if len(o) > 1])
    counts = torch.bincount(second, minlength=VOCAB).double()
    assert chi_square_pvalue(counts, q[1].double()) > CRITICAL_P


def test_the_test_rejects_a_lossy_rule():
    q_logits, p, q = setup()

    class AcceptAll(RejectionSampler):
        @staticmethod
        def _rejection(draft, q, p, generator):  # every draft accepted: lossy
            return torch.ones(len(draft), dtype=torch.bool), q.argmax(dim=-1)

    outs = run(q_logits, p, 2, 6000, 3, AcceptAll())
    counts = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=VOCAB).double()
    assert chi_square_pvalue(counts, q[0].double()) < CRITICAL_P


def test_deterministic_proposal_is_lossless():
    """An n-gram style proposal (p = one-hot of the draft) also keeps the target distribution."""
    q_logits, _, q = setup()
    gen = torch.Generator().manual_seed(4)
    params = SamplingParams(temperature=1.0)
    batch = SamplingBatch.build([params] * 2, [[0]] * 2, [[]] * 2, [None] * 2, VOCAB, "cpu")
    outs = [RejectionSampler().verify(q_logits[:2], batch, [[2]], [None], [False], [gen])[0][0]
            for _ in range(5000)]
    counts = torch.bincount(torch.tensor(outs), minlength=VOCAB).double()
    assert chi_square_pvalue(counts, q[0].double()) > CRITICAL_P


def test_greedy_verification():
    logits = torch.tensor([[0., 5, 0, 0, 0, 0], [0, 0, 5, 0, 0, 0], [0, 0, 0, 5, 0, 0]])
    params = SamplingParams(temperature=0.0)
    batch = SamplingBatch.build([params] * 3, [[0]] * 3, [[]] * 3, [None] * 3, VOCAB, "cpu")
    rs = RejectionSampler()
    assert rs.verify(logits, batch, [[1, 2]], [None], [True], [None]) == [[1, 2, 3]]
    assert rs.verify(logits, batch, [[1, 4]], [None], [True], [None]) == [[1, 2]]
    assert rs.verify(logits, batch, [[0, 2]], [None], [True], [None]) == [[1]]
    assert math.isclose(chi_square_pvalue(torch.tensor([50., 50]), torch.tensor([.5, .5])), 1.0)


def test_top_p_is_applied_to_the_target_distribution():
    """With top_p the emitted tokens follow the target's top-p-filtered distribution."""
    q_logits, p, q = setup()
    gen = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=1.0, top_p=0.7)
    batch = SamplingBatch.build([params] * 2, [[0]] * 2, [[]] * 2, [None] * 2, VOCAB, "cpu")
    outs = []
    for _ in range(6000):
        draft = torch.multinomial(p[0], 1, generator=gen).tolist()
        outs.append(RejectionSampler().verify(q_logits[:2], batch, [draft], [p[:1]], [False],
                                              [gen])[0][0])
    # the expected distribution: q[0] cut to its smallest top set with mass >= 0.7, renormalised
    order = q[0].argsort(descending=True)
    keep = order[:int((q[0][order].cumsum(0) < 0.7).sum()) + 1]
    expected = torch.zeros(VOCAB, dtype=torch.double)
    expected[keep] = q[0][keep].double() / q[0][keep].sum()
    counts = torch.bincount(torch.tensor(outs), minlength=VOCAB).double()
    assert counts[expected == 0].sum() == 0
    assert chi_square_pvalue(counts[expected > 0], expected[expected > 0]) > CRITICAL_P
