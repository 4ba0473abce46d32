"""linear_small (the CPU GEMV of the decode path) against a plain read of the same bytes: GB/s
of weight streamed per call, over enough copies of each weight that they do not sit in the cache,
per shape, dtype, thread count and row count. The baseline is torch's copy of the same bytes into
as many destinations (bytes read plus written, as benchmarks/timing.copy_bandwidth_gbps counts
them for the forward's floor).

    python benchmarks/benchmark_gemv.py [--shapes 32000x576,1536x576] [--dtypes bfloat16,float32]
        [--threads 1,2] [--rows 1,4] [--repeats 7] [--streams 1,2]"""
import argparse
import os
import statistics
import time

import torch

from vllm import _custom_ops as ops


def rates(fn, copies: int, nbytes: int, repeats: int) -> list[float]:
    """GB/s of each of repeats passes over all copies, after one untimed pass."""
    for c in range(copies):
        fn(c)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for c in range(copies):
            fn(c)
        out.append(copies * nbytes / (time.perf_counter() - start) / 1e9)
    return out


def streams_rates(fn, copies: int, nbytes: int, repeats: int,
                  settings: list[str]) -> dict[str, list[float]]:
    """rates() per VLLM_CPU_GEMV_STREAMS setting, the settings taking turns pass by pass (the
    machine's bandwidth moves by a third between minutes on a shared host: paired passes)."""
    out: dict[str, list[float]] = {s: [] for s in settings}
    for _ in range(repeats):
        for s in settings:
            os.environ["VLLM_CPU_GEMV_STREAMS"] = s
            out[s] += rates(fn, copies, nbytes, 1)
    os.environ.pop("VLLM_CPU_GEMV_STREAMS", None)
    return out


def main(args) -> None:
    print(f"{'shape':>10} {'dtype':>8} thr rows streams {'gemv GB/s':>22} {'copy GB/s':>22} "
          "ratio  ms/call")
    for n_threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n_threads)
        for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
            for shape in args.shapes.split(","):
                n, k = (int(v) for v in shape.split("x"))
                nbytes = n * k * dtype.itemsize
                copies = max(1, (args.pool_mb << 20) // nbytes)
                ws = [torch.randn(n, k).to(dtype) for _ in range(copies)]
                src = [w.view(-1) for w in ws]
                dst = [torch.empty_like(s) for s in src]  # out of cache too, as the floor's copy
                copy = rates(lambda c: dst[c].copy_(src[c]), copies, 2 * nbytes, args.repeats)
                for m in [int(r) for r in args.rows.split(",")]:
                    x = torch.randn(m, k).to(dtype)
                    out = torch.empty(m, n, dtype=dtype)
                    by_streams = streams_rates(
                        lambda c: ops.linear_small(out, x, ws[c], None), copies, nbytes,
                        args.repeats, args.streams.split(","))
                    for streams, gemv in by_streams.items():
                        g, c = statistics.median(gemv), statistics.median(copy)
                        print(f"{shape:>10} {str(dtype)[6:]:>8} {n_threads:>3} {m:>4} "
                              f"{streams:>7} {g:6.1f} ({min(gemv):5.1f}-{max(gemv):5.1f}) "
                              f"{c:6.1f} ({min(copy):5.1f}-{max(copy):5.1f}) {g / c:5.2f} "
                              f"{nbytes / g / 1e6:7.3f}", flush=True)
                del ws, src, dst


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="32000x576,1536x576,576x1536,4864x896")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--streams", default="2",
                        help="VLLM_CPU_GEMV_STREAMS settings, taking turns pass by pass (1,2)")
    parser.add_argument("--pool-mb", type=int, default=256, help="bytes of weight copies per shape")
    main(parser.parse_args())
