"""Where a GPU target step's time goes, kernel by kernel: for each (batch, tokens per sequence)
the model's forward over a paged KV cache holding --context tokens per sequence is
- timed as the engine runs it (CUDA graph replay, CUDA events, median of --iters), and
- profiled once eagerly (torch.profiler, CUDA kernel time), the kernels grouped by what they do
  (GEMM, attention, norms, rotary, activation, the rest),
beside the floor (weights plus the KV read over the copy bandwidth measured in the same run).
The graph's time minus the kernels' sum is the gaps between kernels.

    python benchmarks/profile_step.py --model MODEL --load-format dummy --dtype bfloat16 \
        --shapes 1x1,1x5,16x1,16x5,32x1 --context 256 [--output-json out.json]"""
import argparse
import os
import re
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floors import kv_bytes_per_token, weight_bytes  # noqa: E402
from benchmarks.timing import copy_bandwidth_gbps, provenance, time_ms, write_json  # noqa: E402
from vllm import LLM  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.worker.cuda_graph import CudaGraphRunner  # noqa: E402

CATEGORIES = (("attention", r"paged_attention|attention|flash|fmha"),
              ("gemm", r"gemm|linear_small|cutlass|nvjet|sm90|sm100|xmma|cublas|splitk"),
              ("norm", r"rms_norm|layer_norm|norm"),
              ("rotary", r"rotary|rope"),
              ("activation", r"silu|gelu|act_and_mul"),
              ("kv write", r"reshape_and_cache|paged_cache|cache_kernel"),
              ("copy/elementwise", r"copy|elementwise|fill|cat|index|gather|vectorized"))


def category(kernel: str) -> str:
    name = kernel.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def set_inputs(g: CudaGraphRunner, b: int, q: int, context: int, block_size: int,
               vocab: int) -> None:
    """Sequence i holds `context` tokens in blocks of its own; the step's q tokens are its
    last ones. KV writes go nowhere (slot -1): every replay reads the same cache."""
    blocks = -(-context // block_size)
    n = b * q
    g.input_ids[:n].random_(0, vocab)
    g.positions[:n].copy_((torch.arange(q, device=g.positions.device) + context - q).repeat(b))
    g.slot_mapping[:n].fill_(-1)
    g.block_tables[:b].zero_()
    g.block_tables[:b, :blocks].copy_(torch.arange(b * blocks, dtype=torch.int32,
                                                   device=g.block_tables.device).view(b, blocks))
    g.context_lens[:b].fill_(context)


def profile_shape(llm: LLM, g: CudaGraphRunner, b: int, q: int, args, bw: float) -> dict:
    engine = llm.llm_engine
    runner = engine.worker.model_runner
    config = engine.config
    vocab = config.hf_config.vocab_size
    block_size = config.cache_config.block_size
    g._capture_one(b, q)
    set_inputs(g, b, q, args.context, block_size, vocab)
    graph = g.graphs[(b, q)]
    replay_ms = time_ms(graph.replay, "cuda", warmup=5, iters=args.iters)["median"]
    md = g._metadata(b, q)
    md.max_context_len = args.context
    n = b * q

    def eager() -> None:
        with set_forward_context(md, g.kv_caches):
            runner.model(g.input_ids[:n], g.positions[:n])

    eager_ms = time_ms(eager, "cuda", warmup=2, iters=5)["median"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        eager()
        torch.cuda.synchronize()
    by_cat: dict[str, float] = defaultdict(float)
    kernels: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            us = evt.device_time if hasattr(evt, "device_time") else evt.cuda_time
            by_cat[category(evt.name)] += us
            kernels[evt.name][0] += us
            kernels[evt.name][1] += 1
    kernel_ms = sum(by_cat.values()) / 1e3
    floor_ms = (weight_bytes(runner.model) + kv_bytes_per_token(config) * args.context * b) / (
        bw * 1e9) * 1e3
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:args.top]
    return {"batch": b, "tokens_per_seq": q, "context": args.context, "graph_ms": replay_ms,
            "eager_ms": eager_ms, "kernel_ms": kernel_ms, "gaps_ms": replay_ms - kernel_ms,
            "floor_ms": floor_ms, "floor_fraction": floor_ms / replay_ms,
            "by_category_ms": {k: v / 1e3
                               for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"name": name[:120], "ms": us / 1e3, "calls": calls}
                            for name, (us, calls) in top]}


def main(args) -> dict:
    engine_kwargs = {k: v for k, v in vars(args).items() if k in EngineArgs.field_names()
                     and v is not None}
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    engine_kwargs.setdefault("max_num_seqs", max(b for b, _ in shapes))
    llm = LLM(**engine_kwargs)
    engine = llm.llm_engine
    runner = engine.worker.model_runner
    mc = engine.config.model_config
    g = CudaGraphRunner(runner.model, runner.kv_caches, max(b for b, _ in shapes),
                        mc.max_model_len, engine.config.cache_config.block_size,
                        torch.device("cuda"), max(q for _, q in shapes))
    bw = copy_bandwidth_gbps("cuda", 2 << 30)
    rows = []
    with torch.inference_mode():
        for b, q in shapes:
            rows.append(profile_shape(llm, g, b, q, args, bw))
    result = {"provenance": provenance(), "copy_bandwidth_gbps": bw, "rows": rows}
    print(f"{'batch':>5}{'q':>3}{'graph ms':>10}{'floor ms':>10}{'% floor':>9}{'kernels':>9}"
          f"{'gaps':>7}  by kind (ms)")
    for r in rows:
        cats = ", ".join(f"{k} {v:.2f}" for k, v in r["by_category_ms"].items())
        print(f"{r['batch']:>5}{r['tokens_per_seq']:>3}{r['graph_ms']:>10.3f}"
              f"{r['floor_ms']:>10.3f}{100 * r['floor_fraction']:>8.0f}%{r['kernel_ms']:>9.3f}"
              f"{r['gaps_ms']:>7.3f}  {cats}")
    for r in rows:
        print(f"-- batch {r['batch']} x {r['tokens_per_seq']}: top kernels")
        for k in r["top_kernels"]:
            print(f"   {k['ms']:8.3f} ms {k['calls']:>4}x  {k['name']}")
    write_json(args.output_json, result, args)
    return result


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="1x1,1x5,16x1,16x5,32x1",
                        help="batch x tokens per sequence, comma separated")
    parser.add_argument("--context", type=int, default=256,
                        help="tokens each sequence holds in the KV cache")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
