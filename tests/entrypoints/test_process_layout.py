"""The server's processes: API server -> engine core -> drafter (a CPU draft model in its own
process). Killing the drafter with SIGKILL while 8 streams run: every stream still completes
with the text of plain greedy decoding, and a new drafter takes over. Killing the engine core:
the server says so on /health and exits non-zero within seconds. SIGTERM while 16 streams run:
exit 0 within 10 s, no process of the tree left behind."""
import asyncio
import json
import os
import signal
import time

import httpx
import psutil
import pytest

from tests.entrypoints.utils import RemoteServer
from tests.tiny_models import build_model
from vllm import LLM, SamplingParams

MODEL = "tiny-layout"
PROMPTS = ["The quick brown fox", "import torch", "Once upon a time", "def f(x):",
           "for i in range(10):", "The cache holds", "x", "Speculative decoding"]
MAX_TOKENS = 160


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    return str(build_model(tmp_path_factory.mktemp("layout-draft"), "llama", seed=5,
                           num_hidden_layers=1))


def spec_args(draft: str) -> list[str]:
    # a fixed k: the faults are injected into a drafter that is sure to be asked for drafts
    return ["--speculative-model", draft, "--num-speculative-tokens", "3",
            "--speculative-adaptive", "off",
            "--cpu-draft-worker", "--speculative-draft-process", "on",
            "--speculative-draft-dtype", "float32", "--max-num-seqs", "16"]


def children(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def find(server: RemoteServer, module: str, timeout: float = 60) -> psutil.Process:
    """The descendant of the server that runs `python -m module`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in children(server.proc.pid):
            try:
                if module in p.cmdline():
                    return p
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no {module} process under the server:\n{server.log_tail()}")


async def stream(client: httpx.AsyncClient, server: RemoteServer, prompt: str,
                 started: asyncio.Event, counter: list[int], num_streams: int) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    text, counted = "", False
    async with client.stream("POST", server.url("/v1/completions"), json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            text += chunk["choices"][0]["text"]
            if not counted and text:
                counted = True
                counter[0] += 1
                if counter[0] == num_streams:
                    started.set()
    return text


async def streams_with(server: RemoteServer, prompts: list[str], action) -> list:
    """Runs one stream per prompt; once all have produced text, calls action()."""
    started, counter = asyncio.Event(), [0]
    async with httpx.AsyncClient(timeout=120) as client:
        tasks = [asyncio.ensure_future(stream(client, server, p, started, counter,
                                              len(prompts))) for p in prompts]
        await asyncio.wait_for(started.wait(), 120)
        action()
        return await asyncio.gather(*tasks, return_exceptions=True)


def test_drafter_killed_mid_stream_outputs_equal_plain(tiny_llama, draft_model):
    ref = LLM(tiny_llama, dtype="float32", device="cpu").generate(
        PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
        use_tqdm=False)
    ref20 = LLM(tiny_llama, dtype="float32", device="cpu").generate(
        PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        use_tqdm=False)
    with RemoteServer(tiny_llama, spec_args(draft_model), served_name=MODEL) as server:
        core = find(server, "vllm.engine.core_proc")
        drafter = find(server, "vllm.spec_decode.draft_process")
        assert drafter.ppid() == core.pid and core.ppid() == server.proc.pid
        texts = asyncio.run(streams_with(server, PROMPTS,
                                         lambda: os.kill(drafter.pid, signal.SIGKILL)))
        assert texts == [r.outputs[0].text for r in ref]
        assert not psutil.pid_exists(drafter.pid) or drafter.status() == psutil.STATUS_ZOMBIE
        assert server.metric("vllm:spec_decode_drafter_num_failures_total") >= 1
        assert server.metric("vllm:spec_decode_drafter_num_restarts_total") >= 1
        # the new drafter serves speculation again once it has loaded (the engine polls it
        # at each step and decodes without speculation meanwhile)
        new = find(server, "vllm.spec_decode.draft_process")
        assert new.pid != drafter.pid
        drafted = server.metric("vllm:spec_decode_num_draft_tokens_total")
        deadline = time.monotonic() + 90
        while server.metric("vllm:spec_decode_num_draft_tokens_total") == drafted:
            assert time.monotonic() < deadline, server.log_tail()
            r = httpx.post(server.url("/v1/completions"), timeout=120, json={
                "model": MODEL, "prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0.0,
                "ignore_eos": True})
            assert r.json()["choices"][0]["text"] == ref20[0].outputs[0].text
        assert f"draft process {new.pid} ready" in server.log_tail(200_000)


def test_engine_core_death_exits_nonzero(tiny_llama):
    server = RemoteServer(tiny_llama, [], served_name=MODEL)
    try:
        core = find(server, "vllm.engine.core_proc")
        t0 = time.monotonic()
        core.kill()
        code = server.proc.wait(timeout=20)
        assert code != 0
        assert time.monotonic() - t0 < 15
        assert "the engine core process exited" in server.log_tail()
    finally:
        server.stop()


def test_sigterm_with_streams_in_flight_exits_cleanly(tiny_llama, draft_model):
    server = RemoteServer(tiny_llama, spec_args(draft_model), served_name=MODEL)
    try:
        find(server, "vllm.spec_decode.draft_process")
        tree = [server.proc.pid] + [p.pid for p in children(server.proc.pid)]
        timing: dict[str, float] = {}

        def terminate() -> None:
            timing["sent"] = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)

        results = asyncio.run(streams_with(server, (PROMPTS * 2)[:16], terminate))
        code = server.proc.wait(timeout=15)
        assert code == 0, server.log_tail()
        assert time.monotonic() - timing["sent"] < 10
        assert len(results) == 16
        leftover = [pid for pid in tree if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert leftover == [], leftover
    finally:
        server.stop()
