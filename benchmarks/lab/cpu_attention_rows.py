"""CPU paged attention at decode shapes (SmolLM2-135M's 9 query / 3 KV heads of 64): median us of
ops.paged_attention over 30 calls per (batch, context); the threads from argv[1].
    python benchmarks/lab/cpu_attention_rows.py 2"""
import sys, time, statistics, torch
sys.path.insert(0, ".")
from tests.kernels.test_attention import make_batch
from vllm import _custom_ops as ops
torch.set_num_threads(int(sys.argv[1]))
for bs, ctx in ((8, 256), (1, 256), (1, 64), (2, 256), (8, 64), (1, 256)):
    b = make_batch([ctx] * bs, [1] * bs, 9, 3, 64, 16, torch.bfloat16, "cpu")
    query, kc, vc, bt, cl, qsl = b[:6]
    out = torch.empty_like(query)
    f = lambda: ops.paged_attention(out, query, kc, vc, bt, cl, qsl, ctx, 0.125)
    for _ in range(3): f()
    ts = []
    for _ in range(30):
        t = time.perf_counter(); f(); ts.append((time.perf_counter() - t) * 1e6)
    kv = bs * ctx * 3 * 64 * 2 * 2
    print(f"bs {bs} ctx {ctx}: {statistics.median(ts):.0f} us ({kv/1e3:.0f} KB K/V)")
