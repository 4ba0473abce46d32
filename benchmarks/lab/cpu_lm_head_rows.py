"""The LM head of a greedy draft step at 1 and 8 rows (issue 10: a batch-8 step's time outside
the decoder layers, i.e. the LM head's linear_argmax and the inputs, was 2.1-2.2x batch 1's on a
16-core host for draft-20m and llama-68m at a short context). Times, in turns, per vocabulary x
hidden shape: linear_argmax on the row-major weight (1 row: the GEMV), linear_argmax on the
packed copy (8 rows: the AMX or packed tiles with the argmax folded into the loop), and
linear_packed alone on the packed copy (the logits without the argmax), medians of 9 rounds,
against the weight bytes over the copy rate measured here. The weight is used once a call, so
it stays in a large L3 between calls as it does between a small draft's steps.
    T=16 python benchmarks/lab/cpu_lm_head_rows.py"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402

from benchmarks.timing import copy_bandwidth_gbps  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402

# vocabulary, hidden: draft-20m, llama-68m, SmolLM2-135M
SHAPES = {"draft-20m": (32000, 256), "llama-68m": (32000, 768), "smollm2": (49152, 576)}
torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("T", "2")))
bw = copy_bandwidth_gbps("cpu", 1 << 28)
CALLS = 20


def timed(fn) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - start) * 1e3 / CALLS


times = {}
cases = {}
for name, (n, k) in SHAPES.items():
    w = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
    packed = ops.pack_linear(w)
    empty = w.new_empty(0)
    for m in (1, 8):
        x = torch.randn(m, k, dtype=torch.bfloat16)
        tok = torch.empty(m, dtype=torch.long)
        logits = torch.empty(m, n, dtype=torch.bfloat16)
        p = packed if m > 1 else empty
        cases[(name, m, "argmax")] = (lambda x=x, tok=tok, w=w, p=p:
                                      ops.linear_argmax(tok, x, w, p))
        cases[(name, m, "logits")] = (lambda x=x, logits=logits, w=w, p=p:
                                      ops.linear_packed(logits, x, w, p, None))
for rnd in range(10):  # in turns; the first round warms up
    for key, fn in cases.items():
        ms = timed(fn)
        if rnd:
            times.setdefault(key, []).append(ms)
print(f"{torch.get_num_threads()} threads, copy rate {bw:.1f} GB/s, "
      f"VLLM_CPU_AMX={os.environ.get('VLLM_CPU_AMX', 'auto')}; ms a call (x the floor)")
for name, (n, k) in SHAPES.items():
    floor = n * k * 2 / (bw * 1e9) * 1e3
    cells = [f"{m} row{'s' if m > 1 else ''} {what} {statistics.median(times[(name, m, what)]):.3f}"
             f" ({statistics.median(times[(name, m, what)]) / floor:.2f}x)"
             for m in (1, 8) for what in ("argmax", "logits")]
    print(f"{name:10s} {n}x{k} floor {floor:.3f} ms: " + ", ".join(cells))
