"""The server under overload and at shutdown, as real processes: 256 concurrent clients against a
small --max-waiting-requests (the excess gets 503 with Retry-After, every accepted request is
served whole, the queue drains to idle), and SIGTERM during 16 running streams (exit 0 within
10 s, no process left behind)."""
import asyncio
import signal
import time

import httpx
import psutil
import pytest

from tests.entrypoints.utils import RemoteServer

MODEL = "tiny"


def body(prompt, max_tokens, stream=False):
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": stream}


def test_overload_503_with_retry_after_and_drains(tiny_llama):
    with RemoteServer(tiny_llama, ["--max-num-seqs", "4", "--max-waiting-requests", "4"],
                      served_name=MODEL) as server:
        prompts = [f"The quick brown fox {i % 7}" for i in range(256)]
        refs = {p: httpx.post(server.url("/v1/completions"), json=body(p, 12), timeout=60)
                .json()["choices"][0]["text"] for p in set(prompts)}

        async def one(client, prompt):
            r = await client.post(server.url("/v1/completions"), json=body(prompt, 12))
            return prompt, r

        async def run_all():
            limits = httpx.Limits(max_connections=256)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                return await asyncio.wait_for(
                    asyncio.gather(*(one(client, p) for p in prompts)), timeout=180)

        results = asyncio.run(run_all())
        accepted = [(p, r) for p, r in results if r.status_code == 200]
        rejected = [r for _, r in results if r.status_code != 200]
        assert len(accepted) + len(rejected) == 256
        assert accepted and rejected  # both happened
        for r in rejected:
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            err = r.json()["error"]
            assert err["code"] == 503 and err["type"] == "ServiceUnavailableError"
        for prompt, r in accepted:  # nothing accepted is lost or cut short
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "length" and choice["text"] == refs[prompt]
            assert r.json()["usage"]["completion_tokens"] == 12
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
                server.metric("vllm:num_requests_running")
                or server.metric("vllm:num_requests_waiting")):
            time.sleep(0.1)
        assert server.metric("vllm:num_requests_running") == 0
        assert server.metric("vllm:num_requests_waiting") == 0
        assert server.metric("vllm:kv_cache_usage_perc") == 0
        assert httpx.post(server.url("/v1/completions"), json=body(prompts[0], 12),
                          timeout=60).json()["choices"][0]["text"] == refs[prompts[0]]


def test_sigterm_during_streams_exits_cleanly(tiny_llama):
    server = RemoteServer(tiny_llama, ["--max-num-seqs", "16"], served_name=MODEL)
    try:
        proc = psutil.Process(server.proc.pid)

        async def stream(client, i, started):
            async with client.stream("POST", server.url("/v1/completions"),
                                     json=body(f"Once upon a time {i}", 480, stream=True)) as r:
                assert r.status_code == 200
                lines = r.aiter_lines()
                await lines.__anext__()
                started.append(i)
                try:
                    async for _ in lines:
                        pass
                except httpx.HTTPError:
                    pass  # the server went away mid-stream

        async def main():
            started: list[int] = []
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [asyncio.ensure_future(stream(client, i, started)) for i in range(16)]
                while len(started) < 16:
                    await asyncio.sleep(0.05)
                    assert not any(t.done() and t.exception() for t in tasks)
                assert server.metric("vllm:num_requests_running") == 16
                family = [proc] + proc.children(recursive=True)
                start = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                rc = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: server.proc.wait(timeout=10))
                elapsed = time.monotonic() - start
                await asyncio.gather(*tasks, return_exceptions=True)
                return rc, elapsed, family

        rc, elapsed, family = asyncio.run(asyncio.wait_for(main(), timeout=120))
        assert rc == 0, server.log_tail()
        assert elapsed < 10
        _, alive = psutil.wait_procs(family, timeout=2)
        assert not alive, f"left behind: {alive}"
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _no_leftover_children():
    """Guards the test process itself: servers started here are gone afterwards."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    after = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(after, timeout=5)
    assert not alive
