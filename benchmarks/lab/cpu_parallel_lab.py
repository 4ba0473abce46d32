"""What one parallel region costs a decode step's small ops on this CPU (issue 10: a batch-8
SmolLM2 step's norms, rotary and activation cost ~6 us each at 16 threads where their work is
well under a microsecond). cpu_parallel_lab.cpp, compiled here with torch's cpp_extension, runs
one tiny task (read a buffer the task before wrote on other cores, rewrite a share of it) many
times per mode: a region per task (at::parallel_for, as the vllm._C CPU ops run), one thread, or
one region for all tasks with the master handing each to threads spinning on a counter (their
completions counted on one shared counter, or each thread's its own flag). Prints
microseconds per task by thread count and buffer size, medians of 5 passes taken in turns.
Usage: python benchmarks/lab/cpu_parallel_lab.py [threads,...]"""
import os
import statistics
import sys

from torch.utils.cpp_extension import load

lab = load("cpu_parallel_lab", [os.path.join(os.path.dirname(__file__), "cpu_parallel_lab.cpp")],
           extra_cflags=["-O3", "-fopenmp", "-march=native"], extra_ldflags=["-fopenmp"],
           verbose=False)
MODES = ("region per task", "one thread", "spinning team", "team, a done flag a thread")
threads = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [2, 4, 8, 16]
for elems in (8 * 576, 8 * 1536 * 2):  # a batch-8 SmolLM2 norm's row block; its gate/up rows
    for t in threads:
        times = {m: [] for m in range(len(MODES))}
        for _ in range(5):
            for m in range(len(MODES)):
                times[m].append(lab.run(m, 2000, elems, t))
        line = ", ".join(f"{MODES[m]} {statistics.median(v):.2f}" for m, v in times.items())
        print(f"{elems} fp32, {t} threads (us a task): {line}", flush=True)
