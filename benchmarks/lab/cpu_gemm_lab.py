"""Which is fastest for a small draft's decode step on this CPU, bf16, at 1-20 input rows: our
linear_small with VLLM_CPU_AMX=0 (path "gemv": the GEMV, each weight streamed once for all rows,
and from 4 rows, where the CPU has AVX512_BF16, its register tiles), our AMX tile
kernel (linear_small with VLLM_CPU_AMX=all; the GEMV again where the CPU lacks AMX) or torch's
GEMM (F.linear: oneDNN, AMX tiles where the CPU has them)? One step is every matrix of the model
(qkv, o, gate_up, down of each layer and the LM head), timed through each path, the paths taking
turns pass by pass in one process (the host's speed drifts; medians of the passes, and of the
paired passes' ratios to the first path), against the floor of the step's weight bytes over the
copy bandwidth measured with the same thread count. Prints the CPU's capabilities and the oneDNN
kernel F.linear runs per row count first (brg_matmul:avx512_core_amx... where AMX is used), and
each row count's ms over the first row count's per path. One copy of the weights (as the model
runs) sits in the cache where it fits (draft-20m's 23 MB: under 1x floor); --copies 8 times them
from memory."""
import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time

# torch's CPU allocations on huge pages, as in the engine's own processes (vllm/huge_pages.py)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.model_shapes import SHAPES  # noqa: E402
from benchmarks.timing import copy_bandwidth_gbps, provenance, write_json  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402

# linear_small as the AVX512 GEMV (VLLM_CPU_AMX=0), linear_small on AMX tiles where the CPU has
# them (VLLM_CPU_AMX=all; elsewhere the GEMV again), torch's GEMM
PATHS = ("gemv", "amx", "F.linear")
AMX_SETTING = {"gemv": "0", "amx": "all"}


def cpu_report() -> dict:
    """torch's CPU capability, the cpuinfo flags that matter here and torch's oneDNN version."""
    with open("/proc/cpuinfo") as f:
        info = f.read()
    flags = set(next((l for l in info.splitlines() if l.startswith("flags")), "").split())
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines()
                  if l.startswith("model name")), "?")
    onednn = [l.strip(" -") for l in torch.__config__.show().splitlines() if "DNN v" in l]
    return {"cpu": model, "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "capability": torch.backends.cpu.get_cpu_capability(),
            **{f: f in flags for f in ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")},
            "onednn": onednn[0] if onednn else "?"}


def onednn_kernels(weight: torch.Tensor, rows: list[int]) -> dict:
    """The oneDNN implementation F.linear runs at each row count, from oneDNN's verbose lines
    (caught from the C stdout), plus the ISA oneDNN detects; 'not oneDNN' where none ran."""
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile(mode="w+") as f:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                for m in rows:
                    F.linear(torch.randn(m, weight.shape[1], dtype=weight.dtype), weight)
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        lines = f.read().splitlines()
    out = {"isa": next((l.split("isa:", 1)[1] for l in lines if "isa:" in l), "?")}
    for m in rows:
        out[m] = "not oneDNN"
    for fields in (l.split(",") for l in lines if ",primitive,exec," in l):
        m = fields[-2].split("x")[0]  # the problem, MxK:KxN
        if m.isdigit() and int(m) in out:
            out[int(m)] = fields[6]
    return out


def step_shapes(name: str) -> list[tuple[int, int]]:
    """[N, K] of every matrix one decode step streams: per layer the fused qkv, o, the fused
    gate_up and down; then the LM head (tied to the embedding or not, it is read whole)."""
    c = SHAPES[name]
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    head_dim = hidden // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    layer = [(q + 2 * kv, hidden), (hidden, q), (2 * inter, hidden), (hidden, inter)]
    return layer * c["num_hidden_layers"] + [(c["vocab_size"], hidden)]


def make_path(path: str, weights: list[list[torch.Tensor]], m: int):
    """A function that runs one step of m rows through the path, on the next copy of the
    weights each call; its outputs (for a check) in .outs."""
    xs = {w.shape[1]: torch.randn(m, w.shape[1], dtype=w.dtype) for w in weights[0]}
    outs = [torch.empty(m, w.shape[0], dtype=w.dtype) for w in weights[0]]
    turn = [0]

    def step():
        ws = weights[turn[0] % len(weights)]
        turn[0] += 1
        if path in AMX_SETTING:  # read by the kernel at each call
            os.environ["VLLM_CPU_AMX"] = AMX_SETTING[path]
        for i, w in enumerate(ws):
            if path in AMX_SETTING:
                ops.linear_small(outs[i], xs[w.shape[1]], w, None)
            else:
                outs[i] = F.linear(xs[w.shape[1]], w)
    step.outs, step.xs = outs, xs
    return step


def ab_times(steps: dict, passes: int, reps: int) -> dict[str, list[float]]:
    """ms per step of each path in each pass (reps steps back to back), the paths taking turns
    and the first of the pair alternating, after one untimed step of each."""
    names = list(steps)
    for name in names:
        steps[name]()
    out = {name: [] for name in names}
    for p in range(passes):
        for name in (names if p % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            for _ in range(reps):
                steps[name]()
            out[name].append((time.perf_counter() - start) * 1e3 / reps)
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def run_shape(name: str, n_threads: int, rows: list[int], args, bandwidth: float) -> list[dict]:
    """One row per row count for the shape at the thread count, printed as it comes."""
    shapes = step_shapes(name)
    weights = [[torch.randn(n, k).to(torch.bfloat16) * 0.05 for n, k in shapes]
               for _ in range(args.copies)]
    nbytes = sum(n * k * 2 for n, k in shapes)
    floor = nbytes / (bandwidth * 1e9) * 1e3
    result = []
    for m in rows:
        steps = {p: make_path(p, weights, m) for p in PATHS}
        for p in PATHS[1:]:  # the same inputs: a check
            steps[p].xs.update(steps[PATHS[0]].xs)
        times = ab_times(steps, args.passes, args.reps)
        err = max(rel_err(a, b) for p in PATHS[1:]
                  for a, b in zip(steps[p].outs, steps[PATHS[0]].outs))
        row = {"shape": name, "threads": n_threads, "rows": m, "weight_mb": nbytes / 1e6,
               "copies": args.copies, "floor_ms": floor, "bandwidth_gbps": bandwidth,
               "max_rel_err": err}
        for p in PATHS:
            row[p] = {"ms": statistics.median(times[p]), "min": min(times[p]),
                      "max": max(times[p]), "x_floor": statistics.median(times[p]) / floor,
                      # the median of the paired passes' ratios to the first path
                      "over_first": statistics.median(
                          t / t0 for t0, t in zip(times[PATHS[0]], times[p]))}
        result.append(row)
        print(f"{name:<13} {n_threads:>3} thr  M {m:>2}  " + "  ".join(
            f"{p} {row[p]['ms']:7.3f} ms ({row[p]['x_floor']:4.2f}x, "
            f"{row[p]['over_first']:4.2f} of {PATHS[0]})" for p in PATHS)
            + f"  floor {floor:.3f} ms ({nbytes / 1e6:.0f} MB x{args.copies}, "
            f"{bandwidth:.0f} GB/s)  err {err:.0e}", flush=True)
    base = result[0]
    for row in result[1:]:
        print(f"{'':<13} {n_threads:>3} thr  M {row['rows']:>2} / M {base['rows']}: " + "  ".join(
            f"{p} {row[p]['ms'] / base[p]['ms']:4.2f}x" for p in PATHS), flush=True)
    return result


def main(args) -> dict:
    cpu = cpu_report()
    print("  ".join(f"{k}: {v}" for k, v in cpu.items()))
    rows = sorted(int(r) for r in args.rows.split(","))
    shapes = args.shapes.split(",")
    last = step_shapes(shapes[0])[0]
    kernels = onednn_kernels(torch.randn(*last).to(torch.bfloat16), rows)
    print(f"oneDNN isa: {kernels.pop('isa')}; F.linear's kernel at {last[0]}x{last[1]}: "
          + ", ".join(f"M {m}: {k}" for m, k in kernels.items()), flush=True)
    threads = sorted({min(int(t), os.cpu_count()) for t in args.threads.split(",")})
    result = []
    for n in threads:
        torch.set_num_threads(n)
        bandwidth = copy_bandwidth_gbps("cpu", 256 << 20)
        for name in shapes:
            result += run_shape(name, n, rows, args, bandwidth)
    out = {"provenance": provenance(), "cpu": cpu, "onednn_kernels": kernels, "rows": result}
    write_json(args.out, out, args)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="draft-20m,llama-68m,smollm2-135m",
                        help="names of benchmarks/model_shapes.py's SHAPES")
    parser.add_argument("--threads", default="4,8,16", help="clipped to os.cpu_count()")
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--passes", type=int, default=9, help="paired passes, medians over them")
    parser.add_argument("--reps", type=int, default=5, help="steps per pass")
    parser.add_argument("--copies", type=int, default=1,
                        help="copies of the step's weights taken in turn (1: as the model runs, "
                             "cache-resident where they fit; more: from memory)")
    parser.add_argument("--out", default=None, help="JSON of the results")
    main(parser.parse_args())
