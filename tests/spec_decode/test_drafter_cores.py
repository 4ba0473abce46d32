"""The API server keeps off the draft process's cores (a process waking on a drafter core stalls
the draft's thread pool at its next barrier): with --speculative-draft-cpus it pins itself to
the other cores; without a draft process it stays where it was. The drafter's default cores
keep off the engine's cores and their hyperthread siblings; it busy-waits by default only
there."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from vllm.process_utils import cpu_set
from vllm.spec_decode import draft_process

SCRIPT = """
import os, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.spec_decode.draft_process import keep_off_drafter_cores
kwargs = dict(model=sys.argv[1], device="cpu")
if sys.argv[2] != "none":
    kwargs.update(speculative_model=sys.argv[1], num_speculative_tokens=2, cpu_draft_worker=True,
                  speculative_draft_process="on", speculative_draft_cpus=sys.argv[2])
config = EngineArgs(**kwargs).create_engine_config()
print(keep_off_drafter_cores(config), sorted(os.sched_getaffinity(0)))
"""


def run(model: str, cpus: str) -> str:
    return subprocess.run([sys.executable, "-c", SCRIPT, model, cpus], capture_output=True,
                          text=True, check=True, timeout=300).stdout.strip().splitlines()[-1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_api_server_keeps_off_the_drafter_cores(tiny_llama):
    allowed = sorted(os.sched_getaffinity(0))
    drafter, rest = allowed[-1], allowed[:-1]
    assert run(tiny_llama, str(drafter)) == f"{rest} {rest}"
    assert run(tiny_llama, "none") == f"None {allowed}"


ENGINE_SCRIPT = """
import os, sys, torch
from vllm import LLM
llm = LLM(model=sys.argv[1], device="cpu", max_model_len=256, speculative_model=sys.argv[1],
          num_speculative_tokens=2, cpu_draft_worker=True, speculative_draft_process="on",
          speculative_draft_cpus=sys.argv[2])
drafter = llm.llm_engine.proposer
print(sorted(os.sched_getaffinity(0)), torch.get_num_threads(),
      sorted(os.sched_getaffinity(drafter.pid)))
llm.llm_engine.shutdown()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_an_offline_engine_keeps_off_its_draft_process_cores(tiny_llama):
    """The engine's own process (offline LLM, not an engine core) pins itself and its torch
    threads to the cores the drafter does not use."""
    allowed = sorted(os.sched_getaffinity(0))
    drafter, rest = allowed[-1], allowed[:-1]
    out = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT, tiny_llama, str(drafter)],
                         capture_output=True, text=True, check=True, timeout=600,
                         env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="0.25"))
    assert out.stdout.strip().splitlines()[-1] == f"{rest} {len(rest)} {[drafter]}"


def fake_target(device: str):
    return SimpleNamespace(device=torch.device(device))


@pytest.mark.parametrize("siblings,expected", [
    (lambda c: {c}, list(range(2, 16))),  # no SMT: all but the first two
    (lambda c: {c % 8, c % 8 + 8}, [2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]),  # 8 x 2 threads
])
def test_default_drafter_cores_keep_off_the_engine_cores_siblings(monkeypatch, siblings,
                                                                   expected):
    """A GPU target on 16 logical cores: the drafter gets neither of the first two cores nor
    their hyperthread siblings; a CPU target leaves every process unpinned."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(draft_process, "thread_siblings", siblings)
    assert draft_process.default_draft_cpus(fake_target("cuda")) == expected
    assert draft_process.default_draft_cpus(fake_target("cpu")) is None


def test_default_drafter_cores_with_too_few_left_after_siblings(monkeypatch):
    """4 logical cores, 2 x 2 threads: keeping the siblings off would leave the drafter none,
    so it gets all but the first two."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(draft_process, "thread_siblings", lambda c: {c % 2, c % 2 + 2})
    assert draft_process.default_draft_cpus(fake_target("cuda")) == [2, 3]


def test_thread_siblings_reads_this_machines_topology():
    cpu = min(os.sched_getaffinity(0))
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    siblings = draft_process.thread_siblings(cpu)
    assert cpu in siblings
    if os.path.exists(path):
        with open(path) as f:
            assert siblings == {cpu} | cpu_set(f.read().strip())


@pytest.mark.parametrize("mode,cpus,spins", [("auto", [2, 3], True), ("auto", None, False),
                                             ("on", None, True), ("off", [2, 3], False),
                                             ("1", None, True), ("0", [2], False)])
def test_drafter_spins_by_default_only_on_cores_of_its_own(monkeypatch, mode, cpus, spins):
    monkeypatch.setenv("VLLM_DRAFTER_SPIN", mode)
    assert draft_process.drafter_spins(cpus) is spins


def test_bad_drafter_spin_value_is_named(monkeypatch):
    monkeypatch.setenv("VLLM_DRAFTER_SPIN", "sometimes")
    with pytest.raises(ValueError, match="VLLM_DRAFTER_SPIN"):
        draft_process.drafter_spins(None)
