"""Fixtures for the model-loader tests: the real GGUF files (tests/fixtures_models.py)."""
from tests.fixtures_models import qwen05_gguf, smollm2_gguf  # noqa: F401


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a minute on 2 CPU cores")
