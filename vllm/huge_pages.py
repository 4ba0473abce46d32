"""Transparent huge pages for torch's CPU allocations (weights, KV cache, activations).

torch's CPU allocator aligns allocations of 2 MiB and more to 2 MiB and asks the kernel for
huge pages for them (madvise) when THP_MEM_ALLOC_ENABLE=1; it reads the variable once, at its
first allocation, so it must be set before a process allocates any tensor. A one-token forward
walks every weight once: with 4 KiB pages that is a TLB miss every 4 KiB, with huge pages one
every 2 MiB. Measured on the 2-core machine (llama-68m shape, bf16, 2 threads, five runs each
way, alternating): the draft's batch-1 forward 3.64 -> 2.82 ms (median), batch 8 unchanged (its
GEMMs are compute-bound there). Every process the engine starts (engine core, draft process)
gets it, and so do the `vllm` command, `python -m vllm.entrypoints.openai.api_server`, the
example and the benchmarks (they set it before torch loads); a user's own THP_MEM_ALLOC_ENABLE
(0 turns it off) is left as it is. Where the kernel's THP mode
is `never` it changes nothing."""
import os
import sys

ENV = "THP_MEM_ALLOC_ENABLE"


def child_env() -> dict[str, str]:
    """The variable as a process started now should see it (the user's value wins)."""
    return {ENV: os.environ.get(ENV, "1")}


def request() -> bool:
    """Asks for huge pages in this process; True if that can still take effect (torch has not
    been imported yet)."""
    os.environ.setdefault(ENV, "1")
    return "torch" not in sys.modules
