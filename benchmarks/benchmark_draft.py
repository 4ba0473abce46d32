"""The CPU draft's forward, alone: milliseconds per one-token draft forward (the loop the draft
worker runs k times per step) against its floor (the draft's weights plus its KV over the host
memory bandwidth measured with the same thread count), per dtype and thread count, with the
top ops from torch's profiler on request.

    python benchmarks/benchmark_draft.py --model DRAFT [--load-format dummy] \
        [--dtypes float32,bfloat16] [--threads 1,4,16] [--context 256] [--profile]"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floors import step_floor_ms  # noqa: E402
from benchmarks.plot_args import add_plot_args, plot_run  # noqa: E402
from benchmarks.timing import copy_bandwidth_gbps, provenance, write_json  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.core.request import Request  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.engine.tokenizer import get_tokenizer  # noqa: E402
from vllm.model_executor.model_loader.loader import resolve_config  # noqa: E402
from vllm.spec_decode.draft_worker import DraftModelProposer  # noqa: E402


def make_draft(args, dtype: str) -> DraftModelProposer:
    """The draft worker exactly as the engine builds it (on the CPU), for a target that is the
    draft itself."""
    engine_args = EngineArgs(model=args.model, device="cpu", dtype=dtype,
                             load_format=args.load_format,
                             max_model_len=args.context + args.num_forwards + 16,
                             speculative_model=args.model, num_speculative_tokens=1,
                             cpu_draft_worker=True, speculative_draft_dtype=dtype)
    config = resolve_config(engine_args.create_engine_config())
    return DraftModelProposer(config, get_tokenizer(config.model_config))


def time_forwards(draft: DraftModelProposer, args) -> list[float]:
    """ms of each of num_forwards one-token forwards after a context of args.context tokens."""
    vocab = draft.config.hf_config.vocab_size
    reqs = []
    for i in range(args.batch_size):
        ids = torch.randint(0, vocab, (args.context,), generator=torch.Generator().manual_seed(i))
        reqs.append(Request(str(i), None, ids.tolist(), SamplingParams(temperature=0.0), None))
    draft.propose(reqs, [1] * len(reqs)).result()  # the context's forward (a prefill)
    for req in reqs:
        if not draft.block_manager.grow(draft.seqs[req.req_id].block_ids,
                                        args.context + args.num_forwards + 2):
            raise ValueError("the draft's KV cache is too small: raise VLLM_CPU_KVCACHE_SPACE")
    times = []
    with torch.inference_mode():
        for _ in range(args.num_forwards):
            start = time.perf_counter()
            draft._draft(reqs, [1] * len(reqs))
            times.append((time.perf_counter() - start) * 1e3)
    for req in reqs:
        draft.free(req.req_id)
    return times


def main(args) -> dict:
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted(
        {1, 2, 4, 8, 16, os.cpu_count() or 1} & set(range(1, (os.cpu_count() or 1) + 1)))
    rows = []
    for dtype in args.dtypes.split(","):
        draft = make_draft(args, dtype)
        model = draft.runner.model
        for n in threads:
            torch.set_num_threads(n)
            bandwidth = copy_bandwidth_gbps("cpu", 256 << 20)
            floor = step_floor_ms(model, draft.config, args.context * args.batch_size, bandwidth)
            times = time_forwards(draft, args)[args.warmup:]
            median = statistics.median(times)
            rows.append({"dtype": dtype, "threads": n, "ms_per_forward": median,
                         "min": min(times), "max": max(times), "floor_ms": floor,
                         "bandwidth_gbps": bandwidth})
            print(f"{dtype:<9} {n:>3} threads  {median:7.3f} ms per forward "
                  f"(min {min(times):.3f})  floor {floor:.3f} ms  {100 * floor / median:4.0f}% "
                  f"of floor  ({bandwidth:.0f} GB/s)", flush=True)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                time_forwards(draft, args)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        del draft
    result = {"provenance": provenance(), "model": args.model, "context": args.context,
              "batch_size": args.batch_size, "rows": rows}
    write_json(args.output_json, result, args)
    plot_run("draft", result, args)
    return result


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", default=None, help="comma list (default 1, 2, 4, ... all)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--num-forwards", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output-json", default=None)
    add_plot_args(parser)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
