"""The OpenAI-compatible server as a real process on the tiny Llama, driven by the official
`openai` client: completions, chat, streaming, n, logprobs, stop, tokenize, errors, metrics,
64 concurrent streams against offline LLM.generate, malformed bursts and client disconnects."""
import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from tests.entrypoints.utils import RemoteServer
from vllm import LLM, SamplingParams

MODEL = "tiny"
API_KEY = "test-key"
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


# --chat-template replaces the tokenizer's own (<|user|>...</s>)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    with RemoteServer(tiny_llama, ["--chat-template", str(template)], api_key=API_KEY,
                      served_name=MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLM(tiny_llama, dtype="float32", device="cpu")


def stream_text(stream) -> tuple[dict[int, str], dict[int, str]]:
    """Concatenated text and the finish reason of each choice index of a completion stream."""
    texts, reasons = {}, {}
    for chunk in stream:
        for c in chunk.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] = texts.get(c.index, "") + piece
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
    return texts, reasons


def test_models_health_version(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert httpx.get(server.url("/health")).status_code == 200
    assert httpx.get(server.url("/version")).json()["version"]


def test_completion_stream_equals_whole(client):
    whole = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=20,
                                      **GREEDY)
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 20
    assert whole.usage.prompt_tokens > 0
    stream = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=20,
                                       stream=True, stream_options={"include_usage": True},
                                       **GREEDY)
    chunks = list(stream)
    texts, reasons = stream_text(chunks)
    assert texts == {0: choice.text} and reasons == {0: "length"}
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices


def test_batch_of_prompts(client):
    prompts = ["The quick brown fox", "import torch"]
    out = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, **GREEDY)
    single = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, **GREEDY)
              .choices[0].text for p in prompts]
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.text for c in out.choices] == single


def test_chat_and_chat_stream(client):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Once upon a time"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                           **GREEDY)
    msg = whole.choices[0].message
    assert msg.role == "assistant" and msg.content and whole.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                                 stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    texts, reasons = stream_text(chunks)
    assert texts == {0: msg.content} and reasons == {0: "length"}


def test_n_and_seed(client):
    kw = dict(model=MODEL, prompt="def fibonacci(n):", max_tokens=8, n=3, temperature=1.0,
              seed=11)
    first = client.completions.create(**kw)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert len({c.text for c in first.choices}) > 1  # different seeds per choice
    again = client.completions.create(**kw)
    assert [c.text for c in again.choices] == [c.text for c in first.choices]
    texts, reasons = stream_text(client.completions.create(stream=True, **kw))
    assert texts == {c.index: c.text for c in first.choices}
    assert set(reasons) == {0, 1, 2}


def test_logprobs(client):
    out = client.completions.create(model=MODEL, prompt="The cache holds", max_tokens=5,
                                    logprobs=2, **GREEDY)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == out.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 2 <= len(top) <= 3
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the top token
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, logprobs=True,
        top_logprobs=3, **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    for tok in content:
        assert len(tok.top_logprobs) == 3
        assert tok.logprob == pytest.approx(tok.top_logprobs[0].logprob)


def test_stop_strings(client):
    ref = client.completions.create(model=MODEL, prompt="import torch", max_tokens=24,
                                    **GREEDY).choices[0].text
    stop = ref[6:9]
    assert stop
    out = client.completions.create(model=MODEL, prompt="import torch", max_tokens=24,
                                    stop=[stop], **GREEDY).choices[0]
    assert out.text == ref[:ref.index(stop)] and out.finish_reason == "stop"
    texts, reasons = stream_text(client.completions.create(
        model=MODEL, prompt="import torch", max_tokens=24, stop=[stop], stream=True, **GREEDY))
    assert texts == {0: out.text} and reasons == {0: "stop"}


def test_tokenize_detokenize(server):
    h = server.headers
    tok = httpx.post(server.url("/tokenize"), json={"prompt": "The quick brown fox"},
                     headers=h).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 512
    text = httpx.post(server.url("/detokenize"), json={"tokens": tok["tokens"]},
                      headers=h).json()["prompt"]
    assert "quick brown fox" in text
    chat = httpx.post(server.url("/tokenize"),
                      json={"messages": [{"role": "user", "content": "hi"}]}, headers=h).json()
    chat_text = httpx.post(server.url("/detokenize"), json={"tokens": chat["tokens"]},
                           headers=h).json()["prompt"]
    assert chat_text == "USER: hi\nASSISTANT:"  # the --chat-template file's format
    bad = httpx.post(server.url("/detokenize"), json={"tokens": [10 ** 9]}, headers=h)
    assert bad.status_code == 400 and "tokens" in bad.json()["error"]["message"]


@pytest.mark.parametrize("body, field", [
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "max_tokens": "lots"}, "max_tokens"),
    ({"prompt": "x", "presence_penalty": 5}, "presence_penalty"),
    ({"prompt": "x", "min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "The " * 600}, "max_model_len"),
])
def test_bad_requests_400(server, body, field):
    r = httpx.post(server.url("/v1/completions"), json={"model": MODEL, **body},
                   headers=server.headers, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and field in err["message"]


def test_auth_model_and_json_errors(server, client):
    r = httpx.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url("/v1"), api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    r = httpx.post(server.url("/v1/chat/completions"), content=b"{not json",
                   headers={**server.headers, "Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_metrics(server, client):
    before = server.metrics()
    client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7, **GREEDY)
    after = server.metrics()
    key = f'{{model_name="{MODEL}"}}'
    assert after["vllm:generation_tokens_total" + key] - \
        before["vllm:generation_tokens_total" + key] == 7
    assert after["vllm:prompt_tokens_total" + key] > before["vllm:prompt_tokens_total" + key]
    assert after["vllm:e2e_request_latency_seconds_count" + key] >= 1
    assert after["vllm:time_to_first_token_seconds_count" + key] >= 1
    assert after["vllm:num_requests_running" + key] == 0
    assert after["vllm:kv_cache_usage_perc" + key] == 0.0
    assert not any(name.startswith("vllm:spec_decode") for name in after)


def test_64_concurrent_streams_equal_offline(server, offline):
    words = "quick brown fox lazy dog cache keys values token model draft large small".split()
    prompts = [f"The {words[i % 13]} {words[(i * 5) % 13]} {i}" for i in range(64)]

    async def one(client, prompt):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                                 stream=True, **GREEDY)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def run_all():
        client = server.async_client()
        try:
            return await asyncio.wait_for(
                asyncio.gather(*(one(client, p) for p in prompts)), timeout=120)
        finally:
            await client.close()

    texts = asyncio.run(run_all())
    ref = offline.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16,
                                                   ignore_eos=True), use_tqdm=False)
    assert texts == [r.outputs[0].text for r in ref]


def test_malformed_burst_keeps_serving(server):
    good = {"model": MODEL, "prompt": "for i in range(10):", "max_tokens": 24,
            "temperature": 0.0, "ignore_eos": True}
    h = server.headers
    ref = httpx.post(server.url("/v1/completions"), json=good, headers=h,
                     timeout=60).json()["choices"][0]["text"]
    malformed = [{"prompt": "x", "temperature": "hot"}, {"prompt": "x", "top_k": -5},
                 {"prompt": 5}, {"prompt": "x", "stop": [""]}, {"prompt": "x", "seed": 1.5},
                 {"prompt": "The " * 600}, {"prompt": [10 ** 9]}]

    async def stream_good(client):
        text = ""
        async with client.stream("POST", server.url("/v1/completions"), headers=h,
                                 json={**good, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
        return text

    async def bad(client, body):
        r = await client.post(server.url("/v1/completions"), json={"model": MODEL, **body},
                              headers=h)
        return r.status_code

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            goods = [asyncio.ensure_future(stream_good(client)) for _ in range(6)]
            codes = await asyncio.gather(*(bad(client, malformed[i % len(malformed)])
                                           for i in range(42)))
            return codes, await asyncio.gather(*goods)

    codes, texts = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert codes == [400] * 42
    assert texts == [ref] * 6


def test_disconnect_aborts_and_frees_kv(server):
    aborted = server.metric("vllm:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": "The", "max_tokens": 480, "ignore_eos": True,
            "temperature": 0.0, "stream": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url("/v1/completions"), json=body,
                      headers=server.headers) as r:
            lines = r.iter_lines()  # not closed until the response is: closing disconnects
            assert [next(lines) for _ in range(4)][0].startswith("data: ")
            assert server.metric("vllm:kv_cache_usage_perc") > 0
            assert server.metric("vllm:num_requests_running") == 1
    # a non-streaming request whose client goes away is aborted too
    payload = json.dumps({**body, "stream": False, "n": 4}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        deadline = time.monotonic() + 30
        # /metrics is the engine core's snapshot after its last step: wait for the 4 children
        while (server.metric("vllm:num_requests_running") != 4
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert server.metric("vllm:num_requests_running") == 4
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (server.metric("vllm:num_requests_running") == 0
                and server.metric("vllm:kv_cache_usage_perc") == 0):
            break
        time.sleep(0.1)
    assert server.metric("vllm:kv_cache_usage_perc") == 0
    assert server.metric("vllm:num_requests_running") == 0
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborted + 2
