"""A process started by vllm.process_utils.start_process for tests/test_huge_pages.py: replies
with its THP_MEM_ALLOC_ENABLE and the kB of huge pages a 64 MiB tensor took."""
import os

from vllm.process_utils import child_connection


def main() -> None:
    conn, _ = child_connection()
    import torch

    x = torch.ones(64 << 20, dtype=torch.uint8)  # touched: its pages exist
    with open("/proc/self/smaps_rollup") as f:
        huge_kb = int(f.read().split("AnonHugePages:")[1].split()[0])
    conn.send((os.environ.get("THP_MEM_ALLOC_ENABLE"), huge_kb, int(x.sum())))


if __name__ == "__main__":
    main()
