"""Timing and floor helpers shared by the benchmarks: median/min/max of repeated runs (device
events on CUDA), the memory bandwidth measured in the same run, and the run's provenance."""
import json
import statistics
import os
import subprocess
import sys
import time
from typing import Any, Callable, Optional

import torch


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object], device: str, warmup: int = 3,
            iters: int = 20) -> dict[str, float]:
    """Median, min and max milliseconds of fn over iters runs after warmup runs."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def copy_bandwidth_gbps(device: str, nbytes: int) -> float:
    """Bytes read plus bytes written per second by a large same-device copy, in GB/s."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = time_ms(lambda: dst.copy_(src), device, warmup=2, iters=10)["median"]
    return 2 * nbytes / (t * 1e-3) / 1e9


def write_json(path: Optional[str], result: dict, args: Any) -> None:
    """The benchmark's result and its arguments as JSON at path (nothing when path is None)."""
    if path:
        with open(path, "w") as f:
            json.dump({**result, "args": vars(args)}, f, indent=2, default=str)


def source_fingerprint() -> str:
    """sha256 (first 12 hex digits) over the engine's, kernels' and benchmarks' source files as
    they are on disk: identifies the code that ran where git's HEAD may not (a copied tree)."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    files = [root / "CMakeLists.txt", *root.glob("vllm/**/*.py"), *root.glob("csrc/**/*.*"),
             *root.glob("benchmarks/*.py")]
    for path in sorted(f for f in files if f.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def git_commit(root: str) -> str:
    """root's git HEAD, short, with "+dirty" where its tracked files differ from it (a copied
    tree whose .git came along stale reads so, rather than as the commit it no longer is);
    "unknown" without git or a repository."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=False)

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return "unknown"
        dirty = git("diff", "--quiet", "HEAD", "--").returncode != 0
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def host_cpu(cpuinfo: str = "/proc/cpuinfo",
             l3_size: str = "/sys/devices/system/cpu/cpu0/cache/index3/size") -> str:
    """The CPU's model name and its first core's last-level cache (hosts of one kind differ:
    the H100 machines' 16-core hosts have shown 105 and 300 MB of L3), e.g. "Intel(R) Xeon(R)
    Processor, L3 307200K"; "unknown" for what cannot be read."""
    def first_line(path: str, prefix: str = "") -> Optional[str]:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(prefix):
                        return line.split(":", 1)[1].strip() if prefix else line.strip()
        except OSError:
            pass
        return None

    return (f"{first_line(cpuinfo, 'model name') or 'unknown'}, "
            f"L3 {first_line(l3_size) or 'unknown'}")


def provenance() -> dict[str, str]:
    """The command, the commit, a fingerprint of the source, torch, the CPU and the device. A copied
    tree (the GPU machine's) can carry a stale git HEAD: a `.source_commit` file at the root,
    written beside the copy (`git rev-parse --short HEAD > .source_commit`), wins; without it
    a tree that differs from its HEAD reads "<HEAD>+dirty"."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    marker = os.path.join(root, ".source_commit")
    if os.path.exists(marker):
        with open(marker) as f:
            commit = f.read().strip()
    else:
        commit = git_commit(root)
    info = {"command": " ".join(sys.argv), "commit": commit,
            "source_sha256": source_fingerprint(), "torch": torch.__version__,
            "cpu_threads": str(torch.get_num_threads()), "cpu": host_cpu()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
