"""The LLM API on a tiny model: stop conditions, n > 1, seeds, chat, and bad input that names
the problem without disturbing other requests."""
import json
import shutil

import pytest

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, dtype="float32", device="cpu")


def greedy(**kw):
    kw.setdefault("max_tokens", 24)
    return SamplingParams(temperature=0.0, ignore_eos=True, **kw)


def test_stop_token_ids_and_max_tokens(llm):
    ref = llm.generate("The quick brown fox", greedy(), use_tqdm=False)[0].outputs[0]
    stop_id = ref.token_ids[5]
    out = llm.generate("The quick brown fox", greedy(stop_token_ids=[stop_id]),
                       use_tqdm=False)[0].outputs[0]
    first = ref.token_ids.index(stop_id)
    assert out.token_ids == ref.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    short = llm.generate("The quick brown fox", greedy(max_tokens=3), use_tqdm=False)[0]
    assert short.outputs[0].token_ids == ref.token_ids[:3]
    assert short.outputs[0].finish_reason == "length"


def test_stop_strings(llm):
    ref = llm.generate("import torch", greedy(), use_tqdm=False)[0].outputs[0]
    stop = ref.text[4:7]
    assert stop
    out = llm.generate("import torch", greedy(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.text == ref.text[:ref.text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    kept = llm.generate("import torch", greedy(stop=[stop], include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == ref.text[:ref.text.index(stop) + len(stop)]


def test_min_tokens_and_eos(llm):
    eos = llm.get_tokenizer().eos_token_id
    # eos as a stop token: with min_tokens the first 5 tokens can never be eos
    out = llm.generate("Once upon", SamplingParams(temperature=1.0, seed=3, max_tokens=20,
                                                   min_tokens=5, stop_token_ids=[eos]),
                       use_tqdm=False)[0].outputs[0]
    assert eos not in out.token_ids[:5] and len(out.token_ids) >= 5


def test_n_and_seeds(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10)
    out = llm.generate("def fibonacci(n):", params, use_tqdm=False)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    seqs = [tuple(o.token_ids) for o in out.outputs]
    assert len(set(seqs)) > 1  # different seeds per child
    again = llm.generate(["The quick", "def fibonacci(n):", "import"],
                         [SamplingParams(temperature=1.0, max_tokens=10), params,
                          SamplingParams(temperature=0.5, max_tokens=3)], use_tqdm=False)[1]
    assert [tuple(o.token_ids) for o in again.outputs] == seqs  # independent of the batch


def test_chat_applies_template(llm):
    messages = [{"role": "user", "content": "hello"}]
    out = llm.chat(messages, greedy(max_tokens=4), use_tqdm=False)[0]
    expected = llm.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True,
                                                       tokenize=True)
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    assert out.prompt_token_ids == list(expected)
    assert len(out.outputs[0].token_ids) == 4


def test_token_id_prompts(llm):
    ids = llm.get_tokenizer().encode("The quick brown fox")
    a = llm.generate({"prompt_token_ids": ids}, greedy(), use_tqdm=False)[0]
    b = llm.generate("The quick brown fox", greedy(), use_tqdm=False)[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_bad_requests_name_the_problem_and_leave_the_engine_working(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [5] * 600}, greedy(), use_tqdm=False)
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate({"prompt_token_ids": [5, 10**6]}, greedy(), use_tqdm=False)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="n"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert not llm.llm_engine.has_unfinished_requests()
    out = llm.generate("The quick", greedy(max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_bad_engine_arguments(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="unknown engine argument"):
        EngineArgs(model=tiny_llama, not_a_flag=1)
    with pytest.raises(ValueError, match="dtype"):
        LLM(tiny_llama, dtype="int8")
    bad = tmp_path / "bad-arch"
    shutil.copytree(tiny_llama, bad)
    config = json.loads((bad / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*not supported"):
        LLM(str(bad), device="cpu")
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(tiny_llama, max_model_len=10**6, device="cpu")


def test_arguments_as_vllm_accepts_them(llm, tiny_llama):
    """A torch.dtype for dtype, and None for an optional argument left unset, as in vLLM."""
    import torch
    other = LLM(tiny_llama, dtype=torch.float32, device="cpu", seed=None, max_model_len=None,
                block_size=None, max_num_batched_tokens=None, swap_space=None)
    config = other.llm_engine.config
    assert config.model_config.dtype == "float32" and config.model_config.seed == 0
    assert config.cache_config.block_size == 16
    prompt = "The quick brown fox"
    assert (other.generate(prompt, greedy(), use_tqdm=False)[0].outputs[0].token_ids
            == llm.generate(prompt, greedy(), use_tqdm=False)[0].outputs[0].token_ids)
