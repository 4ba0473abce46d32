"""Offline throughput: many requests at once through LLM.generate, random prompts (or one per line
of --dataset), every engine flag accepted (speculative decoding included). Prints requests/s and
tokens/s last; --output-json writes them with the provenance.

    python benchmarks/benchmark_throughput.py --model MODEL --num-prompts 200 --input-len 128 \
        --output-len 128 [--dataset prompts.txt] [--output-json out.json]"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import provenance, write_json  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402


def make_prompts(args, vocab_size: int) -> list:
    if args.dataset:
        with open(args.dataset) as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        if not lines:
            raise ValueError(f"--dataset {args.dataset} has no prompts")
        return [lines[i % len(lines)] for i in range(args.num_prompts)]
    rng = np.random.default_rng(getattr(args, "seed", 0))
    return [{"prompt_token_ids": rng.integers(0, vocab_size, args.input_len).tolist()}
            for _ in range(args.num_prompts)]


def main(args) -> dict:
    engine_kwargs = {k: v for k, v in vars(args).items() if k in EngineArgs.field_names()}
    llm = LLM(**engine_kwargs)
    prompts = make_prompts(args, llm.llm_engine.config.hf_config.vocab_size)
    params = SamplingParams(n=args.n, temperature=args.temperature, ignore_eos=True,
                            max_tokens=args.output_len, detokenize=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    num_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    num_out = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    result = {"provenance": provenance(), "elapsed_s": elapsed,
              "requests_per_s": len(outputs) / elapsed,
              "output_tokens_per_s": num_out / elapsed,
              "total_tokens_per_s": (num_prompt + num_out) / elapsed,
              "num_requests": len(outputs), "num_output_tokens": num_out}
    spec = llm.llm_engine.spec_metrics
    if llm.llm_engine.proposer is not None:
        result["spec_decode"] = spec.as_dict(llm.llm_engine.spec_config.num_speculative_tokens)
    print(f"Throughput: {result['requests_per_s']:.2f} requests/s, "
          f"{result['total_tokens_per_s']:.1f} total tokens/s, "
          f"{result['output_tokens_per_s']:.1f} output tokens/s")
    write_json(args.output_json, result, args)
    return result


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--dataset", type=str, default=None, help="a text file, one prompt a line")
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--output-json", type=str, default=None)
    EngineArgs.add_cli_args(parser)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
