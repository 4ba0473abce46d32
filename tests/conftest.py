"""Shared fixtures: a deterministic seed per test, and the kernel error report at the end."""
import gc
import zlib

import pytest
import torch

from tests.fixtures_models import qwen05_gguf, qwen15_gguf, smollm2_gguf  # noqa: F401
from tests.tiny_models import build_model
from tests.utils import ERRORS


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return str(build_model(tmp_path_factory.mktemp("tiny-llama"), "llama"))


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    return str(build_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", seed=1))


@pytest.fixture(scope="module", autouse=True)
def _collect_after_module():
    """Engines a test module dropped (weights, KV caches) are freed before the next module
    loads its own: the suite runs on machines of 24 GB."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def pytest_terminal_summary(terminalreporter):
    if not ERRORS:
        return
    terminalreporter.section("kernel relative error vs native reference (max over cases)")
    for (op, device, dtype), err in sorted(ERRORS.items()):
        terminalreporter.write_line(f"{op:<22} {device:<5} {dtype:<9} {err:.2e}")
