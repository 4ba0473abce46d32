"""Does a many-row linear pay for the gaps between a decode step's loops? Every matrix of a draft
step (each layer's qkv, o, gate_up and down, then the LM head), random bf16 weights of a shape of
benchmarks/model_shapes.py, through linear_packed as the fused step runs them: 1 row on the
row-major weights (the GEMV), ROWS rows on the packed copies (AMX tiles where the CPU has them,
from 8 rows by default). Each matrix is timed alone, and the step is the sum; after each matrix
the calling thread busy-waits GAP us (the step's norms, attention and Python between two
loops), or not at all. Each call opens its own parallel region (no decode_layers team), at
1 and ROWS rows alike. Every (rows, gap) runs once a pass, the order reversed every other pass,
and medians over the passes are printed, with ROWS rows' step over 1 row's at each gap.

Why: on the H100 machine's 16-core host a batch-8 draft-20m loop took each thread ~4-5 us for
8-24 KB of packed panels, where a batch-1 loop took ~1.8 us for 32 KB of rows (RESULTS.md,
thirty-seventh session), while alone, back to back, an 8-row AMX linear took about the time of
the one-row GEMV. If ROWS over 1 grows with the gap, the tiles pay something on each return
after idle time (the tile unit's wake-up, the tile configuration) that back-to-back calls hide.

    python benchmarks/lab/cpu_amx_gap_lab.py [SHAPE] [THREADS] [GAPS_US] [PASSES] [ROWS]
    (defaults: draft-20m, all cores, 0,5,20, 30, 8)"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.model_shapes import SHAPES  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402
from vllm.model_executor.cpu_decode import PACKED_MIN_ROWS  # noqa: E402


def step_weights(shape: dict, seed: int = 0) -> list[torch.Tensor]:
    """The step's matrices in order, each [out, in]: per layer qkv, o, gate_up, down; the LM
    head."""
    g = torch.Generator().manual_seed(seed)
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    head_dim = h // shape["num_attention_heads"]
    qkv = (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"]) * head_dim
    dims = [(qkv, h), (h, h), (2 * inter, h), (h, inter)] * shape["num_hidden_layers"]
    dims.append((shape["vocab_size"], h))
    return [(torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16) for n, k in dims]


def busy_wait(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def step_ms(calls: list, gap_us: float) -> float:
    """The calls' summed ms, each timed alone, with a busy gap after each."""
    total = 0.0
    for call in calls:
        start = time.perf_counter()
        call()
        total += time.perf_counter() - start
        if gap_us:
            busy_wait(gap_us)
    return total * 1e3


def make_calls(weights: list[torch.Tensor], rows: int) -> list:
    """linear_packed of `rows` rows on each weight: its packed copy from PACKED_MIN_ROWS rows, as
    the fused step has them, else the row-major weight alone."""
    calls = []
    for w in weights:
        x = torch.randn(rows, w.shape[1]).to(torch.bfloat16)
        out = torch.empty(rows, w.shape[0], dtype=torch.bfloat16)
        packed = ops.pack_linear(w) if rows >= PACKED_MIN_ROWS else w.new_empty(0)
        calls.append(lambda out=out, x=x, w=w, packed=packed:
                     ops.linear_packed(out, x, w, packed, None))
    return calls


def run(shape_name: str, threads: int, gaps: list[float], passes: int,
        rows: int) -> dict[tuple[int, float], float]:
    """(rows, gap) -> the median step ms over the passes (1 and `rows` rows, every gap)."""
    torch.set_num_threads(threads)
    weights = step_weights(SHAPES[shape_name])
    calls = {r: make_calls(weights, r) for r in (1, rows)}
    turns = [(r, g) for r in (1, rows) for g in gaps]
    for r, g in turns:  # warm-up: the packed copies and the pages touched once
        step_ms(calls[r], g)
    times = {t: [] for t in turns}
    for p in range(passes):
        for r, g in turns if p % 2 == 0 else turns[::-1]:
            times[(r, g)].append(step_ms(calls[r], g))
    return {t: statistics.median(v) for t, v in times.items()}


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "draft-20m"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    gaps = [float(g) for g in (sys.argv[3] if len(sys.argv) > 3 else "0,5,20").split(",")]
    passes = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    rows = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    medians = run(shape, threads, gaps, passes, rows)
    print(f"{shape}, bf16, {threads} threads, {passes} passes; VLLM_CPU_AMX="
          f"{os.environ.get('VLLM_CPU_AMX', 'auto')}; step ms (the matrices' own time)")
    print(f"{'gap us':>8} {'1 row':>9} {f'{rows} rows':>9} {'ratio':>7}")
    for g in gaps:
        one, many = medians[(1, g)], medians[(rows, g)]
        print(f"{g:8.0f} {one:9.3f} {many:9.3f} {many / one:7.2f}")


if __name__ == "__main__":
    main()
