"""Helpers for the processes the engine starts: die with the parent, pin to cores."""
import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any, Optional

from vllm import huge_pages

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Asks Linux to send sig to this process when its parent exits (no orphans, even when the
    parent is killed with SIGKILL). A no-op where prctl is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent is already gone
        os.kill(os.getpid(), sig)


def parse_cpu_list(text: Optional[str]) -> Optional[list[int]]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; None or '' -> None. Every core must be one
    this process may run on."""
    if not text:
        return None
    try:
        cpus = cpu_set(text)
    except ValueError:
        raise ValueError(f"speculative_draft_cpus {text!r} is not a CPU list like "
                         "'0-3,8'") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise ValueError(f"speculative_draft_cpus {text!r} names cores this machine does not "
                         f"offer (allowed: {sorted(allowed)})")
    return sorted(cpus)


def cpu_set(text: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8} (the kernel's CPU list format); ValueError if malformed."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def start_process(module: str, name: str, payload: Any,
                  env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen, Connection]:
    """Starts `python -m module` as a child process named `name` (shown in every log line),
    joined to this one by a duplex pipe; payload is its first message (its arguments); env:
    variables set for it alone (torch's CPU allocations on huge pages unless the user said
    otherwise: vllm.huge_pages). A fresh interpreter, unlike multiprocessing's spawn, never
    re-runs the caller's __main__."""
    parent_conn, child_conn = multiprocessing.Pipe()
    fd = child_conn.fileno()
    env = {**os.environ, **huge_pages.child_env(), **(env or {}), "VLLM_PROCESS_NAME": name}
    proc = subprocess.Popen([sys.executable, "-m", module, str(fd)], pass_fds=(fd,), env=env,
                            stdin=subprocess.DEVNULL)
    child_conn.close()
    parent_conn.send(payload)
    return proc, parent_conn


def child_connection() -> tuple[Connection, Any]:
    """In a process started by start_process: its pipe and its payload."""
    conn = Connection(int(sys.argv[1]))
    return conn, conn.recv()


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after timeout; always reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
