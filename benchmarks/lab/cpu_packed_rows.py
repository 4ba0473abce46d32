"""A small model's four decoder linears (qkv, o, gate_up, down of L layers) at a few input-row
counts, on the row-major weights (linear_small: the GEMV, the register tiles) and on their packed
copies (linear_packed: the packed AVX512 tiles, or AMX tiles where VLLM_CPU_AMX takes the rows):
median ms per pass over the layers, each row count and path in turns, against the floor of the
weight bytes over the copy rate measured here. A row count below linear.cpp's kPackedMinRows
runs the row-major kernels on either path.
    MODEL=smollm2|qwen0.5b|qwen1.5b (default smollm2), L= layers (30; 240 streams SmolLM2's
    weights from memory on a CPU with a large L3), ROWS=1,8, PATHS=row-major,packed,
    PER_MATRIX=1 (a line per matrix, else one per path and row count for all four), T= threads (2), REPO= another tree's
    vllm (A/B of two builds), SETTING=VAR (each path also run with VAR=0 and VAR=1, in turns
    in one process: the kernels read their switches at every call; runs of separate processes
    differed by up to 1.3x on one 2-core machine)
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

# hidden, intermediate, KV width (KV heads x head size)
MODELS = {"smollm2": (576, 1536, 192), "qwen0.5b": (896, 4864, 128),
          "qwen1.5b": (1536, 8960, 256)}
H, I, KV = MODELS[os.environ.get("MODEL", "smollm2")]
SHAPES = {"qkv": (H + 2 * KV, H), "o": (H, H), "gate_up": (2 * I, H), "down": (H, I)}
LAYERS = int(os.environ.get("L", "30"))
ROWS = [int(r) for r in os.environ.get("ROWS", "1,8").split(",")]
SETTING = os.environ.get("SETTING")
PATHS = [f"{p}{f' {SETTING}={v}' if SETTING else ''}"
         for p in os.environ.get("PATHS", "row-major,packed").split(",")
         for v in (("0", "1") if SETTING else ("",))]
torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("T", "2")))


def weights(shape):
    w = torch.randn(shape, dtype=torch.bfloat16) * 0.02
    return w, ops.pack_linear(w)


ws = {name: [weights(s) for _ in range(LAYERS)] for name, s in SHAPES.items()}
bw = copy_bandwidth_gbps("cpu", 1 << 28)


def one_pass(name, m, path):
    n, k = SHAPES[name]
    x = torch.randn(m, k, dtype=torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    if SETTING:
        os.environ[SETTING] = path.rsplit("=", 1)[1]
    start = time.perf_counter()
    for w, packed in ws[name]:
        if path.startswith("packed"):
            ops.linear_packed(out, x, w, packed)
        else:
            ops.linear_small(out, x, w, None)
    return (time.perf_counter() - start) * 1e3


times = {}
for rnd in range(7):  # everything in turns; the first round warms up
    for name in SHAPES:
        for m in ROWS:
            for path in PATHS:
                ms = one_pass(name, m, path)
                if rnd:
                    times.setdefault((name, m, path), []).append(ms)
print(f"{torch.get_num_threads()} threads, {LAYERS} layers, copy rate {bw:.1f} GB/s, "
      f"VLLM_CPU_AMX={os.environ.get('VLLM_CPU_AMX', 'auto')}")
groups = [[name] for name in SHAPES] if os.environ.get("PER_MATRIX") else [list(SHAPES)]
for names in groups:
    floor = sum(SHAPES[n][0] * SHAPES[n][1] for n in names) * 2 * LAYERS / (bw * 1e9) * 1e3
    cells = []
    for m in ROWS:
        for path in PATHS:
            ms = sum(statistics.median(times[(n, m, path)]) for n in names)
            cells.append(f"{m} rows {path} {ms:7.3f} ({ms / floor:4.2f}x)")
    print(f"{'+'.join(names):18s} floor {floor:7.3f} ms  " + "  ".join(cells))
