"""The thread count of a CPU model's decode step, chosen by measurement: a small model's one-token
forward streams a few MB of weights, and past a handful of threads the cost of waking them
outgrows the bandwidth they add (on a 16-core host the draft's optimum was 4, not 16)."""
import os
import statistics
import time
from typing import Callable

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)


def candidate_counts() -> list[int]:
    """1, 2, 4, ... up to the cores this process may run on, and that count itself."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return sorted(set(counts) | {cores})


def pick_num_threads(forward: Callable[[], object], counts: list[int], repeats: int = 5,
                     tolerance: float = 0.05, rounds: int = 3) -> tuple[int, dict[int, float]]:
    """The fewest threads whose median forward time is within `tolerance` of the fastest, and
    the median ms per count. The counts are timed in `rounds` interleaved rounds (forward, then
    backward order), `repeats` forwards a count a round, so that a host's drift over the
    measurement (a neighbour's burst, a clock change) lands on every count rather than on the
    one measured during it: on the H100's 16-core host a count-by-count measurement picked 16
    threads for draft-20m, which then ran 1.46x slower than at 8. Leaves torch set to the
    chosen count."""
    samples: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(rounds):
        for n in (counts if r % 2 == 0 else counts[::-1]):
            torch.set_num_threads(n)
            forward()  # the first call at a new count wakes its threads
            for _ in range(repeats):
                start = time.perf_counter()
                forward()
                samples[n].append((time.perf_counter() - start) * 1e3)
    times = {n: statistics.median(samples[n]) for n in counts}
    best = min(times.values())
    chosen = min(n for n, t in times.items() if t <= best * (1 + tolerance))
    torch.set_num_threads(chosen)
    return chosen, times
