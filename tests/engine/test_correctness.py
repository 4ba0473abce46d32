"""The engine against Hugging Face transformers on tiny random Llama and Qwen2 checkpoints
(fp32, CPU): greedy tokens equal, prompt logprobs close; and the same greedy outputs whether a
request runs alone, batched, chunked, or preempted by a tiny KV budget."""
import math

import pytest
import torch

from tests.tiny_models import hf_greedy
from vllm import LLM, SamplingParams

PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox",
    "Speculative decoding drafts tokens with a small model and verifies",
    "import torch",
    "Once upon a time, in a land far away, there lived",
]
NUM_TOKENS = 32


def greedy(max_tokens=NUM_TOKENS, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tiny_llama, tiny_qwen2):
    return tiny_llama if request.param == "llama" else tiny_qwen2


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, dtype="float32", device="cpu")


def test_greedy_equals_transformers(llm, model_dir):
    outputs = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outputs):
        ids = tok.encode(prompt)
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == hf_greedy(model_dir, ids, NUM_TOKENS), prompt
        assert out.outputs[0].finish_reason == "length"
        # incremental detokenization equals decoding the whole output at once
        assert out.outputs[0].text == tok.decode(out.outputs[0].token_ids,
                                                 skip_special_tokens=True)


def test_prompt_logprobs_close_to_transformers(llm, model_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = SamplingParams(max_tokens=1, prompt_logprobs=2, logprobs=3)
    for out in llm.generate(PROMPTS[:3], params, use_tqdm=False):
        ids = out.prompt_token_ids
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].log_softmax(-1)  # [len, vocab]
        assert out.prompt_logprobs[0] is None
        for pos in range(1, len(ids)):
            entry = out.prompt_logprobs[pos]
            assert ids[pos] in entry
            assert abs(entry[ids[pos]].logprob - ref[pos - 1, ids[pos]].item()) < 1e-4  # fp32
            top = ref[pos - 1].topk(2).indices.tolist()
            assert all(t in entry for t in top)
        sample_entry = out.outputs[0].logprobs[0]
        assert len(sample_entry) >= 3 and out.outputs[0].token_ids[0] in sample_entry


def test_alone_batched_chunked_and_preempted_agree(model_dir):
    batched = token_ids(LLM(model_dir, dtype="float32", device="cpu").generate(
        PROMPTS, greedy(), use_tqdm=False))
    alone_llm = LLM(model_dir, dtype="float32", device="cpu")
    alone = [token_ids(alone_llm.generate([p], greedy(), use_tqdm=False))[0] for p in PROMPTS]
    assert alone == batched
    # chunked prefill: at most 8 tokens per step
    chunked_llm = LLM(model_dir, dtype="float32", device="cpu", max_num_batched_tokens=8,
                      max_num_seqs=4)
    assert token_ids(chunked_llm.generate(PROMPTS, greedy(), use_tqdm=False)) == batched
    # a KV cache too small for all five at once: the newest are preempted and recomputed
    tight = LLM(model_dir, dtype="float32", device="cpu", num_gpu_blocks_override=8,
                block_size=16)
    outs = tight.generate(PROMPTS, greedy(), use_tqdm=False)
    assert token_ids(outs) == batched
    assert sum(o.metrics["num_preemptions"] for o in outs) > 0
    assert tight.llm_engine.block_manager.num_free_blocks == 8  # everything freed at the end


def test_logits_argmax_margin_is_meaningful(llm, model_dir):
    """Guards the equality test: the tiny models' greedy choices are not coin flips."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    with torch.no_grad():
        top2 = hf(torch.tensor([ids])).logits[0, -1].topk(2).values
    assert (top2[0] - top2[1]).item() > 1e-4
    assert math.isfinite(top2[0].item())


def test_llama3_rope_scaling_equals_transformers(tmp_path):
    """Llama 3.1's rope scaling (low frequencies stretched) matches transformers."""
    from tests.tiny_models import build_model

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    model_dir = build_model(tmp_path / "llama3", "llama", seed=3, rope_scaling=scaling,
                            rope_theta=500000.0)
    llm = LLM(str(model_dir), dtype="float32", device="cpu")
    prompt = PROMPTS[2] * 3  # long enough for the scaled frequencies to matter
    out = llm.generate(prompt, greedy(), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(model_dir, out.prompt_token_ids, NUM_TOKENS)


def test_abort_frees_blocks(model_dir):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs(model=model_dir, dtype="float32",
                                                   device="cpu", num_gpu_blocks_override=32))
    engine.add_request("a", PROMPTS[0], greedy())
    engine.add_request("b", PROMPTS[1], greedy())
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks < 32
    engine.abort_request("a")
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert {o.request_id for o in outputs} == {"b"}
    assert engine.block_manager.num_free_blocks == 32
