"""--scheduler-delay-factor in the engine: prompts that arrive while a request decodes wait
(at most the factor times the last prompt step, and never once nothing runs) and then share
one prefill step; greedy outputs equal an engine without the delay."""
import pytest

from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine

PROMPTS = {"a": "The quick brown fox", "b": "def fibonacci(n):", "c": "Once upon a time"}


def staggered(tiny_llama, delay_factor):
    """a first; b after a's prefill, c a step later. Returns (id -> token ids, the step index
    of each request's first token)."""
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=tiny_llama, dtype="float32", device="cpu", max_num_seqs=8,
        scheduler_delay_factor=delay_factor))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.add_request("a", PROMPTS["a"], params)
    tokens, first_step = {}, {}
    for step in range(200):
        if step == 1:
            engine.add_request("b", PROMPTS["b"], params)
        if step == 2:
            engine.add_request("c", PROMPTS["c"], params)
        for out in engine.step():
            first_step.setdefault(out.request_id, step)
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
        if step > 2 and not engine.has_unfinished_requests():
            break
    assert set(tokens) == set(PROMPTS)
    return tokens, first_step


def test_delayed_prompts_share_a_step_and_outputs_are_unchanged(tiny_llama):
    plain_tokens, plain_first = staggered(tiny_llama, 0.0)
    assert plain_first["b"] < plain_first["c"]  # without the delay, a step each
    tokens, first = staggered(tiny_llama, 1000.0)  # the wait outlasts a's decoding
    assert first["b"] == first["c"] > first["a"]  # admitted together, once a finished
    assert tokens == plain_tokens


def test_negative_delay_factor_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="scheduler_delay_factor must be >= 0, got -1"):
        LLMEngine.from_engine_args(EngineArgs(model=tiny_llama, device="cpu",
                                              scheduler_delay_factor=-1.0))
