"""Lossless speculative decoding, greedy: outputs with speculation equal outputs without, token
for token, for draft == target, draft != target and the n-gram proposer, over batch sizes and k."""
import pytest

from vllm import LLM, SamplingParams

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
              num_speculative_tokens=k, cpu_draft_worker=True, speculative_draft_dtype="float32")
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
