"""The CPU decode step's timeline (VLLM_CPU_TRACE_FILE, csrc/cpu/trace.h) and the lab that reads
it (benchmarks/lab/cpu_step_trace.py): every loop the team's master hands over is seen and done
by each worker in order, and the lab finds each layer's loops in its stages. The file is read
once a process, so the traced drafts run in a child process."""
import os
import subprocess
import sys

import pytest

from benchmarks.lab.cpu_step_trace import (ALL_DONE, DONE, ISSUE, OWN_DONE, SEEN, TAIL,
                                           loop_costs, per_forward, read_calls)
from tests.tiny_models import build_model
from tests.utils import has_avx512_bf16

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = """
import sys, types, torch
sys.path.insert(0, {root!r})
from benchmarks.benchmark_draft import make_draft
from vllm import SamplingParams
from vllm.core.request import Request
args = types.SimpleNamespace(load_format="auto", context=32, num_forwards=2, steps=2,
                             settings="default", batch_sizes=[3])
draft = make_draft(args, {model!r}, {dtype!r})
torch.set_num_threads(2)
reqs = [Request(str(i), None, list(range(5 + i, 31 + i)), SamplingParams(temperature=0.0), None)
        for i in range(3)]
draft.propose(reqs, [1] * 3).result()
with torch.inference_mode():
    for _ in range(2):
        draft._draft(reqs, [2] * 3)
"""


def run_child(model: str, trace, dtype: str = "float32", **env_vars) -> None:
    env = dict(os.environ, VLLM_CPU_TRACE_FILE=str(trace), **env_vars)
    subprocess.run([sys.executable, "-c", CHILD.format(root=ROOT, model=model, dtype=dtype)],
                   env=env, check=True, cwd=ROOT, capture_output=True)


def test_the_timeline_orders_every_hand_over(tiny_llama, tmp_path):
    """Two greedy draft calls of 2 forwards at 3 rows of 26-token prompts (an attention worth
    both threads), 2 threads: each call's file section has every loop issued by the master,
    seen and done by the worker, then seen done by the master, in time order; the attention
    runs as the qkv loop's tail, each thread starting its items only after both threads have
    seen the loop (the chunks' barrier), and with VLLM_CPU_ATTENTION_TAIL=0 as a loop of its
    own; the lab counts one qkv, o, gate/up and down loop a layer a forward (the tiny model's 2
    layers); a file of one region (no counter rate) is refused."""
    for tail in ("1", "0"):
        trace = tmp_path / f"trace{tail}.txt"
        run_child(tiny_llama, trace, VLLM_CPU_ATTENTION_TAIL=tail)
        calls, rate = read_calls(str(trace))
        assert len(calls) == 2 and rate > 0  # the two drafts (the prefill runs without a team)
        # two cores' counters may disagree by a few ticks (a 2-core VM: 5 ticks, one loop of
        # one run): orders across threads hold within 0.1 us
        skew = rate * 100
        for records in calls:
            master = {(e, a): tsc for t, e, a, tsc in records if t == 0}
            worker = {(e, a): tsc for t, e, a, tsc in records if t == 1}
            loops = sorted(a for (e, a) in master if e == ISSUE)
            assert loops
            for loop in loops:
                issue, own, done_all = (master[(e, loop)] for e in (ISSUE, OWN_DONE, ALL_DONE))
                seen, done = worker[(SEEN, loop)], worker[(DONE, loop)]
                assert issue <= seen + skew and seen <= done <= done_all + skew, loop
                assert issue <= own <= done_all, loop
            tails = tail_starts(records)
            # 2 layers x 2 forwards, each qkv loop's tail started by both threads
            assert len(tails) == (4 if tail == "1" else 0), tails
            for loop, starts in tails.items():
                assert set(starts) == {0, 1}, (loop, starts)
                assert min(starts.values()) + skew >= worker[(SEEN, loop)], loop
                assert max(starts.values()) <= master[(ALL_DONE, loop)] + skew, loop
        summary = per_forward([loop_costs(r, rate) for r in calls], 2)
        for stage in ("qkv", "o", "gate_up", "down"):
            assert summary[stage]["loops"] == 2, (stage, summary[stage])
            assert summary[stage]["loop"] >= summary[stage]["work"] > 0, (stage, summary[stage])
        assert summary.get("attention", {}).get("loops", 0) == (0 if tail == "1" else 2)
        assert ("tail_items" in summary["qkv"]) == (tail == "1"), summary["qkv"]
    one = tmp_path / "one.txt"  # a single region's file has no rate: refused, not read as us
    one.write_text("# clock" + trace.read_text().split("# clock")[1])
    with pytest.raises(ValueError, match="clock line"):
        read_calls(str(one))


def tail_starts(records: list[tuple]) -> dict:
    """{loop: {thread: the tsc of its TAIL event}}: the loop a thread's TAIL belongs to is the
    last it saw (a worker) or issued (the master) before it."""
    current, out = {}, {}
    for t, e, a, tsc in sorted(records, key=lambda r: r[3]):
        if e in (SEEN, ISSUE):
            current[t] = a
        elif e == TAIL:
            out.setdefault(current[t], {})[t] = tsc
    return out


@pytest.mark.skipif(not has_avx512_bf16(), reason="the norms fold on the packed bf16 tiles "
                    "(AVX512_BF16) only")
def test_the_norms_run_as_the_o_and_down_loops_tails(tmp_path):
    """bf16, where the norms fold into the packed linears' loops: with VLLM_CPU_NORM_TAIL=1 the
    o and down loops carry tails (the next fold's rows, each started by both threads after
    they saw the loop) and the gate/up loop's threads neither claim nor wait for rows; with 0,
    no tails there and gate/up's fold normalises its rows itself. The model is wider than
    tiny_llama: its 128 x 128 o weight is one thread's share (32 KB), run inline with no loop."""
    model = str(build_model(tmp_path / "wide", "llama", hidden_size=256,
                            intermediate_size=512, num_attention_heads=8,
                            num_key_value_heads=4))
    for tail in ("1", "0"):
        trace = tmp_path / f"trace{tail}.txt"
        run_child(model, trace, "bfloat16", VLLM_CPU_NORM_TAIL=tail)
        calls, rate = read_calls(str(trace))
        for records in calls:
            worker = {(e, a): tsc for t, e, a, tsc in records if t == 1}
            for loop, starts in tail_starts(records).items():
                assert set(starts) == {0, 1}, (loop, starts)
                assert min(starts.values()) >= worker[(SEEN, loop)], loop
        summary = per_forward([loop_costs(r, rate) for r in calls], 2)
        for stage in ("o", "down"):
            assert summary[stage]["loops"] == 2, (stage, summary[stage])  # a layer a forward
            assert ("tail_items" in summary[stage]) == (tail == "1"), (stage, summary[stage])
        assert ("norm_rows" in summary["gate_up"]) == (tail == "0"), summary["gate_up"]
