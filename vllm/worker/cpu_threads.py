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
                     tolerance: float = 0.05) -> tuple[int, dict[int, float]]:
    """The fewest threads whose median forward time is within `tolerance` of the fastest, and
    the median ms per count. Leaves torch set to the chosen count."""
    times: dict[int, float] = {}
    for n in counts:
        torch.set_num_threads(n)
        forward()  # the first call at a new count wakes its threads
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            forward()
            samples.append((time.perf_counter() - start) * 1e3)
        times[n] = statistics.median(samples)
    best = min(times.values())
    chosen = min(n for n, t in times.items() if t <= best * (1 + tolerance))
    torch.set_num_threads(chosen)
    return chosen, times
