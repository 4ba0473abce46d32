"""The engine's processes allocate torch's CPU tensors on huge pages unless the user said
otherwise (vllm.huge_pages): the variable reaches a started process, a user's value wins, and
where the kernel grants huge pages on request a 64 MiB tensor does land on them."""
import os

import pytest

from vllm import huge_pages
from vllm.process_utils import start_process, stop_process


def child_reply(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(huge_pages.ENV, raising=False)
    else:
        monkeypatch.setenv(huge_pages.ENV, value)
    proc, conn = start_process("tests.huge_pages_child", "HugePagesChild", None)
    try:
        assert conn.poll(120), "the child did not answer"
        return conn.recv()
    finally:
        stop_process(proc)


def thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


def test_a_started_process_asks_for_huge_pages_by_default(monkeypatch):
    value, huge_kb, total = child_reply(monkeypatch, None)
    assert value == "1" and total == 64 << 20
    if thp_mode() in ("always", "madvise") and os.path.exists("/proc/self/smaps_rollup"):
        assert huge_kb >= 32 << 10  # most of the 64 MiB (the kernel may lack free huge pages)


def test_the_users_setting_wins(monkeypatch):
    value, huge_kb, _ = child_reply(monkeypatch, "0")
    assert value == "0"
    if thp_mode() == "madvise":
        assert huge_kb == 0  # nothing asked: nothing granted


def test_request_sets_the_default_and_says_whether_it_is_too_late(monkeypatch):
    monkeypatch.delenv(huge_pages.ENV, raising=False)
    assert huge_pages.request() is False  # torch is loaded in the test process
    assert os.environ[huge_pages.ENV] == "1"
    monkeypatch.setenv(huge_pages.ENV, "0")
    huge_pages.request()
    assert os.environ[huge_pages.ENV] == "0"


def test_the_api_server_module_asks_before_torch_loads(monkeypatch):
    """`python -m vllm.entrypoints.openai.api_server` (here with --help, which exits before any
    model loads) sets the variable before its imports load torch."""
    import subprocess
    import sys

    monkeypatch.delenv(huge_pages.ENV, raising=False)
    code = ("import runpy, sys, os\n"
            "sys.argv = ['api_server', '--help']\n"
            "try:\n"
            "    runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('THP', os.environ.get('THP_MEM_ALLOC_ENABLE'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items()
                                           if k != huge_pages.ENV})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "THP 1"
