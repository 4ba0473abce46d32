import pytest

from tests.tiny_models import build_model


@pytest.fixture(scope="session")
def spec_target(tmp_path_factory):
    return str(build_model(tmp_path_factory.mktemp("spec-target"), "llama", seed=0))


@pytest.fixture(scope="session")
def spec_draft(tmp_path_factory):
    """A different random model of the same vocabulary (fewer layers, other weights)."""
    return str(build_model(tmp_path_factory.mktemp("spec-draft"), "llama", seed=5,
                           num_hidden_layers=1))
