"""linear_small (vllm._C's GEMV) against torch's GEMM (cuBLAS) on CUDA at few rows: per
Llama-2-7B weight shape, and over a whole 7B decode step's weights (32 layers of qkv, o,
gate_up, down, plus the LM head, distinct tensors so nothing is served from L2), each timed as
one CUDA graph (best of 5 replays). Floor: the bytes over the copy bandwidth measured here.

    python -m benchmarks.benchmark_gemv_cuda [--rows 1,2,3,4,8] [--dtype bfloat16]
"""
import argparse

import torch
import torch.nn.functional as F

from benchmarks.timing import copy_bandwidth_gbps
from vllm import _custom_ops as ops

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096),
          "down": (4096, 11008), "lm_head": (32000, 4096)}


def graph_seconds(fn, reps: int = 5) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,8")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth_gbps("cuda", 1 << 30) * 1e9
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * dtype.itemsize
        weights = [torch.empty(n, k, dtype=dtype, device="cuda").uniform_(-0.02, 0.02)
                   for _ in range(max(2, (2 << 30) // nbytes))]  # 2 GiB: past L2
        cells = []
        for m in rows:
            x = torch.randn(m, k, dtype=dtype, device="cuda")
            out = torch.empty(m, n, dtype=dtype, device="cuda")
            ours = graph_seconds(lambda: [ops.linear_small(out, x, w, None) for w in weights])
            cublas = graph_seconds(lambda: [torch.mm(x, w.t(), out=out) for w in weights])
            ops.linear_small(out, x, weights[0], None)
            err = (out.float() - F.linear(x.float(), weights[0].float())).abs().max().item()
            per = len(weights)
            cells.append(f"M={m}: {nbytes * per / ours / 1e12:.2f} vs "
                         f"{nbytes * per / cublas / 1e12:.2f} TB/s (max err {err:.0e})")
        print(f"{name:8} " + " | ".join(cells))
        del weights
        torch.cuda.empty_cache()
    layers = [torch.empty(n, k, dtype=dtype, device="cuda").uniform_(-0.02, 0.02)
              for _ in range(32) for n, k in (SHAPES["qkv"], SHAPES["o"], SHAPES["gate_up"],
                                              SHAPES["down"])]
    layers.append(torch.empty(*SHAPES["lm_head"], dtype=dtype, device="cuda").uniform_(-0.02, 0.02))
    total = sum(w.numel() * dtype.itemsize for w in layers)
    floor = total / bandwidth * 1e3
    for m in rows:
        xs = {k: torch.randn(m, k, dtype=dtype, device="cuda") for k in (4096, 11008)}
        outs = {id(w): torch.empty(m, w.shape[0], dtype=dtype, device="cuda") for w in layers}
        ours = graph_seconds(lambda: [ops.linear_small(outs[id(w)], xs[w.shape[1]], w, None)
                                      for w in layers]) * 1e3
        cublas = graph_seconds(lambda: [torch.mm(xs[w.shape[1]], w.t(), out=outs[id(w)])
                                        for w in layers]) * 1e3
        print(f"7B step, {m} rows: {total / 1e9:.2f} GB of weights; linear_small {ours:.3f} ms "
              f"({ours / floor:.2f}x floor), cuBLAS {cublas:.3f} ms ({cublas / floor:.2f}x); "
              f"floor {floor:.3f} ms")


if __name__ == "__main__":
    main()
