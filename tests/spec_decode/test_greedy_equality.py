"""Lossless speculative decoding, greedy: outputs with speculation equal outputs without, token
for token, for draft == target, draft != target and the n-gram proposer, over batch sizes and k."""
from types import SimpleNamespace

import pytest
import torch

from vllm import LLM, SamplingParams
from vllm.spec_decode.spec_decoder import SpecDecoder

PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "import torch\nx = torch.randn(4, 4)\nprint(x",
    "Once upon a time, in a land far away,",
    "for i in range(10):\n    print(i",
    "Speculative decoding drafts tokens with a small model and verifies them",
    "The cache holds keys and values",
    "x",
]
NUM_TOKENS = 40


def greedy():
    return SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)


def generate(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]


@pytest.fixture(scope="module")
def reference(spec_target):
    llm = LLM(spec_target, dtype="float32", device="cpu")
    return generate(llm, PROMPTS)


@pytest.mark.parametrize("draft", ["self", "other", "[ngram]"])
@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_spec_greedy_equals_plain(reference, spec_target, spec_draft, draft, k, batch_size):
    model = {"self": spec_target, "other": spec_draft}.get(draft, draft)
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=model,
              speculative_adaptive="off", num_speculative_tokens=k,
              cpu_draft_worker=True, speculative_draft_dtype="float32")
    prompts = PROMPTS[:batch_size]
    outs = llm.generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference[:batch_size]
    m = llm.llm_engine.spec_metrics
    if draft == "self":  # the draft is the target: every draft is accepted
        assert m.num_draft_tokens > 0 and m.acceptance_rate == 1.0
    if draft != "[ngram]":
        assert m.num_spec_steps > 0
    stats = outs[0].metrics.get("spec_decode")
    if m.num_spec_steps and stats:
        assert stats["num_emitted_tokens"] <= NUM_TOKENS + k


@pytest.mark.parametrize("draft", ["self", "other"])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_draft_ahead_greedy_equals_plain(reference, spec_target, spec_draft, draft, k,
                                         batch_size):
    """Drafting ahead (forced on: on the CPU the engine would not choose it): the drafts made
    while the target verified are used only when the target accepted every draft and its bonus
    token was the draft's guess; outputs stay token for token those of plain decoding."""
    model = {"self": spec_target, "other": spec_draft}[draft]
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=model,
              speculative_adaptive="off", num_speculative_tokens=k,
              cpu_draft_worker=True, speculative_draft_dtype="float32",
              speculative_draft_ahead="on")
    assert llm.llm_engine.draft_ahead
    outs = llm.llm_engine.proposer, generate(llm, PROMPTS[:batch_size])
    proposer, tokens = outs
    assert tokens == reference[:batch_size]
    stats = proposer.ahead_stats
    assert stats["made"] > 0
    if draft == "self":  # every guess is right: after the first step every proposal comes ahead
        assert stats["used"] >= stats["made"] // 2
    assert not proposer.ahead and not proposer.seqs  # freed with their requests


def test_draft_ahead_is_off_for_a_same_device_draft(spec_target):
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=spec_target,
              speculative_adaptive="off", num_speculative_tokens=2, cpu_draft_worker=True)
    assert not llm.llm_engine.draft_ahead  # auto: draft and target share the CPU


@pytest.mark.parametrize("own_process", [False, True])
def test_draft_ahead_is_on_by_default_for_a_draft_on_another_device(own_process):
    """auto: a CPU draft beside a GPU target drafts ahead, in the engine's process or its own
    (measured on the H200 with a draft process: 2.30x plain against 1.89x synchronous at k=4);
    off turns it off, and a draft on the target's device never does by default."""
    def ahead(mode: str, target: str, draft: str = "cpu") -> bool:
        spec = SpecDecoder.__new__(SpecDecoder)
        spec.spec_config = SimpleNamespace(speculative_draft_ahead=mode)
        spec.config = SimpleNamespace(device=torch.device(target))
        spec.proposer = SimpleNamespace(config=SimpleNamespace(device=torch.device(draft)),
                                        runs_in_own_process=own_process)
        return spec._draft_ahead()

    assert ahead("auto", "cuda") and ahead("on", "cuda") and ahead("on", "cpu")
    assert not ahead("off", "cuda") and not ahead("auto", "cpu")


@pytest.mark.parametrize("draft", ["self", "other"])
def test_logprobs_with_speculation_equal_plain(spec_target, spec_draft, draft):
    """Steps with logprobs requests speculate too: each emitted token's logprobs come from the
    verification row that judged it, equal (fp32) to plain decoding's, including after a stop
    token that cuts a step's accepted drafts short."""
    plain = LLM(spec_target, dtype="float32", device="cpu")
    model = {"self": spec_target, "other": spec_draft}[draft]
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=model,
              speculative_adaptive="off", num_speculative_tokens=3,
              cpu_draft_worker=True, speculative_draft_dtype="float32")
    ref_tokens = generate(plain, PROMPTS[:1])[0]
    stop_id = ref_tokens[12]  # a stop token inside the output: drafts after it are dropped
    for params in (SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True,
                                  logprobs=3),
                   SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True,
                                  logprobs=2, stop_token_ids=[stop_id])):
        ref = plain.generate(PROMPTS[:3], params, use_tqdm=False)
        outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
        for a, b in zip(ref, outs):
            x, y = a.outputs[0], b.outputs[0]
            assert x.token_ids == y.token_ids
            assert len(y.logprobs) == len(y.token_ids)
            for ex, ey in zip(x.logprobs, y.logprobs):
                assert ex.keys() == ey.keys()
                for t in ex:
                    assert abs(ex[t].logprob - ey[t].logprob) < 1e-4
                    assert ex[t].rank == ey[t].rank
            assert abs(x.cumulative_logprob - y.cumulative_logprob) < 1e-3
    assert llm.llm_engine.spec_metrics.num_spec_steps > 0


@pytest.mark.parametrize("extra", [dict(repetition_penalty=1.3), dict(presence_penalty=0.8),
                                   dict(min_tokens=NUM_TOKENS, ignore_eos=False)])
def test_greedy_with_logit_changes_equals_plain(spec_target, extra):
    """Greedy requests whose logits are changed first (penalties, a min_tokens ban) verify on
    the changed logits, row by row as decoding would; plain-greedy ones on the raw argmax."""
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, **{"ignore_eos": True,
                                                                       **extra})
    plain = LLM(spec_target, dtype="float32", device="cpu")
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=spec_target,
              speculative_adaptive="off", num_speculative_tokens=3,
              cpu_draft_worker=True, speculative_draft_dtype="float32")
    ref = [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:3], params, use_tqdm=False)]
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], params, use_tqdm=False)]
    assert outs == ref
    m = llm.llm_engine.spec_metrics
    assert m.num_spec_steps > 0 and m.acceptance_rate == 1.0  # the draft is the target
