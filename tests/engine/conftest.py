import pytest

from tests.tiny_models import build_model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return str(build_model(tmp_path_factory.mktemp("tiny-llama"), "llama"))


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    return str(build_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", seed=1))
