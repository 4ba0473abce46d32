"""SmolLM2-135M's four decoder linears on their packed copies (linear_packed: AMX tiles from 8
rows on an AMX CPU, the GEMV at 1 row), 1 and 8 input rows: median ms per pass over L layers'
weights (L=240 streams them from memory on a CPU with a large L3; 30 is one model), each
against the floor of its weight bytes over the copy rate measured here. REPO= another tree's
vllm (A/B of two builds), T= threads (default 2).
    L=240 python benchmarks/lab/cpu_packed_rows.py"""
import os
import statistics
import sys
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
sys.path.insert(0, os.environ.get("REPO", os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
import torch  # noqa: E402

from benchmarks.timing import copy_bandwidth_gbps  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("T", "2")))
H, I, KV = 576, 1536, 192
SHAPES = {"qkv": (H + 2 * KV, H), "o": (H, H), "gate_up": (2 * I, H), "down": (H, I)}
LAYERS = int(os.environ.get("L", "30"))


def weights(shape):
    w = torch.randn(shape, dtype=torch.bfloat16) * 0.02
    return w, ops.pack_linear(w)


ws = {name: [weights(s) for _ in range(LAYERS)] for name, s in SHAPES.items()}
bw = copy_bandwidth_gbps("cpu", 1 << 28)


def one_pass(name, m):
    n, k = SHAPES[name]
    x = torch.randn(m, k, dtype=torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    start = time.perf_counter()
    for w, packed in ws[name]:
        ops.linear_packed(out, x, w, packed)
    return (time.perf_counter() - start) * 1e3


times = {}
for rnd in range(7):  # the shapes and row counts in turns; the first round warms up
    for name in SHAPES:
        for m in (1, 8):
            ms = one_pass(name, m)
            if rnd:
                times.setdefault((name, m), []).append(ms)
print(f"{torch.get_num_threads()} threads, {LAYERS} layers, copy rate {bw:.1f} GB/s")
for name, (n, k) in SHAPES.items():
    floor = n * k * 2 * LAYERS / (bw * 1e9) * 1e3
    one, eight = (statistics.median(times[(name, m)]) for m in (1, 8))
    print(f"{name:8s} floor {floor:6.3f} ms  1 row {one:6.3f} ms ({one / floor:4.2f}x)  "
          f"8 rows {eight:6.3f} ms ({eight / floor:4.2f}x)  8 / 1 {eight / one:4.2f}")
