"""CPU paged attention as a draft step meets it: one KV cache per layer, each sequence's blocks
consecutive, and the layer's K/V out of the CPU's caches (as between a step's layers, where the
weights stream through them). Prints ms per step (every layer's call) with the caches warm
(the second of two steps back to back), flushed (a 300 MB read before the step) and per layer
(a 9 MB read before each layer's call, the weights of a small draft's layer); medians over 3
rounds of 10; the floor is the K/V bytes over the copy rate measured at the end.

    python benchmarks/lab/cpu_attention_cold.py THREADS BATCH CONTEXT
Environment: H, KVH, D (SmolLM2-135M's 9 / 3 / 64 by default), L (layers, 30), QL (query tokens
per sequence, 1), BS (block size, 16), REPO (the checkout whose vllm to import: an A/B of two
builds, in turns)."""
import os
import statistics
import sys
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
import torch  # noqa: E402

sys.path.insert(0, os.environ.get("REPO", os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
from benchmarks.timing import copy_bandwidth_gbps  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402

torch.set_num_threads(int(sys.argv[1]))
bs, ctx = int(sys.argv[2]), int(sys.argv[3])
H, KVH, D = (int(os.environ.get(k, d)) for k, d in (("H", 9), ("KVH", 3), ("D", 64)))
L, QL, BS = (int(os.environ.get(k, d)) for k, d in (("L", 30), ("QL", 1), ("BS", 16)))
per = -(-ctx // BS) + 1
caches = [(torch.randn(bs * per + 1, KVH, BS, D).bfloat16(),
           torch.randn(bs * per + 1, KVH, BS, D).bfloat16()) for _ in range(L)]
tables = torch.arange(bs * per, dtype=torch.int32).view(bs, per)
lens = torch.full((bs,), ctx, dtype=torch.int32)
starts = torch.arange(0, QL * bs + 1, QL, dtype=torch.int32)
q = torch.randn(bs * QL, H, D).bfloat16()
out = torch.empty_like(q)
flush = torch.empty(300 << 20, dtype=torch.uint8).fill_(1)
layer_flush = [flush[j * (9 << 20):(j + 1) * (9 << 20)] for j in (i % 33 for i in range(L))]


def step(before_layer=None) -> float:
    total = 0.0
    for i, (k, v) in enumerate(caches):
        if before_layer is not None:
            before_layer(i)
        start = time.perf_counter()
        ops.paged_attention(out, q, k, v, tables, lens, starts, ctx, D ** -0.5)
        total += time.perf_counter() - start
    return total * 1e3


results = {"warm": [], "flushed": [], "per layer": []}
for _ in range(3):
    samples = {name: [] for name in results}
    for _ in range(10):
        step()
        samples["warm"].append(step())
        flush.max()
        samples["flushed"].append(step())
        samples["per layer"].append(step(lambda i: layer_flush[i].max()))
    for name, s in samples.items():
        results[name].append(statistics.median(s))
kv_mb = L * bs * ctx * KVH * D * 2 * 2 / 1e6
rate = copy_bandwidth_gbps("cpu", 256 << 20)  # GB/s at these threads
print(f"batch {bs} x {QL} tokens, context {ctx}, heads {H}/{KVH} of {D}, {L} layers, "
      f"{sys.argv[1]} threads, K/V {kv_mb:.1f} MB, floor {kv_mb / rate:.3f} ms at "
      f"{rate:.1f} GB/s: " +
      ", ".join(f"{n} {statistics.median(v):.3f} ms" for n, v in results.items()))
