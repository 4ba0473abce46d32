"""Does a drafter idling between proposals slow the GPU target's step? The target's plain
decode step (batch 1, the engine's execute phase) timed in turns beside what a spinning draft
process does while the target verifies: its OpenMP threads spinning in their barrier (GOMP
spin count without end, on the drafter's cores but one) and its main thread polling its pipe
(`conn.poll(0)` in a loop, on the remaining core). Each load is a child process stopped
(SIGSTOP) or running (SIGCONT) per mode: none, omp, poll, both. Medians of the rounds, ms a
step; the floor is the step's weight and KV bytes over the GPU's copy rate (not computed here:
the baseline is the step with no load, in turns).

    python benchmarks/lab/target_beside_spin_lab.py TARGET_DIR [ROUNDS] [TOKENS]
(dummy weights: a shape directory, python -m benchmarks.model_shapes llama-2-13b DIR)"""
import os
import signal
import statistics
import subprocess
import sys
import time

OMP_CHILD = """
import os, sys, time
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})
import torch
torch.set_num_threads(len(os.sched_getaffinity(0)))
x = torch.ones(1 << 22)
x.add_(1)  # one parallel region: its threads then spin in the barrier (GOMP_SPINCOUNT)
while True:
    time.sleep(3600)
"""
POLL_CHILD = """
import os, sys
from multiprocessing import Pipe
os.sched_setaffinity(0, {int(sys.argv[1])})
a, b = Pipe()
while True:
    a.poll(0)
"""

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.step_timer import per_step_ms  # noqa: E402

target = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 96
cpus = sorted(os.sched_getaffinity(0))
# the engine as it runs beside a draft process: the first two cores (one on a machine of fewer
# than 4: the lab's mechanics only), the loads on the rest
kept = cpus[:2] if len(cpus) >= 4 else cpus[:1]
os.sched_setaffinity(0, kept)
torch.set_num_threads(1)
drafter = cpus[len(kept):]
llm = LLM(model=target, load_format="dummy", dtype="bfloat16", max_model_len=1024,
          gpu_memory_utilization=0.6)
engine = llm.llm_engine
env = {**os.environ, "GOMP_SPINCOUNT": "1000000000000"}
children = {
    "omp": subprocess.Popen([sys.executable, "-c", OMP_CHILD,
                             ",".join(map(str, drafter[1:] or drafter))],
                            env=env),
    "poll": subprocess.Popen([sys.executable, "-c", POLL_CHILD, str(drafter[0])]),
}
time.sleep(5)  # both loaded and spinning
prompt = {"prompt_token_ids": list(range(100, 356))}
params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
modes = {"none": (), "omp": ("omp",), "poll": ("poll",), "both": ("omp", "poll")}
rows: dict = {m: [] for m in modes}
try:
    llm.generate([prompt], params, use_tqdm=False)  # warm-up
    for r in range(rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for mode in order:
            for name, proc in children.items():
                os.kill(proc.pid, signal.SIGCONT if name in modes[mode] else signal.SIGSTOP)
            time.sleep(0.2)
            before = engine.step_timer.as_dict()
            llm.generate([prompt], params, use_tqdm=False)
            steps = per_step_ms(before, engine.step_timer.as_dict())
            rows[mode].append((steps["decode_step_ms"], steps["execute_ms"]))
finally:
    for proc in children.values():
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
print(f"plain decode beside a drafter's idle loads (engine on cores {kept}, loads on "
      f"{drafter}), {tokens} tokens x {rounds} rounds, medians, ms a step:")
base = statistics.median(x[0] for x in rows["none"])
for mode, v in rows.items():
    step = statistics.median(x[0] for x in v)
    print(f"  {mode:<5} decode step {step:.3f} (execute {statistics.median(x[1] for x in v):.3f})"
          f", {step - base:+.3f} against none")
