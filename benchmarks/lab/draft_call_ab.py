"""A greedy draft call's cost outside its native steps, this tree's draft worker against the one
at a git revision (or in a file: a copy of vllm/spec_decode/draft_worker.py), in one process:
calls alternate between the two in blocks of 4 (the first call of a block, after the switch,
is not counted). SHAPE (benchmarks/model_shapes.py, dummy bf16 weights), THREADS threads, 4
forwards a call at a held context of 16 tokens, batch 1 and 8. Per call: its time less
greedy_steps' own (its step_ms), so the Python of _draft and _greedy_steps, GreedyStep's and
the op's dispatch.

    python benchmarks/lab/draft_call_ab.py REV|FILE [SHAPE] [THREADS] [CALLS]
    (defaults: draft-20m, 2, 1200 a batch size)"""
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from benchmarks.benchmark_draft import hold_context, shape_draft  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.core.request import Request  # noqa: E402

CONTEXT, STEPS, WARMUP, BLOCK = 16, 4, 40, 4
METHODS = ("_draft", "_greedy_steps", "_block_table")


def worker_at(rev: str):
    """vllm/spec_decode/draft_worker.py at git revision rev (or the file rev), as a module."""
    path = rev
    if not os.path.isfile(rev):
        source = subprocess.run(["git", "-C", ROOT, "show",
                                 f"{rev}:vllm/spec_decode/draft_worker.py"],
                                check=True, capture_output=True, text=True).stdout
        path = os.path.join(tempfile.mkdtemp(), "draft_worker_at_rev.py")
        with open(path, "w") as f:
            f.write(source)
    spec = importlib.util.spec_from_file_location("draft_worker_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    rev = sys.argv[1]
    shape = sys.argv[2] if len(sys.argv) > 2 else "draft-20m"
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    calls = int(sys.argv[4]) if len(sys.argv) > 4 else 1200
    draft = shape_draft(shape, threads, CONTEXT, STEPS)
    old_class = worker_at(rev).DraftModelProposer
    # each version's methods bound to the one draft (its weights, caches and sequences)
    versions = {
        "this tree": {m: getattr(draft, m) for m in METHODS if hasattr(draft, m)},
        rev: {m: types.MethodType(getattr(old_class, m), draft) for m in METHODS
              if hasattr(old_class, m)},
    }
    step_ms = {}
    native = draft.greedy_step

    def timed_native(*a):
        result = native(*a)
        step_ms["sum"] = float(a[5].sum()) if a[5] is not None else 0.0
        return result
    draft.greedy_step = timed_native
    print(f"{shape}, bf16, {threads} threads, {STEPS} forwards a call, context {CONTEXT}: "
          "us a call outside greedy_steps' steps (medians)")
    for n, bs in enumerate((1, 8)):
        reqs = [Request(f"{n}-{i}", None, list(range(3, 3 + CONTEXT)),
                        SamplingParams(temperature=0.0), None) for i in range(bs)]
        draft.propose(reqs, [1] * bs).result()
        for r in reqs:
            draft.block_manager.grow(draft.seqs[r.req_id].block_ids, CONTEXT + STEPS + 2)
        spent = {name: [] for name in versions}
        names = list(versions)
        for i in range(WARMUP + calls):
            name = names[(i // BLOCK) % 2]
            for method, bound in versions[name].items():
                setattr(draft, method, bound)
            hold_context(draft, reqs, CONTEXT)
            start = time.perf_counter()
            with torch.inference_mode():
                draft._draft(reqs, [STEPS] * bs)
            elapsed = time.perf_counter() - start
            if i >= WARMUP and i % BLOCK != 0:
                spent[name].append(elapsed * 1e6 - step_ms["sum"] * 1e3)
        print(f"batch {bs}: " + ", ".join(f"{name} {statistics.median(v):.1f}"
                                          for name, v in spent.items()))
        for r in reqs:
            draft.free(r.req_id)


if __name__ == "__main__":
    main()
