"""SamplingParams: vLLM's defaults, the normalisations, and one ValueError per bad value that
names the field."""
import math

import pytest

from vllm.sampling_params import SamplingParams, SamplingType


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.best_of, p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == \
        (1, None, 0.0, 0.0, 1.0)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1.0, 1.0, -1, 0.0, None)
    assert (p.stop, p.stop_token_ids, p.include_stop_str_in_output, p.ignore_eos) == \
        ([], [], False, False)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs) == (16, 0, None, None)
    assert (p.skip_special_tokens, p.spaces_between_special_tokens, p.detokenize) == \
        (True, True, True)
    assert p.sampling_type == SamplingType.RANDOM and not p.is_greedy


def test_stop_normalised_to_lists():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=(7, 8)).stop_token_ids == [7, 8]
    assert SamplingParams(stop=None, stop_token_ids=None).stop == []


INVALID = [
    ("n", 0), ("n", -3), ("n", 1.5), ("n", True),
    ("best_of", 2),  # n is 1
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf),
    ("temperature", "hot"),
    ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.01),
    ("top_k", -2), ("top_k", 2.5),
    ("min_p", -0.01), ("min_p", 1.01),
    ("presence_penalty", 2.01), ("presence_penalty", -2.01),
    ("frequency_penalty", 2.5), ("frequency_penalty", -3.0),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("max_tokens", 0), ("max_tokens", -5),
    ("min_tokens", -1), ("min_tokens", 17),  # max_tokens is 16
    ("logprobs", -1), ("prompt_logprobs", -1),
    ("seed", 1.5), ("seed", "42"),
    ("stop", ["ok", ""]), ("stop", ""), ("stop", [3]),
    ("stop_token_ids", ["x"]),
]


@pytest.mark.parametrize("field,value", INVALID, ids=[f"{f}={v!r}" for f, v in INVALID])
def test_invalid_value_raises_naming_field(field, value):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert message.startswith(field), message
    # the offending value appears too (as itself, or inside the normalised list)
    assert str(value) in message or repr(value) in message, message


VALID = [
    {"temperature": 0.0}, {"top_p": 1.0}, {"top_p": 1e-9}, {"top_k": 0}, {"top_k": -1},
    {"top_k": 1}, {"min_p": 0.0}, {"min_p": 1.0}, {"presence_penalty": -2.0},
    {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 0.01},
    {"max_tokens": None, "min_tokens": 10_000}, {"max_tokens": 5, "min_tokens": 5},
    {"n": 3, "best_of": 3}, {"seed": 0}, {"seed": -7}, {"logprobs": 0},
    {"prompt_logprobs": 0},
]


@pytest.mark.parametrize("kwargs", VALID, ids=[str(v) for v in VALID])
def test_boundary_values_accepted(kwargs):
    p = SamplingParams(**kwargs)
    for field, value in kwargs.items():
        if not (field in ("top_p", "top_k", "min_p") and p.is_greedy):
            assert getattr(p, field) == value


def test_greedy_threshold_and_sampling_type():
    assert SamplingParams(temperature=0.0).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=9e-6).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
    assert SamplingParams(temperature=0.0, seed=3).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=0.5, seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(temperature=0.5).sampling_type == SamplingType.RANDOM


def test_greedy_neutralises_filters():
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert (p.top_p, p.top_k, p.min_p) == (1.0, -1, 0.0)


def test_clone_is_equal_and_independent():
    p = SamplingParams(temperature=0.3, stop=["a"], stop_token_ids=[2], seed=5)
    q = p.clone()
    assert q == p and q is not p
    q.stop.append("b")
    q.stop_token_ids.append(3)
    assert p.stop == ["a"] and p.stop_token_ids == [2]


def test_repr_is_readable():
    text = repr(SamplingParams(temperature=0.5, stop="x"))
    assert text.startswith("SamplingParams(")
    assert "temperature=0.5" in text and "stop=['x']" in text and "max_tokens=16" in text
