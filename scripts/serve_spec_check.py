"""One real `vllm serve` run with speculative decoding (e.g. the target on the GPU, the draft on
the CPU): starts the server with the flags given after `--`, sends concurrent greedy completions,
one streaming completion and one chat-less streamed copy of a greedy request, checks that the
streamed text equals the non-streamed text, reads /metrics with prometheus_client's parser and
prints the spec-decode figures. Exits non-zero when anything fails.

    python scripts/serve_spec_check.py [--requests 16] -- MODEL --speculative-model DRAFT \
        --num-speculative-tokens 4 --cpu-draft-worker [engine flags]"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.entrypoints.utils import free_port  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import numpy as np\n\ndef softmax(x):\n",
           "class Stack:\n    def __init__(self):\n", "def is_prime(n: int) -> bool:\n"]


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"not healthy after {timeout} s")


def complete(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    r = httpx.post(url + "/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0})
    r.raise_for_status()
    return r.json()


def stream(url: str, model: str, prompt: str, max_tokens: int) -> str:
    text = ""
    with httpx.stream("POST", url + "/v1/completions", timeout=300, json={
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("serve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *serve_args,
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m"]
    print("$ vllm serve", " ".join(serve_args), flush=True)
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        start = time.monotonic()
        wait_healthy(proc, url, args.timeout)
        print(f"healthy after {time.monotonic() - start:.0f} s", flush=True)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.requests) as pool:
            results = list(pool.map(lambda p: complete(url, "m", p, args.max_tokens), prompts))
        secs = time.monotonic() - start
        tokens = sum(r["usage"]["completion_tokens"] for r in results)
        print(f"{args.requests} concurrent completions: {tokens} tokens in {secs:.2f} s "
              f"({tokens / secs:.1f} tokens/s)")
        same_prompt = [r["choices"][0]["text"] for p, r in zip(prompts, results)
                       if p == PROMPTS[0]]
        assert len(set(same_prompt)) == 1, "greedy completions of one prompt differ"
        streamed = stream(url, "m", PROMPTS[0], args.max_tokens)
        assert streamed == same_prompt[0], "streamed text differs from the non-streamed text"
        print("streamed text == non-streamed text; repeated greedy prompts agree")
        print("sample:", repr(same_prompt[0][:160]))
        metrics = {s.name: s.value for fam in text_string_to_metric_families(
            httpx.get(url + "/metrics").text) for s in fam.samples}
        spec = {k: v for k, v in metrics.items() if "spec_decode" in k}
        for k, v in sorted(spec.items()):
            print(f"  {k} = {v:g}")
        assert spec.get("vllm:spec_decode_num_draft_tokens_total", 0) > 0, "no drafts counted"
        print("SERVE SPEC CHECK PASSED")
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
