"""Each vllm._C op against the plain-torch version of the same computation on the same input,
and against the memory-bandwidth floor (bytes the op must move / copy bandwidth measured in this
run). Runs on the CPU, on CUDA, or both; prints a table last; --output-json writes every figure.

    python benchmarks/benchmark_kernels.py --device cpu [--dtype bfloat16] [--output-json f.json]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import copy_bandwidth_gbps, provenance, time_ms  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402
from vllm.model_executor.attention import paged_attention as pa  # noqa: E402
from vllm.model_executor.layers.layernorm import RMSNorm  # noqa: E402
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding  # noqa: E402


def cases(device: str, dtype: torch.dtype, scale: int):
    """Yields (name, shape note, kernel fn, torch fn, bytes moved). scale shrinks for smoke runs."""
    elem = torch.finfo(dtype).bits // 8
    kw = dict(device=device, dtype=dtype)
    n, h = 4096 // scale, 4096 // scale
    x = torch.randn(n, h, **kw)
    norm = RMSNorm(h).to(**kw)
    out = torch.empty_like(x)
    yield ("rms_norm", f"[{n}, {h}]", lambda: ops.rms_norm(out, x, norm.weight, 1e-6),
           lambda: norm.forward_native(x), 2 * n * h * elem)
    res = torch.randn(n, h, **kw)
    yield ("fused_add_rms_norm", f"[{n}, {h}]",
           lambda: ops.fused_add_rms_norm(x, res, norm.weight, 1e-6),
           lambda: norm.forward_native(x, res), 4 * n * h * elem)
    d = 11008 // scale
    g = torch.randn(n // 4, 2 * d, **kw)
    act_out = torch.empty(n // 4, d, **kw)
    yield ("silu_and_mul", f"[{n // 4}, 2*{d}]", lambda: ops.silu_and_mul(act_out, g),
           lambda: F.silu(g[:, :d]) * g[:, d:], 3 * (n // 4) * d * elem)
    heads, kv_heads, hd = 32, 8, 128
    rope = RotaryEmbedding(hd, hd, 8192, 10000.0, True, dtype).to(device)
    q = torch.randn(n, heads * hd, **kw)
    k = torch.randn(n, kv_heads * hd, **kw)
    pos = torch.randint(0, 8192, (n,), device=device)
    yield ("rotary_embedding", f"{n} tok, {heads}/{kv_heads}x{hd}",
           lambda: ops.rotary_embedding(pos, q, k, hd, rope.cos_sin_cache, True),
           lambda: rope.forward_native(pos, q, k),
           2 * n * (heads + kv_heads) * hd * elem + n * hd * elem)
    block = 16
    num_blocks = 2 * n // block
    kc = torch.zeros(num_blocks, kv_heads, block, hd, **kw)
    vc = torch.zeros_like(kc)
    kk, vv = torch.randn(n, kv_heads, hd, **kw), torch.randn(n, kv_heads, hd, **kw)
    slots = torch.randperm(num_blocks * block, device=device)[:n]
    yield ("reshape_and_cache", f"{n} tok, {kv_heads}x{hd}",
           lambda: ops.reshape_and_cache(kk, vv, kc, vc, slots),
           lambda: pa.reshape_and_cache_native(kk, vv, kc, vc, slots),
           4 * n * kv_heads * hd * elem)
    layers, pairs = 8, min(64, num_blocks // 2)
    kcs = [torch.randn(num_blocks, kv_heads, block, hd, **kw) for _ in range(layers)]
    vcs = [torch.randn_like(c) for c in kcs]
    perm = torch.randperm(num_blocks, device=device)
    mapping = torch.stack([perm[:pairs], perm[pairs:2 * pairs]], 1)
    block_bytes = kv_heads * block * hd * elem
    yield ("copy_blocks", f"{layers} layers x {pairs} blocks",
           lambda: ops.copy_blocks(kcs, vcs, mapping),
           lambda: pa.copy_blocks_native(kcs, vcs, mapping), 4 * layers * pairs * block_bytes)
    for label, batch, q_len, ctx in (("decode", 8, 1, 1024 // scale),
                                     ("verify k=4", 8, 5, 1024 // scale)):
        nb = batch * math.ceil(ctx / block)
        akc = torch.randn(nb, kv_heads, block, hd, **kw)
        avc = torch.randn_like(akc)
        tables = torch.randperm(nb, device=device).view(batch, -1).to(torch.int32)
        ctx_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        qsl = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device=device)
        aq = torch.randn(batch * q_len, heads, hd, **kw)
        aout = torch.empty_like(aq)
        args = (aq, akc, avc, tables, ctx_lens, qsl)
        yield (f"paged_attention {label}", f"B={batch} ctx={ctx} {heads}/{kv_heads}x{hd}",
               lambda args=args, aout=aout, ctx=ctx: ops.paged_attention(aout, *args, ctx, 0.1),
               lambda args=args: pa.paged_attention_native(*args, 0.1),
               2 * batch * ctx * kv_heads * hd * elem + 2 * aq.numel() * elem)


def run(device: str, dtype: torch.dtype, iters: int, scale: int) -> dict:
    bandwidth = copy_bandwidth_gbps(device, (2 << 30) if device == "cuda" else (256 << 20) // scale)
    rows = []
    for name, shape, kernel, native, nbytes in cases(device, dtype, scale):
        t_kernel = time_ms(kernel, device, iters=iters)
        t_torch = time_ms(native, device, iters=iters)
        floor_ms = nbytes / (bandwidth * 1e9) * 1e3
        rows.append({"op": name, "shape": shape, "kernel_ms": t_kernel, "torch_ms": t_torch,
                     "floor_ms": floor_ms, "bytes": nbytes,
                     "speedup_vs_torch": t_torch["median"] / t_kernel["median"],
                     "floor_over_kernel": floor_ms / t_kernel["median"]})
    return {"device": device, "dtype": str(dtype).replace("torch.", ""),
            "copy_bandwidth_gbps": bandwidth, "rows": rows}


def print_table(result: dict) -> None:
    print(f"\n{result['device']} {result['dtype']}: copy bandwidth "
          f"{result['copy_bandwidth_gbps']:.1f} GB/s (read + write), medians of repeated runs")
    print(f"{'op':<28}{'shape':<28}{'kernel ms':>10}{'torch ms':>10}{'vs torch':>9}"
          f"{'floor ms':>10}{'% floor':>8}")
    for r in result["rows"]:
        print(f"{r['op']:<28}{r['shape']:<28}{r['kernel_ms']['median']:>10.3f}"
              f"{r['torch_ms']['median']:>10.3f}{r['speedup_vs_torch']:>8.2f}x"
              f"{r['floor_ms']:>10.3f}{100 * r['floor_over_kernel']:>7.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default="bfloat16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="small shapes, for a smoke test")
    parser.add_argument("--output-json", type=str, default=None)
    args = parser.parse_args()
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    results = {"provenance": provenance(), "runs": []}
    for device in devices:
        dtype = getattr(torch, args.dtype)
        if device == "cpu" and dtype == torch.float16:
            dtype = torch.bfloat16  # the CPU kernels are fp32/bf16
        results["runs"].append(run(device, dtype, args.iters, 16 if args.quick else 1))
    for result in results["runs"]:
        print_table(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
