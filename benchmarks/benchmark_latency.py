"""Latency of one batch of requests, end to end, with vLLM's flags and output.

    python benchmarks/benchmark_latency.py --model MODEL [--load-format dummy] --batch-size 8 \
        --input-len 128 --output-len 128 [--hf-baseline] [--output-json out.json]

Prints "Avg latency: ... seconds" and the percentiles, tokens/s, the decode step time (from a
prefill-only run and the full run) against its floor (weight + KV bytes over the memory bandwidth
measured in this run), and with --hf-baseline the same figures for Hugging Face transformers."""
import argparse
import os
import sys
import time


# torch's CPU allocations on huge pages, as in the engine's own processes (vllm/huge_pages.py)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.hf_baseline import hf_generate_latency, load_hf_model  # noqa: E402
from benchmarks.floors import step_floor_ms  # noqa: E402
from benchmarks.plot_args import add_plot_args, plot_run  # noqa: E402
from benchmarks.timing import copy_bandwidth_gbps, provenance, write_json  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.engine.step_timer import per_step_ms, phases_line  # noqa: E402
from vllm.spec_decode.metrics import SpecDecodeMetrics  # noqa: E402

PERCENTILES = [10, 25, 50, 75, 90, 99]


def run_engine(llm: LLM, args, output_len: int, iters: int, desc: str) -> list[float]:
    vocab = llm.llm_engine.config.hf_config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(0, vocab, args.input_len).tolist()}
               for _ in range(args.batch_size)]
    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=1.0, ignore_eos=True,
                            max_tokens=output_len, detokenize=False)
    for _ in range(args.num_iters_warmup):
        llm.generate(prompts, params, use_tqdm=False)
    latencies = []
    for _ in tqdm(range(iters), desc=desc, disable=iters < 2):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    return latencies


def decode_floor_ms(llm: LLM, args, bandwidth_gbps: float) -> float:
    """Bytes one decode step must read (all weights, the batch's mean KV) over the bandwidth."""
    engine = llm.llm_engine
    mean_context = (args.input_len + args.output_len / 2) * args.batch_size * args.n
    return step_floor_ms(engine.worker.model_runner.model, engine.config, mean_context,
                         bandwidth_gbps)


def summarize(latencies: list[float], prefill: list[float], args) -> dict:
    avg = float(np.mean(latencies))
    decode_ms = (np.median(latencies) - np.median(prefill)) / max(args.output_len - 1, 1) * 1e3
    if decode_ms <= 0:  # the prefill-only runs took as long as the full ones: noise, no figure
        decode_ms = float("nan")
    return {"avg_latency": avg, "latencies": latencies,
            "percentiles": {str(p): float(np.percentile(latencies, p)) for p in PERCENTILES},
            "tokens_per_s": args.batch_size * args.n * args.output_len / float(
                np.median(latencies)),
            "prefill_latency": float(np.median(prefill)), "decode_step_ms": float(decode_ms)}


def main(args) -> dict:
    engine_kwargs = {k: v for k, v in vars(args).items() if k in EngineArgs.field_names()}
    llm = LLM(**engine_kwargs)
    device = str(llm.llm_engine.config.device.type)
    result = {"provenance": provenance(), "device": device}
    bandwidth = copy_bandwidth_gbps(device, (2 << 30) if device == "cuda" else (256 << 20))
    prefill = run_engine(llm, args, 1, args.num_iters, "prefill-only")
    engine = llm.llm_engine
    engine.spec_metrics = SpecDecodeMetrics()
    timer_before = engine.step_timer.as_dict()
    latencies = run_engine(llm, args, args.output_len, args.num_iters, "engine")
    result["engine"] = summarize(latencies, prefill, args)
    result["engine"]["engine_steps"] = per_step_ms(timer_before, engine.step_timer.as_dict())
    if engine.proposer is not None:
        result["engine"]["spec_decode"] = engine.spec_metrics.as_dict(
            engine.spec_config.num_speculative_tokens)
        controller = engine.spec.controller
        if controller is not None:
            result["engine"]["controller"] = controller.as_dict() | dict(
                k_histogram=list(controller.k_histogram))
    result["copy_bandwidth_gbps"] = bandwidth
    result["decode_floor_ms"] = decode_floor_ms(llm, args, bandwidth)
    if args.hf_baseline:
        config = llm.llm_engine.config
        dtype, dummy = config.torch_dtype, config.model_config.load_format == "dummy"
        hf_config = config.hf_config
        del llm
        torch.cuda.empty_cache() if device == "cuda" else None
        hf = load_hf_model(args.model, hf_config, dtype, device, dummy)
        hf_full = hf_generate_latency(hf, args.batch_size * args.n, args.input_len,
                                      args.output_len, device, args.num_iters)
        hf_prefill = hf_generate_latency(hf, args.batch_size * args.n, args.input_len, 1, device,
                                         args.num_iters)
        result["hf_transformers"] = summarize(hf_full, hf_prefill, args)
    # vLLM's benchmark_latency.py writes these three at the top level: the engine's, here
    result = {key: result["engine"][key] for key in ("avg_latency", "latencies", "percentiles")
              } | result
    print_report(result)
    write_json(args.output_json, result, args)
    plot_run("latency", result, args)
    return result


def print_report(result: dict) -> None:
    eng = result["engine"]
    print(f"Avg latency: {eng['avg_latency']:.4f} seconds")
    for p, v in eng["percentiles"].items():
        print(f"{p}% percentile latency: {v:.4f} seconds")
    print(f"\n{'':<18}{'tokens/s':>10}{'decode ms':>11}{'floor ms':>10}{'% floor':>9}")
    floor = result["decode_floor_ms"]
    for name in ("engine", "hf_transformers"):
        if name in result:
            r = result[name]
            print(f"{name:<18}{r['tokens_per_s']:>10.1f}{r['decode_step_ms']:>11.2f}"
                  f"{floor:>10.2f}{100 * floor / r['decode_step_ms']:>8.0f}%")
    if any(np.isnan(result[n]["decode_step_ms"]) for n in ("engine", "hf_transformers")
           if n in result):
        print("(nan: the prefill-only runs took as long as the full runs, so no decode time "
              "can be told apart in this run)")
    print(f"(floor: weights + mean KV bytes over {result['copy_bandwidth_gbps']:.0f} GB/s "
          f"measured on {result['device']} in this run; decode ms = one decode step, a token "
          f"for every sequence)")
    print(f"engine, ms per step (warm-up and timed runs): {phases_line(eng['engine_steps'])}"
          + (f"; k chosen {eng['controller']['k_histogram']}" if "controller" in eng else ""))
    spec = eng.get("spec_decode")
    if spec:
        print(f"spec decode: acceptance {spec['acceptance_rate']:.3f}, tokens per target forward "
              f"{spec['mean_accepted_length']:.2f}, system efficiency "
              f"{spec['system_efficiency']:.3f}, draft {spec['draft_time_s']:.2f} s, verify "
              f"{spec['verify_time_s']:.2f} s")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-iters-warmup", type=int, default=1)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--hf-baseline", action="store_true",
                        help="also time Hugging Face transformers eager generation")
    parser.add_argument("--output-json", type=str, default=None)
    add_plot_args(parser, several=True)
    EngineArgs.add_cli_args(parser)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
