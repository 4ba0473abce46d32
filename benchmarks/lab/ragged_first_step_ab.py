"""A synchronous k = 1 draft's proposals after full acceptances (each a catch-up of two tokens:
the last draft and the bonus token), their one forward through greedy_steps' ragged first step
(the product) or, as before the twenty-fourth session, through the model's modules and the
sampler, in turns: the draft worker as the engine builds it, dummy weights, bf16, 2 threads,
a 256-token context. Medians of 70 proposals each.
Usage: python benchmarks/lab/ragged_first_step_ab.py CHECKPOINT_DIR BATCH_SIZE
(a shape directory: python -m benchmarks.model_shapes draft-20m DIR)"""
import os
import statistics
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402
from benchmarks.benchmark_draft import make_draft  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.core.request import Request  # noqa: E402

model, bs = sys.argv[1], int(sys.argv[2])
args = types.SimpleNamespace(load_format="dummy", context=256, num_forwards=400, steps=1,
                             settings="default", batch_sizes=[bs])
d = make_draft(args, model, "bfloat16")
torch.set_num_threads(2)
orig = d._greedy_steps


def model_path_for_catch_up(seqs, steps):
    if any(s.num_tokens - s.num_computed_tokens != 1 for s in seqs):
        return None
    return orig(seqs, steps)


reqs = [Request(str(i), None, list(range(100 + i, 356 + i)), SamplingParams(temperature=0.0),
                None) for i in range(bs)]
for r in reqs:
    r.output_token_ids = []
d.propose(reqs, [1] * bs).result()
res = {"ragged": [], "model path": []}
for i in range(160):
    mode = "ragged" if i % 2 else "model path"
    d._greedy_steps = orig if mode == "ragged" else model_path_for_catch_up
    for r in reqs:
        tok = d.seqs[r.req_id].token_ids[-1]
        d.accept(r, 1)
        r.output_token_ids = r.output_token_ids + [tok, 7]
    p = d.propose(reqs, [1] * bs).result()
    if i >= 20:
        res[mode].append((p.seconds, p.first_forward_seconds))
for m, v in res.items():
    print(f"batch {bs} {m}: proposal {1e3 * statistics.median(x[0] for x in v):.3f} ms, "
          f"first forward {1e3 * statistics.median(x[1] for x in v):.3f} ms")
