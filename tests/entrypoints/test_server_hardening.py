"""Regression tests of a hostile client's findings, against a real server process on the tiny
Llama: a request the engine fails (non-finite sampling) answers 500 naming its request id and
the server goes on; a prompt the tokenizer rejects with a TypeError answers 400 everywhere; n,
logprobs, body and prompt sizes are bounded; per-request chat templates need a flag; prompt +
max_tokens over max_model_len answers 400; every framework error uses OpenAI's error body. After
each, /health is 200 and a greedy request's output is unchanged."""
import json
import time

import httpx
import pytest

from tests.entrypoints.utils import RemoteServer

MODEL = "tiny"
GOOD = {"model": MODEL, "prompt": "for i in range(10):", "max_tokens": 16, "temperature": 0.0,
        "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_llama):
    with RemoteServer(tiny_llama, ["--max-request-body-bytes", str(2 * 1024 * 1024)],
                      served_name=MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(server):
    r = httpx.post(server.url("/v1/completions"), json=GOOD, timeout=60)
    assert r.status_code == 200
    return r.json()["choices"][0]["text"]


@pytest.fixture(autouse=True)
def still_serving(server, reference):
    """After every test: healthy, and the greedy request comes out the same."""
    yield
    assert httpx.get(server.url("/health"), timeout=10).status_code == 200
    r = httpx.post(server.url("/v1/completions"), json=GOOD, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference


def post(server, path, body=None, **kwargs):
    return httpx.post(server.url(path), json=body, timeout=60, **kwargs)


def assert_error(r, status, *words):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    for word in words:
        assert word in err["message"], err["message"]
    return err


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nonfinite_sampling_is_500_with_request_id(server, stream, temperature):
    # 1e-46 is 0 in fp32: the penalised logits are +inf, the probabilities NaN
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 8,
            "temperature": temperature, "repetition_penalty": 1e-46, "stream": stream}
    err = assert_error(post(server, "/v1/completions", body), 500, "cmpl-", "not finite")
    assert err["type"] == "InternalServerError"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "repetition_penalty": 1e-46, "temperature": temperature, "stream": stream}
    assert_error(post(server, "/v1/chat/completions", chat), 500, "chatcmpl-")


def test_prompt_the_tokenizer_rejects_is_400(server):
    # a lone surrogate: the fast tokenizer raises TypeError on it
    raw = b'{"model": "tiny", "prompt": "abc \\ud800", "max_tokens": 4}'
    headers = {"Content-Type": "application/json"}
    for path in ("/v1/completions", "/tokenize"):
        r = httpx.post(server.url(path), content=raw, headers=headers, timeout=30)
        assert_error(r, 400, "tokenizer rejected", "TypeError")
    chat = (b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}], '
            b'"max_tokens": 4}')
    r = httpx.post(server.url("/v1/chat/completions"), content=chat, headers=headers, timeout=30)
    assert r.status_code == 400


@pytest.mark.parametrize("path, body, words", [
    ("/v1/completions", {"prompt": "x", "n": 129}, ["n must be <= 128"]),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, ["logprobs=21", "max_logprobs=20"]),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 100000}, ["max_logprobs=20"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 21}, ["max_logprobs=20"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template": "{% for i in range(10**9) %}x{% endfor %}"},
     ["--trust-request-chat-template"]),
    # prompt + max_tokens > 512: vLLM answers 400 rather than cutting the output short
    ("/v1/completions", {"prompt": "The " * 250, "max_tokens": 100}, ["512", "max_tokens=100"]),
    ("/v1/completions", {"prompt": [5] * 500, "max_tokens": 13}, ["512", "513"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "The " * 500}],
                              "max_tokens": 100}, ["512", "max_tokens=100"]),
])
def test_limits_are_400(server, path, body, words):
    assert_error(post(server, path, {"model": MODEL, **body}), 400, *words)


def test_prompt_and_body_size_limits(server):
    # 1.5 MB of text cannot be 512 tokens: rejected without tokenizing it
    big = {"model": MODEL, "prompt": "word " * 300_000, "max_tokens": 2}
    start = time.monotonic()
    assert_error(post(server, "/v1/completions", big), 400, "characters", "max_model_len=512")
    assert_error(post(server, "/tokenize", {"prompt": big["prompt"]}), 400, "characters")
    assert time.monotonic() - start < 30
    # over --max-request-body-bytes (2 MiB), with a Content-Length and chunked
    huge = json.dumps({"model": MODEL, "prompt": "x" * (3 * 1024 * 1024)}).encode()
    assert_error(httpx.post(server.url("/v1/completions"), content=huge, timeout=30,
                            headers={"Content-Type": "application/json"}), 413, "body")

    def chunks():
        for i in range(0, len(huge), 65536):
            yield huge[i:i + 65536]

    assert_error(httpx.post(server.url("/v1/completions"), content=chunks(), timeout=30,
                            headers={"Content-Type": "application/json"}), 413)


def test_framework_errors_use_openai_error_body(server):
    assert_error(httpx.get(server.url("/no/such/path"), timeout=10), 404)
    assert_error(httpx.get(server.url("/v1/completions"), timeout=10), 405)
    assert_error(httpx.put(server.url("/tokenize"), timeout=10), 405)
    for content, ctype in [(b"{not json", "application/json"), (b"prompt=x", "text/plain"),
                           (b"", "application/json"), (b"[1, 2]", "application/json")]:
        r = httpx.post(server.url("/v1/completions"), content=content, timeout=10,
                       headers={"Content-Type": ctype})
        assert_error(r, 400)
    assert_error(post(server, "/detokenize", {"tokens": "abc"}), 400, "tokens")
