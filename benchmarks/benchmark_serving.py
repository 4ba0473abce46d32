"""Online serving: requests sent to a running `vllm serve` at Poisson arrivals (--request-rate
per second, inf = all at once), streamed from /v1/completions; reports throughput and the TTFT
(time to first token), TPOT (time per output token after the first) and ITL (inter-token latency)
percentiles; --output-json writes every figure.

    python benchmarks/benchmark_serving.py --base-url http://127.0.0.1:8000 --model NAME \
        --num-prompts 100 --request-rate 4 --input-len 128 --output-len 128"""
import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.plot_args import add_plot_args, plot_run  # noqa: E402
from benchmarks.timing import provenance, write_json  # noqa: E402

PERCENTILES = [50, 90, 99]


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    num_output_tokens: int = 0


async def send(client: httpx.AsyncClient, args, prompt) -> RequestResult:
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.output_len,
            "temperature": args.temperature, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    result = RequestResult()
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                # a chunk with a choice brings tokens even when its text is empty (the server
                # holds back bytes that do not yet decode): counting only chunks with text gave
                # a TTFT of 0 when no token of a request decoded to text
                if chunk.get("choices"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.num_output_tokens = chunk["usage"]["completion_tokens"]
        result.latency = time.perf_counter() - start
        result.ok = True
    except httpx.HTTPError as e:
        result.error = repr(e)
    return result


def make_prompts(args, rng: np.random.Generator) -> list:
    """Random token ids of --input-len, or HumanEval's prompts as text (cycled)."""
    if args.dataset == "humaneval":
        from benchmarks.benchmark_spec_decode import humaneval_prompts
        texts = humaneval_prompts(min(args.num_prompts, 164))
        return [texts[i % len(texts)] for i in range(args.num_prompts)]
    return [rng.integers(0, args.vocab_size, args.input_len).tolist()
            for _ in range(args.num_prompts)]


async def run(args) -> list[RequestResult]:
    rng = np.random.default_rng(args.seed)
    prompts = make_prompts(args, rng)
    # --max-concurrency: that many clients, each sending its next request when one ends
    slots = asyncio.Semaphore(args.max_concurrency or len(prompts))

    async def limited(client, prompt):
        async with slots:
            return await send(client, args, prompt)

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.num_prompts)
    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=args.timeout,
                                 limits=limits) as client:
        tasks = []
        with tqdm(total=len(prompts), desc="requests", disable=len(prompts) < 2) as bar:
            for prompt in prompts:
                task = asyncio.create_task(limited(client, prompt))
                task.add_done_callback(lambda _: bar.update())
                tasks.append(task)
                if args.request_rate != float("inf"):
                    await asyncio.sleep(rng.exponential(1.0 / args.request_rate))
            return await asyncio.gather(*tasks)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {str(p): None for p in PERCENTILES} | {"mean": None}
    arr = np.asarray(values) * 1e3  # ms
    return {str(p): float(np.percentile(arr, p)) for p in PERCENTILES} | {"mean": float(arr.mean())}


def main(args) -> dict:
    start = time.perf_counter()
    results = asyncio.run(run(args))
    elapsed = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    tpot = [(r.latency - r.ttft) / (r.num_output_tokens - 1) for r in ok if r.num_output_tokens > 1]
    summary = {"provenance": provenance(), "duration_s": elapsed, "completed": len(ok),
               "failed": len(results) - len(ok),
               "errors": sorted({r.error for r in results if not r.ok})[:5],
               "request_throughput": len(ok) / elapsed,
               "output_throughput": sum(r.num_output_tokens for r in ok) / elapsed,
               "ttft_ms": percentiles([r.ttft for r in ok]), "tpot_ms": percentiles(tpot),
               "itl_ms": percentiles([x for r in ok for x in r.itl])}
    print(f"completed {len(ok)}/{len(results)} in {elapsed:.2f} s: "
          f"{summary['request_throughput']:.2f} req/s, {summary['output_throughput']:.1f} "
          "output tokens/s")
    for name in ("ttft_ms", "tpot_ms", "itl_ms"):
        row = summary[name]
        print(f"{name:<8}" + "".join(f"  p{p} {row[str(p)] or 0:.1f}" for p in PERCENTILES))
    write_json(args.output_json, summary, args)
    plot_run("serving", summary, args)
    return summary


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="at most this many requests in flight (clients)")
    parser.add_argument("--dataset", choices=["random", "humaneval"], default="random",
                        help="random token ids of --input-len, or HumanEval prompts as text")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=1000,
                        help="random prompt token ids are drawn below this")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--label", default=None,
                        help="names the server's configuration (one line per label in --plot)")
    add_plot_args(parser, several=True)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
