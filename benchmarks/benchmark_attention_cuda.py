"""vllm._C's paged_attention on CUDA alone: microseconds per call for decode and short
verification cases at the Llama-2-7B (32 heads) and CodeLlama-34B (64 heads over 8 KV heads)
attention shapes, each timed as a CUDA graph of one call per layer (every layer its own
cache, so nothing is served from L2; best of 5 replays), per setting of the kernel's
environment switches (read at each call, so each setting is captured apart). Floor: the K/V
bytes the calls read over the copy bandwidth measured here. max_context_len is what the
engine's CUDA graphs pass (--max-context, unless a case's context is longer).

    python -m benchmarks.benchmark_attention_cuda [--variants "default VLLM_CUDA_ATTN_COMBINE=kernel"]
"""
import argparse
import os

import torch

from benchmarks.benchmark_gemv_cuda import graph_seconds
from benchmarks.timing import copy_bandwidth_gbps, provenance, write_json
from vllm import _custom_ops as ops

# name -> (num_heads, num_kv_heads, head_size)
SHAPES = {"7b": (32, 32, 128), "34b": (64, 8, 128)}
# (shape, batch, tokens per sequence, context)
CASES = [("7b", 1, 1, 64), ("7b", 1, 1, 256), ("7b", 1, 1, 1024), ("7b", 1, 1, 4096),
         ("7b", 1, 5, 256), ("7b", 16, 5, 256), ("7b", 32, 1, 256), ("34b", 1, 1, 256)]


def case_inputs(shape: str, batch: int, q: int, ctx: int, layers: int, block_size: int,
                dtype: torch.dtype) -> tuple[list, float]:
    """Per layer: (out, query, key cache, value cache, block tables, context lens, query start
    locations); and the K/V bytes one call reads."""
    heads, kv_heads, hs = SHAPES[shape]
    blocks = -(-ctx // block_size)
    tables = torch.arange(batch * blocks, dtype=torch.int32, device="cuda").view(batch, blocks)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    qsl = torch.arange(0, (batch + 1) * q, q, dtype=torch.int32, device="cuda")
    per_layer = []
    for _ in range(layers):
        cache = (batch * blocks, kv_heads, block_size, hs)
        query = torch.randn(batch * q, heads, hs, dtype=dtype, device="cuda")
        per_layer.append((torch.empty_like(query), query,
                          torch.randn(cache, dtype=dtype, device="cuda"),
                          torch.randn(cache, dtype=dtype, device="cuda"), tables, lens, qsl))
    kv_bytes = 2 * batch * ctx * kv_heads * hs * torch.finfo(dtype).bits // 8
    return per_layer, kv_bytes


def run(args) -> dict:
    bw = copy_bandwidth_gbps("cuda", 1 << 30)
    rows = []
    for variant in args.variants.split():
        settings = {} if variant == "default" else dict(
            kv.split("=", 1) for kv in variant.split(","))
        saved = {k: os.environ.get(k) for k in settings}
        os.environ.update(settings)
        try:
            for shape, batch, q, ctx in CASES:
                layers, kv_bytes = case_inputs(shape, batch, q, ctx, args.layers, 16,
                                               torch.bfloat16)
                max_ctx = max(ctx, args.max_context)
                scale = SHAPES[shape][2] ** -0.5

                def step(layers=layers, max_ctx=max_ctx, scale=scale):
                    for out, *rest in layers:
                        ops.paged_attention(out, *rest, max_ctx, scale)

                us = graph_seconds(step) / args.layers * 1e6
                floor_us = kv_bytes / (bw * 1e9) * 1e6
                rows.append({"variant": variant, "shape": shape, "batch": batch, "q": q,
                             "context": ctx, "us": us, "floor_us": floor_us})
                print(f"{variant:40s} {shape:4s} b{batch:<3d} q{q} ctx {ctx:5d}: {us:7.2f} us "
                      f"(floor {floor_us:6.2f} us, x{us / floor_us:5.1f})", flush=True)
                del layers
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return {"provenance": provenance(), "copy_bandwidth_gbps": bw, "rows": rows}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="default",
                        help="space-separated settings, each 'default' or comma-joined "
                             "VAR=value (VLLM_CUDA_ATTN_*: vllm/envs.py)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--max-context", type=int, default=1024,
                        help="max_context_len passed (as a graph captured for it would)")
    parser.add_argument("--output-json", default=None)
    return parser


if __name__ == "__main__":
    a = make_parser().parse_args()
    result = run(a)
    write_json(a.output_json, result, a)
