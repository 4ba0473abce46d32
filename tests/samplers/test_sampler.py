"""The sampler against hand computations: penalties to the bit, the exact token sets the filters
keep, chi-square tests of the drawn distributions (and proof that the test can fail), seeded rows
independent of their batch, the min_tokens ban, and logprobs of the raw logits."""
import math

import pytest
import torch

from tests.utils import DEVICES
from vllm.model_executor.sampler import (Sampler, SamplingBatch, compute_prompt_logprobs,
                                         nonfinite_logit_rows, nonfinite_prob_rows)
from vllm.sampling_params import SamplingParams


def build(params, vocab_size, prompts=None, outputs=None, generators=None, device="cpu",
          eos_token_id=None):
    n = len(params)
    return SamplingBatch.build(params, prompts or [[] for _ in range(n)],
                               outputs or [[] for _ in range(n)], generators or [None] * n,
                               vocab_size, device, eos_token_id=eos_token_id)


def kept(probs_row: torch.Tensor) -> set:
    return set(torch.nonzero(probs_row > 0).flatten().tolist())


# ---------------------------------------------------------------- greedy


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_is_argmax(device):
    logits = torch.randn(16, 300, device=device)
    batch = build([SamplingParams(temperature=0.0)] * 16, 300, device=device)
    assert batch.all_greedy
    out = Sampler().sample(logits, batch)
    assert torch.equal(out.sampled_token_ids, logits.argmax(dim=-1))
    assert out.sampled_token_ids.dtype == torch.long and out.logprobs is None


def test_greedy_rows_of_a_mixed_batch_are_argmax():
    logits = torch.randn(10, 50)
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.5, top_k=3) for i in range(10)]
    out = Sampler().sample(logits, build(params, 50))
    assert torch.equal(out.sampled_token_ids[1::2], logits[1::2].argmax(dim=-1))
    # the random rows are confined to their top 3
    top3 = logits[0::2].topk(3, dim=-1).indices
    assert (top3 == out.sampled_token_ids[0::2, None]).any(dim=-1).all()


def test_all_greedy_draws_nothing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("an all-greedy batch must not sample")

    monkeypatch.setattr(Sampler, "sample_from_probs", staticmethod(boom))
    monkeypatch.setattr(Sampler, "probs_from_penalised", staticmethod(boom))
    Sampler().sample(torch.randn(3, 20), build([SamplingParams(temperature=0.0)] * 3, 20))


# ---------------------------------------------------------------- penalties

# logits of a 6-token vocabulary; prompt [0, 1], output [2, 2, 3]: token 0 and 1 only in the
# prompt, 2 twice and 3 once in the output, 4 and 5 never seen. Dyadic values: exact in fp32.
PENALTY_LOGITS = [2.0, -1.0, 0.5, -0.5, 3.0, 0.0]
PENALTY_CASES = {
    # repetition divides positive and multiplies negative logits of seen (prompt or output) tokens
    "repetition": ({"repetition_penalty": 2.0}, [1.0, -2.0, 0.25, -1.0, 3.0, 0.0]),
    "repetition_below_1": ({"repetition_penalty": 0.5}, [4.0, -0.5, 1.0, -0.25, 3.0, 0.0]),
    # frequency: minus penalty * count in the output (prompt tokens untouched)
    "frequency": ({"frequency_penalty": 0.5}, [2.0, -1.0, -0.5, -1.0, 3.0, 0.0]),
    # presence: minus penalty once per token present in the output
    "presence": ({"presence_penalty": 0.25}, [2.0, -1.0, 0.25, -0.75, 3.0, 0.0]),
    "negative_presence": ({"presence_penalty": -1.0}, [2.0, -1.0, 1.5, 0.5, 3.0, 0.0]),
    # repetition, then frequency, then presence
    "all": ({"repetition_penalty": 2.0, "frequency_penalty": 0.5, "presence_penalty": 0.25},
            [1.0, -2.0, -1.0, -1.75, 3.0, 0.0]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(PENALTY_CASES))
def test_penalties_match_hand_computation(case, device):
    kwargs, expected = PENALTY_CASES[case]
    logits = torch.tensor([PENALTY_LOGITS, PENALTY_LOGITS], device=device)
    before = logits.clone()
    # row 1 has the same history but no penalties: it must come out untouched
    batch = build([SamplingParams(**kwargs), SamplingParams()], 6, prompts=[[0, 1], [0, 1]],
                  outputs=[[2, 2, 3], [2, 2, 3]], device=device)
    out = Sampler.apply_penalties(logits, batch)
    torch.testing.assert_close(out.cpu(), torch.tensor([expected, PENALTY_LOGITS]),
                               rtol=0, atol=0)
    assert torch.equal(logits, before), "apply_penalties must not modify its input"


def test_greedy_argmax_uses_penalised_logits():
    # token 4 leads, but it was generated 3 times: frequency 0.5 * 3 drops it below token 0
    logits = torch.tensor([PENALTY_LOGITS])
    batch = build([SamplingParams(temperature=0.0, frequency_penalty=0.5)], 6,
                  outputs=[[4, 4, 4]])
    assert Sampler().sample(logits, batch).sampled_token_ids.tolist() == [0]


def test_no_penalties_builds_no_count_tensors():
    batch = build([SamplingParams(temperature=0.5), SamplingParams()], 6, prompts=[[1], [2]],
                  outputs=[[3], [4]])
    assert batch.no_penalties and batch.output_token_counts is None
    assert batch.prompt_token_mask is None
    logits = torch.randn(2, 6)
    assert Sampler.apply_penalties(logits, batch) is logits
    # frequency alone needs counts but no prompt mask
    batch = build([SamplingParams(frequency_penalty=1.0)], 6, prompts=[[1]], outputs=[[3, 3]])
    assert batch.output_token_counts.tolist() == [[0, 0, 0, 2, 0, 0]]
    assert batch.prompt_token_mask is None and batch.repetition_penalties is None


# ---------------------------------------------------------------- filters


def logits_of(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


# name: (distribution, params, tokens kept). Ties at a cutoff are all kept or all dropped.
FILTER_CASES = {
    "top_k_2": ([0.1, 0.4, 0.2, 0.3], {"top_k": 2}, {1, 3}),
    "top_k_1": ([0.1, 0.4, 0.2, 0.3], {"top_k": 1}, {1}),
    "top_k_tie_at_cutoff_keeps_all_tied": ([0.3, 0.3, 0.2, 0.2], {"top_k": 3}, {0, 1, 2, 3}),
    "top_k_2_before_tie": ([0.3, 0.3, 0.2, 0.2], {"top_k": 2}, {0, 1}),
    "top_k_vocab_is_off": ([0.1, 0.4, 0.2, 0.3], {"top_k": 4}, {0, 1, 2, 3}),
    "top_k_above_vocab_is_off": ([0.1, 0.4, 0.2, 0.3], {"top_k": 50}, {0, 1, 2, 3}),
    "top_k_0_is_off": ([0.1, 0.4, 0.2, 0.3], {"top_k": 0}, {0, 1, 2, 3}),
    "top_p_0.5": ([0.1, 0.4, 0.2, 0.3], {"top_p": 0.5}, {1, 3}),
    # 0.4 + 0.3 reaches 0.7 exactly: the 0.2 token is not needed
    "top_p_mass_reached_exactly": ([0.1, 0.4, 0.2, 0.3], {"top_p": 0.7}, {1, 3}),
    # fp32 softmax + cumsum land a hair under 0.81 = 0.49 + 0.32: the slack counts it reached
    "top_p_mass_reached_after_rounding": ([0.49, 0.32, 0.19], {"top_p": 0.81}, {0, 1}),
    "top_p_mass_reached_after_rounding_7": ([0.01, 0.26, 0.12, 0.2, 0.06, 0.13, 0.22],
                                            {"top_p": 0.81}, {1, 3, 5, 6}),
    "top_p_0.71": ([0.1, 0.4, 0.2, 0.3], {"top_p": 0.71}, {1, 2, 3}),
    "top_p_dyadic_exact": ([0.5, 0.25, 0.125, 0.125], {"top_p": 0.75}, {0, 1}),
    "top_p_tie_past_boundary": ([0.5, 0.25, 0.125, 0.125], {"top_p": 0.76}, {0, 1, 2, 3}),
    "top_p_tie_at_boundary": ([0.3, 0.4, 0.3], {"top_p": 0.5}, {0, 1, 2}),
    "top_p_four_tied": ([0.1, 0.2, 0.2, 0.1, 0.2, 0.2], {"top_p": 0.5}, {1, 2, 4, 5}),
    "top_p_keeps_one": ([0.2, 0.7, 0.1], {"top_p": 0.1}, {1}),
    "top_p_tiny_keeps_one": ([0.2, 0.7, 0.1], {"top_p": 1e-9}, {1}),
    "top_p_1_is_off": ([0.2, 0.7, 0.1], {"top_p": 1.0}, {0, 1, 2}),
    "min_p_0.45": ([0.1, 0.4, 0.2, 0.3], {"min_p": 0.45}, {1, 2, 3}),
    "min_p_0.6": ([0.1, 0.4, 0.2, 0.3], {"min_p": 0.6}, {1, 3}),
    "min_p_1": ([0.1, 0.4, 0.2, 0.3], {"min_p": 1.0}, {1}),
    # top_p acts on what top_k / min_p left, renormalised: {0,1,2} -> .59 .24 .18 -> {0,1}
    # (top_p on the raw distribution would keep {0,1,2})
    "top_k_then_top_p": ([0.5, 0.2, 0.15, 0.1, 0.05], {"top_k": 3, "top_p": 0.8}, {0, 1}),
    "min_p_then_top_p": ([0.5, 0.2, 0.15, 0.1, 0.05], {"min_p": 0.25, "top_p": 0.8}, {0, 1}),
    "min_p_and_top_k": ([0.5, 0.2, 0.15, 0.1, 0.05], {"min_p": 0.25, "top_k": 2}, {0, 1}),
    "top_k_and_min_p": ([0.5, 0.2, 0.15, 0.1, 0.05], {"min_p": 0.35, "top_k": 4}, {0, 1}),
}


@pytest.mark.parametrize("case", list(FILTER_CASES))
def test_filters_keep_expected_tokens(case):
    dist, kwargs, expected = FILTER_CASES[case]
    logits = logits_of([dist, dist])
    # row 1: same logits, no filter, so the batch runs the filter path with a neutral row
    probs = Sampler.compute_probs(logits, build([SamplingParams(**kwargs), SamplingParams()],
                                                len(dist)))
    assert kept(probs[0]) == expected
    truth = torch.tensor(dist)
    mask = torch.zeros(len(dist), dtype=torch.bool)
    mask[list(expected)] = True
    torch.testing.assert_close(probs[0], torch.where(mask, truth, 0.0) / truth[mask].sum())
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], dim=-1), rtol=0, atol=0)


def test_top_p_1_row_keeps_its_tail_beside_a_top_p_row():
    # the tail token's mass ahead is 1 - 2e-9: within top_p's slack of 1.0, yet top_p=1 is off
    logits = torch.tensor([[0.0, 0.0, -20.0], [0.0, 0.0, -20.0]])
    probs = Sampler.compute_probs(logits, build([SamplingParams(top_p=0.5),
                                                 SamplingParams(top_p=1.0)], 3))
    assert kept(probs[0]) == {0, 1} and kept(probs[1]) == {0, 1, 2}


def test_top_p_set_does_not_depend_on_token_order():
    dist = torch.tensor([0.1, 0.2, 0.2, 0.1, 0.2, 0.2])
    perms = [torch.randperm(6) for _ in range(8)]
    logits = torch.stack([dist[p] for p in perms]).log()
    probs = Sampler.compute_probs(logits, build([SamplingParams(top_p=0.5)] * 8, 6))
    for p, row in zip(perms, probs):
        assert kept(row) == {int(torch.nonzero(p == t)) for t in (1, 2, 4, 5)}


def test_unfiltered_rows_are_bit_identical_beside_filtered_rows():
    # a seeded row's draw must not depend on its neighbours, down to the last bit of its probs
    logits = torch.randn(19, 64)
    plain = [SamplingParams(temperature=0.9)] * 16
    alone = Sampler.compute_probs(logits[:16], build(plain, 64))
    neighbours = [SamplingParams(top_p=0.3), SamplingParams(top_k=4), SamplingParams(min_p=0.2)]
    mixed = Sampler.compute_probs(logits, build(plain + neighbours, 64))
    assert torch.equal(mixed[:16], alone)
    for row in range(16, 19):
        assert len(kept(mixed[row])) < 64


def test_top_k_only_path_sorts_nothing(monkeypatch):
    logits = torch.randn(4, 30)
    params = [SamplingParams(top_k=3), SamplingParams(top_k=7), SamplingParams(),
              SamplingParams(temperature=0.0)]
    batch = build(params, 30)
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "sort", lambda *a, **k: pytest.fail("top_k alone must not sort"))
        probs = Sampler.compute_probs(logits, batch)
    assert [len(kept(r)) for r in probs] == [3, 7, 30, 30]
    for row, k in ((0, 3), (1, 7)):
        assert kept(probs[row]) == set(logits[row].topk(k).indices.tolist())


def test_no_filters_sorts_nothing(monkeypatch):
    batch = build([SamplingParams(temperature=0.8), SamplingParams(top_k=100)], 30)
    assert batch.top_k is None and batch.top_p is None and batch.min_p is None
    logits = torch.randn(2, 30)
    monkeypatch.setattr(torch.Tensor, "sort", lambda *a, **k: pytest.fail("sorted"))
    monkeypatch.setattr(torch.Tensor, "topk", lambda *a, **k: pytest.fail("topk"))
    probs = Sampler.compute_probs(logits, batch)
    torch.testing.assert_close(probs[0], torch.softmax(logits[0] / 0.8, dim=-1))
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], dim=-1))


def test_temperature_scales_and_greedy_rows_get_temperature_1():
    logits = torch.randn(2, 12)
    probs = Sampler.compute_probs(logits, build([SamplingParams(temperature=0.5),
                                                 SamplingParams(temperature=0.0)], 12))
    torch.testing.assert_close(probs[0], torch.softmax(logits[0] * 2.0, dim=-1))
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], dim=-1))


# ---------------------------------------------------------------- drawn distributions

CHI_LOGITS = [1.2, -0.3, 2.0, 0.4, 0.9, -1.0, 1.6, 0.0, -0.6, 0.7]
NUM_DRAWS = 20_000


def reference_distribution(logits, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0):
    """The intended distribution in float64 by the definitions, independent of the sampler."""
    z = [v / temperature for v in logits]
    weights = [math.exp(v - max(z)) for v in z]
    p = [w / sum(weights) for w in weights]

    def renorm(q):
        return [v / sum(q) for v in q]

    if min_p > 0:
        p = renorm([v if v >= min_p * max(p) else 0.0 for v in p])
    if top_k > 0:
        kth = sorted(p, reverse=True)[min(top_k, len(p)) - 1]
        p = renorm([v if v >= kth else 0.0 for v in p])
    if top_p < 1:
        mass, needed = 0.0, []
        for v in sorted(p, reverse=True):
            if mass >= top_p:
                break
            needed.append(v)
            mass += v
        p = renorm([v if v >= min(needed) else 0.0 for v in p])
    return p


def chi_square_p_value(counts: torch.Tensor, expected: list) -> float:
    """Pearson's test of counts against a distribution; 0.0 if a zero-probability token showed."""
    probs = torch.tensor(expected, dtype=torch.float64)
    counts = counts.double().cpu()
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    want = probs[support] * counts.sum()
    stat = ((counts[support] - want) ** 2 / want).sum()
    dof = torch.tensor(float(support.sum() - 1), dtype=torch.float64)
    return torch.special.gammaincc(dof / 2, stat / 2).item()


def draw(params, device="cpu", generators=None):
    logits = torch.tensor([CHI_LOGITS], device=device).expand(NUM_DRAWS, -1)
    batch = build([params] * NUM_DRAWS, len(CHI_LOGITS), generators=generators, device=device)
    tokens = Sampler().sample(logits, batch).sampled_token_ids
    return torch.bincount(tokens.cpu(), minlength=len(CHI_LOGITS))


CHI_CASES = {
    "temperature_0.7": {"temperature": 0.7},
    "top_k_5": {"top_k": 5},
    "top_p_0.6": {"top_p": 0.6},
    "min_p_0.2": {"min_p": 0.2},
    "temperature_0.7_top_p_0.8_top_k_5": {"temperature": 0.7, "top_p": 0.8, "top_k": 5},
}


@pytest.mark.parametrize("case", list(CHI_CASES))
def test_draws_match_intended_distribution(case):
    kwargs = CHI_CASES[case]
    counts = draw(SamplingParams(**kwargs))
    assert chi_square_p_value(counts, reference_distribution(CHI_LOGITS, **kwargs)) > 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seeded", [False, True], ids=["default_generator", "own_generator"])
def test_combined_filters_distribution_and_wrong_ones_fail(device, seeded):
    kwargs = CHI_CASES["temperature_0.7_top_p_0.8_top_k_5"]
    # own_generator: every row draws from one shared generator, one row after another
    generators = [torch.Generator(device=device).manual_seed(7)] * NUM_DRAWS if seeded else None
    counts = draw(SamplingParams(**kwargs), device, generators)
    right = reference_distribution(CHI_LOGITS, **kwargs)
    assert chi_square_p_value(counts, right) > 1e-4
    # the same test rejects near misses: the filters at temperature 1, no top_p, two tokens'
    # probabilities swapped, and a 5% shift of mass between two tokens
    at_t1 = reference_distribution(CHI_LOGITS, temperature=1.0, top_p=0.8, top_k=5)
    no_top_p = reference_distribution(CHI_LOGITS, temperature=0.7, top_k=5)
    swapped = list(right)
    swapped[2], swapped[6] = swapped[6], swapped[2]
    shifted = list(right)
    shifted[2], shifted[6] = shifted[2] - 0.05 * right[2], shifted[6] + 0.05 * right[2]
    for wrong in (at_t1, no_top_p, swapped, shifted):
        assert chi_square_p_value(counts, wrong) < 1e-6


# ---------------------------------------------------------------- seeds


def seeded_run(layout, seed, device, steps=4):
    """Tokens request A (seeded) gets over `steps` steps, sitting at layout['position'] among
    neighbours of every kind; the default generator is re-seeded so neighbours differ too."""
    torch.manual_seed(layout["default_seed"])
    vocab = 500
    gen = torch.Generator(device=device).manual_seed(seed)
    params_a = SamplingParams(temperature=0.9, top_k=200, top_p=0.95, seed=seed)
    logits_a = torch.linspace(-2.0, 2.0, vocab, device=device)[torch.arange(vocab) * 37 % vocab]
    neighbour_kinds = [
        (SamplingParams(temperature=0.0), False),
        (SamplingParams(temperature=1.3), False),
        (SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.3), False),
        (SamplingParams(temperature=1.0, min_p=0.05, seed=99), True),
        (SamplingParams(temperature=1.0, frequency_penalty=0.5, top_p=0.5), False),
    ]
    tokens, history = [], []
    for _ in range(steps):
        params, logits, gens = [], [], []
        for i in range(layout["num_rows"]):
            if i == layout["position"]:
                params.append(params_a), logits.append(logits_a), gens.append(gen)
                continue
            p, own = neighbour_kinds[(i + layout["kind_offset"]) % len(neighbour_kinds)]
            params.append(p)
            logits.append(torch.randn(vocab, device=device))
            gens.append(torch.Generator(device=device).manual_seed(1000 + i) if own else None)
        outputs = [history if i == layout["position"] else [i, i + 1]
                   for i in range(layout["num_rows"])]
        batch = build(params, vocab, prompts=[[1, 2, 3]] * len(params), outputs=outputs,
                      generators=gens, device=device)
        sampled = Sampler().sample(torch.stack(logits), batch).sampled_token_ids
        tokens.append(int(sampled[layout["position"]]))
        history = history + [tokens[-1]]
    return tokens


LAYOUTS = [
    {"num_rows": 1, "position": 0, "kind_offset": 0, "default_seed": 0},
    {"num_rows": 3, "position": 1, "kind_offset": 1, "default_seed": 1},
    {"num_rows": 7, "position": 6, "kind_offset": 2, "default_seed": 2},
    {"num_rows": 5, "position": 0, "kind_offset": 3, "default_seed": 3},
    {"num_rows": 12, "position": 4, "kind_offset": 4, "default_seed": 4},
]


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_rows_do_not_depend_on_their_batch(device):
    runs = [seeded_run(layout, seed=1234, device=device) for layout in LAYOUTS]
    assert all(run == runs[0] for run in runs[1:]), runs
    assert len(set(runs[0])) > 1, "the seeded request should not be (near) deterministic"
    # the seed is what fixes them: another seed, other tokens
    assert seeded_run(LAYOUTS[1], seed=4321, device=device) != runs[0]


def test_unseeded_rows_follow_the_default_generator():
    logits = torch.randn(6, 400)
    batch = build([SamplingParams(temperature=1.0)] * 6, 400)
    torch.manual_seed(5)
    first = Sampler().sample(logits, batch).sampled_token_ids
    torch.manual_seed(5)
    assert torch.equal(Sampler().sample(logits, batch).sampled_token_ids, first)
    torch.manual_seed(6)
    assert not torch.equal(Sampler().sample(logits, batch).sampled_token_ids, first)


# ---------------------------------------------------------------- min_tokens


def test_min_tokens_bans_eos_and_stop_tokens():
    eos, stop = 7, 5
    logits = torch.zeros(6, 8)
    logits[:, eos], logits[:, stop], logits[:, 2] = 10.0, 9.0, 1.0
    params = [
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[stop]),  # 1 token: banned
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[stop]),  # 3 tokens: free
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[stop], ignore_eos=True),
        SamplingParams(temperature=0.0, min_tokens=3),  # no stop ids: eos alone banned
        SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[stop, 99]),  # 99: no-op
        SamplingParams(temperature=0.0),
    ]
    outputs = [[1], [1, 1, 1], [1], [1], [1], []]
    batch = build(params, 8, outputs=outputs, eos_token_id=eos)
    out = Sampler().sample(logits, batch)
    # ignore_eos: EOS does not stop the request, so (as in vLLM) it is not banned
    assert out.sampled_token_ids.tolist()[:4] == [2, eos, eos, stop]
    assert out.sampled_token_ids[5] == eos
    probs = Sampler.compute_probs(logits, batch)
    assert probs[4, eos] == 0 and probs[4, stop] == 0 and probs[4, 2] > 0
    draws = Sampler().sample(logits[4:5].expand(2000, -1),
                             build([params[4]] * 2000, 8, outputs=[[1]] * 2000, eos_token_id=eos))
    assert not torch.isin(draws.sampled_token_ids, torch.tensor([eos, stop])).any()


def test_min_tokens_without_eos_id_bans_stop_tokens_only():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]])
    batch = build([SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[1])], 4,
                  outputs=[[0]])
    assert Sampler().sample(logits, batch).sampled_token_ids.tolist() == [2]


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_of_raw_logits_with_ranks():
    torch.manual_seed(11)
    vocab = 20
    logits = torch.randn(6, vocab) * 2
    logits[2, 4], logits[2, 9] = 8.0, 7.0  # row 2: greedy, 4 penalised below 9
    params = [
        SamplingParams(temperature=2.0, logprobs=0),
        SamplingParams(temperature=3.0, logprobs=3, repetition_penalty=1.5),
        SamplingParams(temperature=0.0, logprobs=2, repetition_penalty=4.0),
        SamplingParams(temperature=2.0),  # asks for none; the rows are still filled
        SamplingParams(temperature=0.5, top_k=4, logprobs=1),
        SamplingParams(temperature=5.0, logprobs=3, presence_penalty=2.0),
    ]
    batch = build(params, vocab, prompts=[[4, 1]] * 6, outputs=[[0, 3]] * 6)
    assert batch.max_num_logprobs == 3
    out = Sampler().sample(logits, batch)
    sampled, lp = out.sampled_token_ids, out.logprobs
    assert sampled[2] == 9
    assert lp.logprob_token_ids.shape == (6, 4) and lp.logprobs.shape == (6, 4)
    assert torch.equal(lp.logprob_token_ids[:, 0], sampled)
    raw = torch.log_softmax(logits.double(), dim=-1)
    for row in range(6):
        s = int(sampled[row])
        torch.testing.assert_close(lp.logprobs[row, 0].double(), raw[row, s])
        order = sorted(range(vocab), key=lambda t: -raw[row, t].item())
        assert int(lp.selected_token_ranks[row]) == order.index(s) + 1
        assert lp.logprob_token_ids[row, 1:].tolist() == order[:3]
        torch.testing.assert_close(lp.logprobs[row, 1:].double(), raw[row, order[:3]])
    assert lp.selected_token_ranks[2] == 2
    assert (lp.selected_token_ranks > 1).sum() >= 2


def test_no_logprobs_requested_gives_none():
    out = Sampler().sample(torch.randn(2, 9), build([SamplingParams()] * 2, 9))
    assert out.logprobs is None


def test_compute_prompt_logprobs():
    logits = torch.randn(5, 12)
    targets = torch.tensor([3, 0, 11, 7, 7])
    raw = torch.log_softmax(logits, dim=-1)
    result = compute_prompt_logprobs(logits, targets, num_top=2)
    assert torch.equal(result.logprob_token_ids[:, 0], targets)
    torch.testing.assert_close(result.logprobs[:, 0], raw[torch.arange(5), targets])
    ranks = [sorted(raw[i].tolist(), reverse=True).index(raw[i, t].item()) + 1
             for i, t in enumerate(targets.tolist())]
    assert result.selected_token_ranks.tolist() == ranks
    assert torch.equal(result.logprob_token_ids[:, 1:], raw.topk(2).indices)
    assert compute_prompt_logprobs(logits, targets, 0).logprobs.shape == (5, 1)
    assert compute_prompt_logprobs(logits, targets, 50).logprobs.shape == (5, 13)
    with pytest.raises(ValueError, match="num_top"):
        compute_prompt_logprobs(logits, targets, -1)


# ---------------------------------------------------------------- bad input


def test_build_rejects_bad_input():
    p = [SamplingParams(frequency_penalty=1.0)]
    with pytest.raises(ValueError, match="output_token_ids"):
        SamplingBatch.build(p, [[1]], [[1], [2]], [None], 10, "cpu")
    with pytest.raises(ValueError, match="generators"):
        SamplingBatch.build(p, [[1]], [[1]], [], 10, "cpu")
    with pytest.raises(ValueError, match="output_token_ids holds token id 10"):
        SamplingBatch.build(p, [[1]], [[10]], [None], 10, "cpu")
    with pytest.raises(ValueError, match="prompt_token_ids holds token id -1"):
        SamplingBatch.build([SamplingParams(repetition_penalty=1.1)], [[-1]], [[1]], [None], 10,
                            "cpu")
    with pytest.raises(ValueError, match="vocab_size"):
        SamplingBatch.build([], [], [], [], 0, "cpu")
    with pytest.raises(ValueError, match="logits must have shape"):
        Sampler().sample(torch.randn(2, 10), SamplingBatch.build(p, [[1]], [[1]], [None], 10,
                                                                 "cpu"))


# ---------------------------------------------------------------- non-finite rows


@pytest.mark.parametrize("greedy", [True, False])
def test_nonfinite_rows_are_flagged_alone(greedy):
    """A row with a NaN or +inf logit, or with every token at -inf, is flagged with token 0; the
    other rows (seeded) sample exactly what they sample without the bad rows in the batch."""
    vocab = 64
    logits = torch.randn(5, vocab)
    logits[1, 7] = float("nan")
    logits[2, 3] = float("inf")
    logits[3] = float("-inf")
    temp = 0.0 if greedy else 0.8
    params = [SamplingParams(temperature=temp, seed=i) for i in range(5)]

    def gens(rows):
        return [torch.Generator().manual_seed(i) for i in rows]

    out = Sampler().sample(logits, build(params, vocab, generators=gens(range(5))))
    assert out.nonfinite_rows.tolist() == [False, True, True, True, False]
    assert out.sampled_token_ids[1:4].tolist() == [0, 0, 0]
    alone = Sampler().sample(logits[[0, 4]], build([params[0], params[4]], vocab,
                                                   generators=gens([0, 4])))
    assert alone.nonfinite_rows.tolist() == [False, False]
    assert out.sampled_token_ids[[0, 4]].tolist() == alone.sampled_token_ids.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_pass_nonfinite_checks_equal_the_elementwise_definitions(dtype):
    """The one-pass row checks against their definitions (per entry: NaN or +inf, or all -inf;
    probabilities: a NaN or inf entry, or no mass) on rows with NaN, +inf, -inf, all -inf, a
    single finite entry among -inf, zeros and huge finite values, in every position."""
    gen = torch.Generator().manual_seed(0)
    specials = [float("nan"), float("inf"), float("-inf"), 0.0, 6e4, -6e4]
    rows = [torch.randn(40, generator=gen) for _ in range(4)]
    for value in specials:
        for count in (1, 3, 40):
            row = torch.randn(40, generator=gen)
            row[torch.randperm(40, generator=gen)[:count]] = value
            rows.append(row)
    mixed = torch.full((40,), float("-inf"))
    mixed[17] = 1.0
    rows += [mixed, torch.full((40,), float("-inf")), torch.zeros(40)]
    logits = torch.stack(rows).to(dtype)
    expected = ((logits.isnan() | logits.isposinf()).any(dim=-1)
                | logits.isneginf().all(dim=-1))
    assert nonfinite_logit_rows(logits).tolist() == expected.tolist()
    probs = logits.float().abs().where(~logits.isneginf(), torch.zeros(()))  # non-negative
    probs[3, 5] = float("-inf")  # not a probability, but flagged all the same
    expected = ~torch.isfinite(probs).all(dim=-1) | ~(probs.sum(dim=-1) > 0)
    assert nonfinite_prob_rows(probs).tolist() == expected.tolist()
    assert expected.any() and not expected.all()


def test_nonfinite_probabilities_from_parameters_are_flagged():
    """Finite logits, but a repetition penalty that is 0 in fp32 makes +inf logits and NaN
    probabilities; a partly banned (-inf) row is fine."""
    logits = torch.randn(3, 32).abs() + 0.1
    logits[2, :5] = float("-inf")
    params = [SamplingParams(temperature=1.0, repetition_penalty=1e-46),
              SamplingParams(temperature=1.0), SamplingParams(temperature=1.0)]
    out = Sampler().sample(logits, build(params, 32, prompts=[[1, 2], [1, 2], [1, 2]]))
    assert out.nonfinite_rows.tolist() == [True, False, False]
    assert out.sampled_token_ids[2].item() >= 5
