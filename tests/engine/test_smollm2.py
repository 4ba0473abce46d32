"""The engine on the real SmolLM2-135M-Instruct (GGUF, from the package index) against
Hugging Face transformers loading the same file: greedy tokens equal, prompt logprobs close."""
import os

import pytest
import torch

from tests.tiny_models import hf_greedy
from vllm import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):",
    "Here is a short poem about the sea:",
    "Q: What is 12 times 7?\nA:",
    "The three primary colors are",
]
NUM_TOKENS = 32
# fp32 end to end: both sides dequantise the same GGUF to fp32
PROMPT_LOGPROB_ATOL = {torch.float32: 2e-3}


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smollm2_gguf), gguf_file=os.path.basename(smollm2_gguf),
        dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=512)


def test_smollm2_greedy_equals_transformers(llm, hf_model):
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outputs):
        ref = hf_greedy(hf_model, out.prompt_token_ids, NUM_TOKENS)
        assert out.outputs[0].token_ids == ref, (prompt, out.outputs[0].text)
    assert "Paris" in outputs[0].outputs[0].text


def test_smollm2_prompt_logprobs_close(llm, hf_model):
    params = SamplingParams(max_tokens=1, prompt_logprobs=1)
    for out in llm.generate(PROMPTS[:3], params, use_tqdm=False):
        ids = out.prompt_token_ids
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        got = torch.tensor([out.prompt_logprobs[p][ids[p]].logprob for p in range(1, len(ids))])
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        assert (got - want).abs().max().item() < PROMPT_LOGPROB_ATOL[torch.float32]
