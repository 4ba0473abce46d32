"""The API server keeps off the draft process's cores (a process waking on a drafter core stalls
the draft's thread pool at its next barrier): with --speculative-draft-cpus it pins itself to
the other cores; without a draft process it stays where it was."""
import os
import subprocess
import sys

import pytest

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
