"""GreedyStep's Python around the greedy_steps op, this checkout's against another revision's
(`git show REV:vllm/model_executor/cpu_decode.py`, loaded beside it), in turns: a synchronous
k = 1 draft's proposals after full acceptances (each a catch-up of two tokens), the draft worker
as the engine builds it, dummy weights, bf16, 2 threads, a 256-token context; the median first
forward of 90 proposals each. Python and torch calls cost 20-60 us each here when the weights'
stream has evicted the interpreter's data from the caches, so the calls around the op count.
Usage: python benchmarks/lab/greedy_step_call_ab.py CHECKPOINT_DIR REV"""
import os
import statistics
import subprocess
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

from benchmarks.benchmark_draft import make_draft  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.core.request import Request  # noqa: E402

model_dir, rev = sys.argv[1], sys.argv[2]
old = types.ModuleType("cpu_decode_at_" + rev)
source = subprocess.check_output(
    ["git", "-C", ROOT, "show", f"{rev}:vllm/model_executor/cpu_decode.py"], text=True)
exec(source, old.__dict__)
args = types.SimpleNamespace(load_format="dummy", context=256, num_forwards=400, steps=1,
                             settings="default", batch_sizes=[1])
draft = make_draft(args, model_dir, "bfloat16")
torch.set_num_threads(2)
steps = {"this checkout": draft.greedy_step,
         rev: old.GreedyStep.build(draft.runner.model, draft.runner.kv_caches)}
req = Request("r", None, list(range(100, 356)), SamplingParams(temperature=0.0), None)
req.output_token_ids = []
draft.propose([req], [1]).result()
times = {name: [] for name in steps}
for i in range(200):
    name = list(steps)[i % 2]
    draft.greedy_step = steps[name]
    token = draft.seqs["r"].token_ids[-1]
    draft.accept(req, 1)
    req.output_token_ids = req.output_token_ids + [token, 7]
    proposal = draft.propose([req], [1]).result()
    if i >= 20:
        times[name].append(proposal.first_forward_seconds)
for name, t in times.items():
    print(f"{name}: first forward {1e3 * statistics.median(t):.3f} ms")
