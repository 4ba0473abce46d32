"""Where a CPU draft step's loops spend their time, thread by thread: the draft worker's greedy
proposals (k = STEPS forwards a call, every sequence held at a CONTEXT-token context, as
benchmark_draft.py --hold-context times them) with the extension's timeline on
(VLLM_CPU_TRACE_FILE, csrc/cpu/trace.h), at batch 1 and 8. Per stage (the loops between two of
decode_layers' stage marks), us a forward (the median call's sums over its loops, over its
forwards):
  loops        the team's loops in the stage
  serial       the master's own work before each loop's hand-over (checks, views, the small
               ops it runs inline: a batch-1 norm, a small attention)
  wake         the hand-over until a worker sees the loop (the median worker; wake_max: the
               last)
  work         the slowest thread's chunk (work_median: the median thread's; the master's
               from the hand-over)
  norm_rows    a folded norm: the rows a thread claimed, done (the slowest thread);
  norm_wait    then its wait for every row (the longest)
  tail_items   a loop with a tail (the attention after the qkv linear, VLLM_CPU_ATTENTION_TAIL;
               the next norm after o and down, VLLM_CPU_NORM_TAIL):
               the last thread's start of the tail's items (every chunk done) until the last
               thread is done
  tail         the last chunk done until the master has seen every flag
  loop         the hand-over until the master has seen every flag
Then each stage's work thread by thread (the master's from the hand-over), us a forward.
Usage: python benchmarks/lab/cpu_step_trace.py MODEL_DIR [THREADS] [CALLS] [DTYPE]"""
import collections
import os
import statistics
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

from benchmarks.benchmark_draft import hold_context, make_draft  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm._custom_ops import DECODE_STAGES, GREEDY_STAGES  # noqa: E402
from vllm.core.request import Request  # noqa: E402

CONTEXT, STEPS, WARMUP = 16, 4, 16
# csrc/cpu/trace.h's TraceEvent
(TEAM_START, ISSUE, OWN_DONE, ALL_DONE, SEEN, DONE, MARK, NORM_MINE, NORM_WAIT, TILES,
 TEAM_END, TAIL) = range(12)
STAGE_NAMES = list(DECODE_STAGES) + [s for s in GREEDY_STAGES if s not in DECODE_STAGES]


def read_calls(path: str) -> tuple[list[list[tuple]], float]:
    """The file's calls (one per flush: a clock line, then its records as (thread, event, arg,
    tsc)) and the counter's ticks per ns from the clock lines."""
    calls, clocks = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("# clock"):
                _, _, tsc, ns = line.split()
                clocks.append((int(tsc), int(ns)))
                calls.append([])
            else:
                t, e, a, tsc = line.split()
                calls[-1].append((int(t), int(e), int(a), int(tsc)))
    if len(clocks) < 2:  # one pair gives no rate: the times would be ticks, not us
        raise ValueError(f"{path}: {len(clocks)} clock line(s); the counter's rate needs two "
                         "flushes (two team regions)")
    return calls, (clocks[-1][0] - clocks[0][0]) / (clocks[-1][1] - clocks[0][1])


def loop_costs(records: list[tuple], rate: float) -> dict:
    """Per stage of one call: {stage: {measure: [us per loop]}} (see the module doc)."""
    master = sorted((r for r in records if r[0] == 0), key=lambda r: r[3])
    by_loop = collections.defaultdict(lambda: collections.defaultdict(dict))
    events = collections.defaultdict(list)  # thread -> its records in time order
    for r in sorted(records, key=lambda r: r[3]):
        events[r[0]].append(r)
    for t, recs in events.items():
        current = None  # the loop this thread runs a chunk of
        for _, e, a, tsc in recs:
            if e in (SEEN, ISSUE):
                current = a
            if current is not None and e in (SEEN, DONE, NORM_MINE, NORM_WAIT, TILES, TAIL):
                by_loop[current][t][e] = tsc
            if e == OWN_DONE:  # the master's own events of its loop end here
                current = None
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    pending, last_end = [], None
    us = 1e-3 / rate
    for _, e, a, tsc in master:
        if e == TEAM_START:
            last_end = tsc
        elif e == ISSUE:
            pending.append({"loop": a, "issue": tsc, "serial": (tsc - last_end) * us})
        elif e == OWN_DONE:
            pending[-1]["own"] = tsc
        elif e == ALL_DONE:
            pending[-1]["all"] = last_end = tsc
        elif e == MARK:
            stage = STAGE_NAMES[a]
            out[stage]["marks"].append(1)
            for p in pending:
                mine = by_loop.get(p["loop"], {}).get(0, {})
                workers = {t: w for t, w in by_loop.get(p["loop"], {}).items() if t != 0}
                seen = [(w[SEEN] - p["issue"]) * us for w in workers.values() if SEEN in w]
                work = [(w[DONE] - w[SEEN]) * us for w in workers.values() if DONE in w]
                work.append((p["own"] - p["issue"]) * us)
                done = [w[DONE] for w in workers.values() if DONE in w]
                o = out[stage]
                for t, w in workers.items():  # each thread's, summed over the stage's loops
                    if DONE in w:
                        o[f"thread{t}"].append((w[DONE] - w[SEEN]) * us)
                o["thread0"].append((p["own"] - p["issue"]) * us)
                o["serial"].append(p["serial"])
                o["wake"].append(statistics.median(seen) if seen else 0.0)
                o["wake_max"].append(max(seen, default=0.0))
                o["work"].append(max(work))
                o["work_median"].append(statistics.median(work))
                o["tail"].append((p["all"] - max(done + [p["own"]])) * us)
                o["loop"].append((p["all"] - p["issue"]) * us)
                norms = [((w[NORM_MINE] - w[SEEN]) * us, (w[NORM_WAIT] - w[NORM_MINE]) * us)
                         for w in workers.values() if NORM_WAIT in w]
                if NORM_WAIT in mine:
                    norms.append(((mine[NORM_MINE] - p["issue"]) * us,
                                  (mine[NORM_WAIT] - mine[NORM_MINE]) * us))
                if norms:
                    o["norm_rows"].append(max(n for n, _ in norms))
                    o["norm_wait"].append(max(w for _, w in norms))
                # a tail's items (the attention after qkv), from the last thread's start of
                # them (every chunk done) to the last done
                tails = [w[TAIL] for w in workers.values() if TAIL in w]
                if TAIL in mine:
                    tails.append(mine[TAIL])
                if tails:
                    o["tail_items"].append((max(done + [p["own"]]) - max(tails)) * us)
            pending = []
    return out


def per_forward(per_call: list[dict], steps: int) -> dict:
    """loop_costs of several calls of `steps` forwards: per stage and measure, the median
    call's sum over its loops, per forward."""
    summary = {}
    for stage in STAGE_NAMES:
        rows = [c[stage] for c in per_call if stage in c]
        if not rows:
            continue
        measures = {m for r in rows for m in r if m != "marks"}
        summary[stage] = {m: statistics.median(sum(r[m]) for r in rows) / steps
                          for m in measures}
        summary[stage]["loops"] = statistics.median(len(r["loop"]) for r in rows) / steps
    return summary


def trace_batch(draft, batch: int, calls: int, trace: str) -> dict:
    vocab = draft.config.hf_config.vocab_size
    reqs = [Request(str(i), None, torch.randint(0, vocab, (CONTEXT,), generator=torch.Generator()
                                                .manual_seed(i)).tolist(),
                    SamplingParams(temperature=0.0), None) for i in range(batch)]
    draft.propose(reqs, [1] * batch).result()
    for req in reqs:
        draft.block_manager.grow(draft.seqs[req.req_id].block_ids, CONTEXT + STEPS + 2)
    for i in range(WARMUP + calls):
        if i == WARMUP and os.path.exists(trace):
            os.remove(trace)
        with torch.inference_mode():
            draft._draft(reqs, [STEPS] * batch)
        hold_context(draft, reqs, CONTEXT)
    for req in reqs:
        draft.free(req.req_id)
    call_records, rate = read_calls(trace)
    os.remove(trace)
    return per_forward([loop_costs(r, rate) for r in call_records], STEPS)


def main() -> None:
    trace = os.path.join(tempfile.mkdtemp(), "trace.txt")
    os.environ["VLLM_CPU_TRACE_FILE"] = trace  # read at the extension's first trace()
    model = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    args = types.SimpleNamespace(load_format="dummy", context=CONTEXT, num_forwards=calls,
                                 steps=STEPS, settings="default", batch_sizes=[1, 8])
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bfloat16"
    draft = make_draft(args, model, dtype)
    torch.set_num_threads(threads)  # after the draft's own start-up pick
    print(f"{model}, {dtype}, {threads} threads, context {CONTEXT}, {STEPS} forwards a call, "
          f"{calls} calls; us a forward (medians over calls)")
    cols = ["loops", "serial", "wake", "wake_max", "work", "work_median", "norm_rows",
            "norm_wait", "tail_items", "tail", "loop"]
    for batch in (1, 8):
        summary = trace_batch(draft, batch, calls, trace)
        print(f"batch {batch}\n  {'stage':13s}" + "".join(f"{c:>12s}" for c in cols))
        totals = collections.Counter()
        for stage, m in summary.items():
            print(f"  {stage:13s}" + "".join(
                f"{m[c]:12.2f}" if c in m else f"{'-':>12s}" for c in cols))
            totals.update({c: m.get(c, 0.0) for c in cols})
        print(f"  {'all':13s}" + "".join(f"{totals[c]:12.2f}" for c in cols))
        # which thread is the slow one: each thread's work (0 the master), us a forward
        print("  work by thread (0: the master's, from the hand-over)")
        for stage, m in summary.items():
            ts = sorted((int(k[6:]), v) for k, v in m.items() if k.startswith("thread"))
            if ts:
                print(f"  {stage:13s}" + "".join(f"{v:6.1f}" for _, v in ts))


if __name__ == "__main__":
    main()
