"""A server started as `vllm serve MODEL`, with n-gram speculative decoding and a small request
queue: greedy outputs equal the offline engine without speculation, /metrics carries the
spec-decode counters, and a burst beyond the queue gets 503 while the rest are served."""
import asyncio

import httpx
import pytest

from tests.entrypoints.utils import RemoteServer
from vllm import LLM, SamplingParams

MODEL = "tiny-spec"
PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox",
           "for i in range(10):\n    print(i * i)\nfor i in range(10):\n"]


@pytest.fixture(scope="module")
def server(tiny_llama):
    args = ["--speculative-model", "[ngram]", "--num-speculative-tokens", "3",
            "--speculative-adaptive", "off",
            "--max-num-seqs", "2", "--max-waiting-requests", "2"]
    with RemoteServer(tiny_llama, args, served_name=MODEL, cli=True) as srv:
        yield srv


def test_spec_decode_metrics_and_equality(server, tiny_llama):
    client = server.client()
    texts = [client.completions.create(model=MODEL, prompt=p, max_tokens=48, temperature=0.0,
                                       extra_body={"ignore_eos": True}).choices[0].text
             for p in PROMPTS]
    ref = LLM(tiny_llama, dtype="float32", device="cpu").generate(
        PROMPTS, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True),
        use_tqdm=False)
    assert texts == [r.outputs[0].text for r in ref]
    drafted = server.metric("vllm:spec_decode_num_draft_tokens_total")
    accepted = server.metric("vllm:spec_decode_num_accepted_tokens_total")
    emitted = server.metric("vllm:spec_decode_num_emitted_tokens_total")
    steps = server.metric("vllm:spec_decode_num_spec_steps_total")
    assert drafted > 0 and steps > 0
    assert accepted <= drafted and accepted <= emitted <= accepted + steps
    assert server.metric("vllm:spec_decode_draft_acceptance_rate") == pytest.approx(
        accepted / drafted)
    assert 0 < server.metric("vllm:spec_decode_efficiency") <= 1
    assert 0 < server.metric("vllm:spec_decode_num_verify_forwards_total") <= steps
    assert server.metric("vllm:spec_decode_draft_time_seconds_total") > 0


def test_burst_beyond_queue_gets_503(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200,
            "ignore_eos": True, "temperature": 0.0}

    async def one(client):
        r = await client.post(server.url("/v1/completions"), json=body)
        return r.status_code, r.json()

    async def burst():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(one(client) for _ in range(12)))

    results = asyncio.run(asyncio.wait_for(burst(), timeout=120))
    codes = [code for code, _ in results]
    assert set(codes) == {200, 503} and codes.count(200) >= 2, codes
    err = next(body for code, body in results if code == 503)["error"]
    assert err["code"] == 503 and err["type"] == "ServiceUnavailableError"
    texts = {body["choices"][0]["text"] for code, body in results if code == 200}
    assert len(texts) == 1  # every served request got the same greedy text
    r = httpx.post(server.url("/v1/completions"), json={**body, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200
