"""Where a prefill step's time goes (a served request's TTFT): prompts of --input-len tokens, in
batches of --batches prompts, each run as one engine step (max_tokens=1). Per batch: the
engine's own timing of the step by phase (StepTimer, median over --iters runs), the step's
wall time against the GPU time of its kernels (torch.profiler, one run), and the ops that
took the most CPU time and the kernels that took the most GPU time. The floor beside it: the
weights over the copy bandwidth measured in the same run (one pass over them).

    python benchmarks/profile_prefill.py --model MODEL --load-format dummy --dtype bfloat16 \
        --input-len 128 --batches 1,4 [--output-json out.json]"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floors import weight_bytes  # noqa: E402
from benchmarks.timing import copy_bandwidth_gbps, provenance, write_json  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.engine.step_timer import per_step_ms  # noqa: E402


def prompts(batch: int, length: int, vocab: int, offset: int) -> list[dict]:
    """Distinct prompts of one length (the vocabulary's ids past the first 10)."""
    return [{"prompt_token_ids": [(offset * 7919 + i * 131 + j * 17) % (vocab - 10) + 10
                                  for j in range(length)]} for i in range(batch)]


def profile_batch(llm: LLM, batch: int, args, vocab: int) -> dict:
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    run = iter(range(10**6))
    for _ in range(3):  # warm-up: the shapes' first calls
        llm.generate(prompts(batch, args.input_len, vocab, next(run)), params, use_tqdm=False)
    walls, steps = [], []
    for _ in range(args.iters):
        before = engine.step_timer.as_dict()
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(prompts(batch, args.input_len, vocab, next(run)), params, use_tqdm=False)
        walls.append(1e3 * (time.perf_counter() - start))
        steps.append(per_step_ms(before, engine.step_timer.as_dict()))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        llm.generate(prompts(batch, args.input_len, vocab, next(run)), params, use_tqdm=False)
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    cpu_ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    gpu_ms = sum(e.self_device_time_total for e in kernels) / 1e3
    phases = {k: statistics.median(s[k] for s in steps)
              for k in steps[0] if k.endswith("_ms") and steps[0][k] is not None}
    return {
        "batch": batch, "input_len": args.input_len, "wall_ms": statistics.median(walls),
        "engine_step_ms": phases.get("prefill_step_ms"), "phases_ms": phases,
        "gpu_kernel_ms_profiled": gpu_ms,
        "top_cpu_ops": [{"name": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                         "calls": e.count}
                        for e in sorted(cpu_ops, key=lambda e: -e.self_cpu_time_total)[:15]],
        "top_kernels": [{"name": e.key[:120], "ms": e.self_device_time_total / 1e3,
                         "calls": e.count}
                        for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:12]],
    }


def main(args) -> dict:
    llm = LLM(**{k: v for k, v in vars(args).items() if k in EngineArgs.field_names()
                 and v is not None})
    engine = llm.llm_engine
    vocab = engine.config.hf_config.vocab_size
    bw = copy_bandwidth_gbps("cuda", 2 << 30)
    floor_ms = weight_bytes(engine.worker.model_runner.model) / (bw * 1e9) * 1e3
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        row = profile_batch(llm, batch, args, vocab)
        rows.append(row)
        print(f"== {batch} prompt(s) x {args.input_len} tokens: wall {row['wall_ms']:.2f} ms, "
              f"engine step {row['engine_step_ms'] or 0:.2f} ms, kernels "
              f"{row['gpu_kernel_ms_profiled']:.2f} ms (profiled run), weights floor "
              f"{floor_ms:.2f} ms")
        print("   phases: " + " ".join(f"{k[:-3]} {v:.2f}" for k, v in row["phases_ms"].items()
                                        if not k.endswith("step_ms")))
        for e in row["top_cpu_ops"][:10]:
            print(f"   cpu {e['self_cpu_ms']:8.3f} ms {e['calls']:5d}x  {e['name'][:90]}")
        for e in row["top_kernels"][:8]:
            print(f"   gpu {e['ms']:8.3f} ms {e['calls']:5d}x  {e['name'][:90]}")
    return {"provenance": provenance(), "copy_bandwidth_gbps": bw, "weights_floor_ms": floor_ms,
            "rows": rows}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    EngineArgs.add_cli_args(parser)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--output-json", default=None)
    return parser


if __name__ == "__main__":
    a = make_parser().parse_args()
    write_json(a.output_json, main(a), a)
