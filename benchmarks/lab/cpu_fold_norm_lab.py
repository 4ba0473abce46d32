"""What the folded norm of a decode step costs each thread of its qkv and gate/up linears, apart
from the linear (issue 10: SmolLM2's batch-8 qkv stage took ~9 us a layer more with the norm
folded in than the linear alone on a 16-core host). cpu_fold_norm_lab.cpp, compiled here with
torch's cpp_extension against the extension's own row functions (csrc/cpu/row_ops.h), runs a
step's hand-off (the rows written by the other threads, a barrier) and then, on every thread,
the fold's add + RMS norm of all rows, from the shared rows or from the thread's own copy, or
only reading the shared rows. Prints microseconds an iteration beyond the hand-off alone,
medians of 5 passes taken in turns, by thread count and row count.
Usage: python benchmarks/lab/cpu_fold_norm_lab.py [threads,...] [hidden]"""
import os
import statistics
import sys

from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "..", "..", "csrc")
sys.path.insert(0, os.path.join(HERE, "..", ".."))
from vllm import _custom_ops as ops  # noqa: E402

# the row functions built for the ISA the extension's own were (cmake/cpu_isa.cmake)
AVX512 = ops.cpu_isa() == "avx512"
DEFS = (["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512bw",
         "-mavx512vl", "-mavx512dq"] if AVX512 else ["-DCPU_CAPABILITY=AVX2",
                                                      "-DCPU_CAPABILITY_AVX2"])
lab = load("cpu_fold_norm_lab", [os.path.join(HERE, "cpu_fold_norm_lab.cpp")],
           extra_cflags=["-O3", "-fopenmp", "-mavx2", "-mfma", "-mf16c", *DEFS],
           extra_include_paths=[CSRC], extra_ldflags=["-fopenmp"], verbose=False)
MODES = {1: "fold as is, shared rows", 2: "fold as is, own rows", 3: "read the shared rows",
         4: "fused 2 passes, shared", 5: "fused 2 passes, own",
         6: "fp32-domain rounding, shared", 7: "fp32-domain rounding, own"}
threads = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [2]
hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 576
print(f"the fused and fast rows give the fold's bits: {lab.same_bits(64, hidden)}")
for t in threads:
    for rows in (1, 8):
        times = {m: [] for m in range(8)}
        for _ in range(5):
            for m in times:
                times[m].append(lab.run(m, 4000, rows, hidden, t))
        base = statistics.median(times[0])
        line = ", ".join(f"{MODES[m]} +{statistics.median(times[m]) - base:.2f}"
                         for m in MODES)
        print(f"{t} threads, {rows} rows of {hidden}: hand-off alone {base:.2f} us; {line}",
              flush=True)
