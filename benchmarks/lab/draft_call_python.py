"""Where a greedy draft call's Python goes, around its native forwards: a shape of
benchmarks/model_shapes.py (dummy bf16 weights), THREADS threads, 4 forwards a call at a held
context of 16 tokens, batch 1 and 8, each twice. Per call, the medians of: the call (_draft),
its _greedy_steps, and the native GreedyStep call inside that. So "_greedy_steps outside native"
is the call's arguments and its read-back, and "_draft outside _greedy_steps" the rest.

    python benchmarks/lab/draft_call_python.py [SHAPE] [THREADS] [CALLS]
    (defaults: draft-20m, 2, 300)"""
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from benchmarks.benchmark_draft import hold_context, shape_draft  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.core.request import Request  # noqa: E402

CONTEXT, STEPS, WARMUP = 16, 4, 50


def timed(method, sink: list):
    """method, its seconds appended to sink at each call."""
    def wrapper(*a, **kw):
        start = time.perf_counter()
        result = method(*a, **kw)
        sink.append(time.perf_counter() - start)
        return result
    return wrapper


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "draft-20m"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    draft = shape_draft(shape, threads, CONTEXT, STEPS)
    marks = {"native": [], "greedy_steps": [], "draft": []}
    draft.greedy_step = timed(draft.greedy_step, marks["native"])
    draft._greedy_steps = timed(draft._greedy_steps, marks["greedy_steps"])
    print(f"{shape}, bf16, {threads} threads, {STEPS} forwards a call, context {CONTEXT}; "
          "us a call (medians)")
    for n, bs in enumerate((1, 8, 1, 8)):
        reqs = [Request(f"{n}-{i}", None, list(range(3, 3 + CONTEXT)),
                        SamplingParams(temperature=0.0), None) for i in range(bs)]
        draft.propose(reqs, [1] * bs).result()
        for r in reqs:
            draft.block_manager.grow(draft.seqs[r.req_id].block_ids, CONTEXT + STEPS + 2)
        for sink in marks.values():
            sink.clear()
        for _ in range(WARMUP + calls):
            hold_context(draft, reqs, CONTEXT)
            start = time.perf_counter()
            with torch.inference_mode():
                draft._draft(reqs, [STEPS] * bs)
            marks["draft"].append(time.perf_counter() - start)
        m = {k: statistics.median(v[WARMUP:]) * 1e6 for k, v in marks.items()}
        print(f"batch {bs}: call {m['draft']:.0f}, native {m['native']:.0f}; _greedy_steps "
              f"outside native {m['greedy_steps'] - m['native']:.1f}, _draft outside "
              f"_greedy_steps {m['draft'] - m['greedy_steps']:.1f}")
        for r in reqs:
            draft.free(r.req_id)


if __name__ == "__main__":
    main()
