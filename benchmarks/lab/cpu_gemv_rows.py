"""The CPU bf16 GEMV (linear_small) at 1, 2, 4 and 8 input rows over SmolLM2-135M's shapes (30
layers of gate_up and down, the 49152-row LM head): median ms and GB/s; threads from argv[1].
    python benchmarks/lab/cpu_gemv_rows.py 2"""
import time, torch, statistics, sys
from vllm import _custom_ops as ops
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
for n, k, copies in ((3072, 576, 30), (576, 1536, 30), (49152, 576, 1)):
    ws = [torch.randn(n, k, dtype=torch.bfloat16) for _ in range(copies)]
    line = f"{n}x{k}x{copies}:"
    for m in (1, 2, 4, 8):
        x = torch.randn(m, k, dtype=torch.bfloat16); o = torch.empty(m, n, dtype=torch.bfloat16)
        def f():
            for w in ws: ops.linear_small(o, x, w, None)
        f(); ts = []
        for _ in range(9):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        t = statistics.median(ts)
        line += f"  m={m} {t*1e3:.2f} ms {n*k*2*copies/t/1e9:.1f} GB/s"
    print(line)
