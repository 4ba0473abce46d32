"""Property-based fuzzing (hypothesis) of a real server on the tiny Llama: random bodies for
/v1/completions, /v1/chat/completions, /tokenize and /detokenize, mixing plausible and hostile
values for every sampling field. Invariants: never a 5xx for a bad request (a 500 is allowed
only when it names the failed request: the engine refusing non-finite sampling), every error
is OpenAI's error body, and afterwards the server is healthy and a greedy request's output is
unchanged. Bounded (150 examples per endpoint, derandomized) to stay well under a minute."""
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.entrypoints.utils import RemoteServer

MODEL = "tiny"
GOOD = {"model": MODEL, "prompt": "The cache holds", "max_tokens": 12, "temperature": 0.0,
        "ignore_eos": True}

JSON = {"Content-Type": "application/json"}
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))

# values of every JSON type, with the edges that broke servers before
weird = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.sampled_from(
        [0, -1, 1, 2 ** 31, 2 ** 63, 10 ** 5]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-46, 1e-300, 1e300, -0.0, 5e-324]),
    st.text(max_size=20), st.sampled_from(["\ud800", "\x00", "{{", "\u202e", "🙂" * 5]),
    st.lists(st.integers(-5, 500), max_size=5), st.dictionaries(st.text(max_size=5),
                                                                 st.integers(), max_size=3))


def small_number(lo, hi):
    return st.one_of(st.floats(lo, hi), st.integers(int(lo), int(hi)), weird)


SAMPLING = {
    "n": st.one_of(st.integers(-2, 4), st.sampled_from([129, 5000]), weird),
    "max_tokens": st.one_of(st.integers(-2, 24), st.sampled_from([600, 10 ** 9]), weird),
    "temperature": small_number(0, 3), "top_p": small_number(0, 1.2),
    "top_k": st.one_of(st.integers(-3, 500), weird), "min_p": small_number(-0.5, 1.5),
    "presence_penalty": small_number(-3, 3), "frequency_penalty": small_number(-3, 3),
    "repetition_penalty": small_number(0, 3), "seed": st.one_of(st.integers(-5, 2 ** 64), weird),
    "stop": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=3), weird),
    "stop_token_ids": st.one_of(st.lists(st.integers(-3, 1000), max_size=3), weird),
    "min_tokens": st.one_of(st.integers(-2, 30), weird), "ignore_eos": st.booleans(),
    "logprobs": st.one_of(st.integers(-2, 25), st.sampled_from([100000]), weird),
    "stream": st.booleans(), "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(), "best_of": weird, "logit_bias": weird,
    "stream_options": st.one_of(st.just({"include_usage": True}), weird),
}
PROMPT = st.one_of(st.text(max_size=40), st.lists(st.integers(-3, 420), max_size=8),
                   st.lists(st.text(max_size=8), max_size=3),
                   st.lists(st.lists(st.integers(0, 399), max_size=4), max_size=2), weird)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", ""]),
                                 "content": st.one_of(st.text(max_size=30), weird)})


def fields(strategies, required):
    return st.fixed_dictionaries(required, optional=strategies)


@pytest.fixture(scope="module")
def server(tiny_llama):
    with RemoteServer(tiny_llama, ["--max-num-seqs", "8"], served_name=MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        reference = client.post("/v1/completions", json=GOOD).json()["choices"][0]["text"]
        yield client
        assert client.get("/health").status_code == 200
        after = client.post("/v1/completions", json=GOOD)
        assert after.status_code == 200 and after.json()["choices"][0]["text"] == reference


def check(r: httpx.Response) -> None:
    if r.status_code == 200:
        return
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == r.status_code and err["message"], body
    if r.status_code >= 500:
        # only the engine refusing a request's non-finite sampling, naming the request
        assert r.status_code == 500 and "not finite" in err["message"], body
        assert "cmpl-" in err["message"], body
    else:
        assert r.status_code in (400, 404, 413), body


def post(http, path, body):
    # json.dumps escapes lone surrogates (\ud800) as a hostile client can send them
    return http.post(path, content=json.dumps(body), headers=JSON)


def send(http, path, body):
    if body.get("stream") is True:
        with http.stream("POST", path, content=json.dumps(body), headers=JSON) as r:
            if r.status_code != 200:
                r.read()
                check(r)
                return
            lines = [line for line in r.iter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            assert not any('"error"' in line for line in lines), lines
    else:
        check(post(http, path, body))


@FUZZ
@given(body=fields(SAMPLING, {"model": st.just(MODEL), "prompt": PROMPT}))
def test_fuzz_completions(http, body):
    send(http, "/v1/completions", body)


@FUZZ
@given(body=fields({**SAMPLING, "top_logprobs": st.one_of(st.integers(-2, 25), weird),
                    "logprobs": st.one_of(st.booleans(), weird),
                    "max_completion_tokens": st.one_of(st.integers(-1, 20), weird),
                    "add_generation_prompt": st.booleans(), "chat_template": weird},
                   {"model": st.just(MODEL),
                    "messages": st.one_of(st.lists(MESSAGE, max_size=3), weird)}))
def test_fuzz_chat(http, body):
    send(http, "/v1/chat/completions", body)


@FUZZ
@given(body=st.one_of(
    fields({"prompt": st.one_of(st.text(max_size=60), weird),
            "add_special_tokens": st.one_of(st.booleans(), weird),
            "messages": st.one_of(st.lists(MESSAGE, max_size=2), weird)}, {}),
    fields({}, {"tokens": st.one_of(st.lists(st.integers(-2 ** 40, 2 ** 40), max_size=8),
                                    weird)})),
    path=st.sampled_from(["/tokenize", "/detokenize"]))
def test_fuzz_tokenize_detokenize(http, body, path):
    check(post(http, path, body))
