"""Where a prefill step's time goes (a served request's TTFT): prompts of --input-len tokens, in
batches of --batches prompts, each run as one engine step (max_tokens=1), alone or, with
--decoding N, beside N requests that decode (a mixed step, as a prompt arriving at a busy
server gets). Per batch: the engine's own timing of the step by phase (StepTimer, median over
--iters runs), the step's wall time against the GPU time of its kernels (torch.profiler, one
run), and the ops that took the most CPU time and the kernels that took the most GPU time. The
floor beside it: the weights over the copy bandwidth measured in the same run (one pass).

    python benchmarks/profile_prefill.py --model MODEL --load-format dummy --dtype bfloat16 \
        --input-len 128 --batches 1,4 [--decoding 16] [--output-json out.json]"""
import argparse
import contextlib
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


def prompt_step(engine, batch: int, args, vocab: int, run: int, profile=None) -> tuple:
    """Starts args.decoding requests (their prefill runs first: they then decode), adds batch
    prompts and runs the one step that prefills them (beside the decodes); the rest is aborted.
    The step's wall ms and its StepTimer figures; profile: a context to run the step in."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    if args.decoding:
        busy = SamplingParams(max_tokens=1024, temperature=0.0, ignore_eos=True)
        for i, p in enumerate(prompts(args.decoding, args.input_len, vocab, 10**6 + run)):
            engine.add_request(f"d{run}-{i}", p, busy)
        engine.step()
    for i, p in enumerate(prompts(batch, args.input_len, vocab, run)):
        engine.add_request(f"p{run}-{i}", p, params)
    before = engine.step_timer.as_dict()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    with profile or contextlib.nullcontext():
        engine.step()
        sync()
    wall = 1e3 * (time.perf_counter() - start)
    timed = per_step_ms(before, engine.step_timer.as_dict())
    engine.abort_request([f"d{run}-{i}" for i in range(args.decoding)] +
                         [f"p{run}-{i}" for i in range(batch)])
    return wall, timed


def profile_batch(llm: LLM, batch: int, args, vocab: int) -> dict:
    engine = llm.llm_engine
    run = iter(range(10**6))
    for _ in range(3):  # warm-up: the shapes' first calls
        prompt_step(engine, batch, args, vocab, next(run))
    walls, steps = [], []
    for _ in range(args.iters):
        wall, timed = prompt_step(engine, batch, args, vocab, next(run))
        walls.append(wall)
        steps.append(timed)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = torch.profiler.profile(activities=activities)
    prompt_step(engine, batch, args, vocab, next(run), prof)
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    cpu_ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    gpu_ms = sum(e.self_device_time_total for e in kernels) / 1e3
    phases = {k: statistics.median(s[k] for s in steps)
              for k in steps[0] if k.endswith("_ms") and steps[0][k] is not None}
    return {
        "batch": batch, "input_len": args.input_len, "decoding": args.decoding,
        "wall_ms": statistics.median(walls),
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
    model = engine.worker.model_runner.model
    device = next(model.parameters()).device.type
    bw = copy_bandwidth_gbps(device, (2 << 30) if device == "cuda" else 1 << 28)
    floor_ms = weight_bytes(model) / (bw * 1e9) * 1e3
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        row = profile_batch(llm, batch, args, vocab)
        rows.append(row)
        beside = f" beside {args.decoding} decoding" if args.decoding else ""
        print(f"== {batch} prompt(s) x {args.input_len} tokens{beside}: wall "
              f"{row['wall_ms']:.2f} ms, engine step {row['engine_step_ms'] or 0:.2f} ms, kernels "
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
    parser.add_argument("--decoding", type=int, default=0,
                        help="requests decoding in the profiled step beside the prompts")
    parser.add_argument("--output-json", default=None)
    return parser


if __name__ == "__main__":
    a = make_parser().parse_args()
    write_json(a.output_json, main(a), a)
