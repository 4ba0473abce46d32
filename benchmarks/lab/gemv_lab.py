"""The experiment behind linear_small's CUDA tensor-core kernel: variants of a GEMV for 1-8 rows
(gemv_lab.cu, compiled here with torch's cpp_extension) timed over a Llama-2-7B step's weights
(32 layers of qkv, o, gate_up, down; 13 GB of bf16) against cuBLAS, with the copy floor measured
in the same run. Variant numbers are gemv_lab.cu's `run` switch: k_reg<warps, steps in flight,
accumulators, split K> (0-5, 8-19), k_smem<stages> (6, 7, 14), k_tr<rows, warps> (20, 22, 23),
k_tra<rows, warps> (24-27: the weights as the A operand), k_wave<warps, segments, eager>
(28-30; eager, the input loaded before the mma and 4 accumulators, RESULTS' k_wave2: 31-34). Where
vllm._C is built, the product's linear_small (column "ours") runs in the same call.
On a CUDA machine: python benchmarks/lab/gemv_lab.py [comma list of variants]"""
import os, statistics, sys
import torch
from torch.utils.cpp_extension import load

lab = load("gemv_lab", [os.path.join(os.path.dirname(__file__), "gemv_lab.cu")],
           extra_cuda_cflags=["-O3", "-arch=sm_90", "--expt-relaxed-constexpr"], verbose=False)
try:
    from vllm import _custom_ops as ops
except ImportError:  # the lab alone, without the engine's extension
    ops = None
torch.manual_seed(0)
dev = "cuda"
shapes = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)]
layers = 32
ws = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for (n, k) in shapes]
      for _ in range(layers)]
gb = sum(w.numel() * 2 for l in ws for w in l) / 1e9
src = torch.empty(1 << 28, device=dev, dtype=torch.uint8); dst = torch.empty_like(src)
def timed(fn, reps=7):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
copy_ms = timed(lambda: dst.copy_(src))
bw = 2 * src.numel() / copy_ms / 1e9  # TB/s read+write
floor = gb / bw
print(f"weights {gb:.2f} GB, copy {bw:.2f} TB/s, floor {floor:.3f} ms", flush=True)
variants = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else list(range(10))
for m in (1, 2, 3, 4, 5, 8):
    xs = {k: torch.randn(m, k, device=dev, dtype=torch.bfloat16) for (_, k) in shapes}
    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for (n, _) in shapes]
    ref = [xs[k] @ w.t() for w, (n, k) in zip(ws[0], shapes)]
    def cublas():
        for l in ws:
            for w, o in zip(l, outs):
                torch.mm(xs[w.shape[1]], w.t(), out=o)
    line = [f"M={m}: cuBLAS {timed(cublas):.3f}"]
    if ops is not None:
        def ours():
            for l in ws:
                for w, o in zip(l, outs):
                    ops.linear_small(o, xs[w.shape[1]], w, None)
        line.append(f"ours {timed(ours):.3f}")
    for v in variants:
        def f():
            for l in ws:
                for w, o in zip(l, outs):
                    lab.run(o, xs[w.shape[1]], w, v)
        try:
            t = timed(f)
            for w, o, r in zip(ws[0], outs, ref):
                lab.run(o, xs[w.shape[1]], w, v)
                err = (o.float() - r.float()).abs().max().item()
                assert err < 0.05, f"variant {v} shape {tuple(w.shape)} err {err}"
            line.append(f"v{v} {t:.3f}")
        except Exception as e:  # noqa
            line.append(f"v{v} FAIL {e}")
    print(" | ".join(line), f"(ms; floor {floor:.3f})", flush=True)
