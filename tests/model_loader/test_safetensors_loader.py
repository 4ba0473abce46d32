"""iter_safetensors_weights / load_hf_config on small checkpoints written by transformers."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from vllm.model_executor.model_loader.safetensors_loader import INDEX_FILE, \
    iter_safetensors_weights, load_hf_config, safetensors_files


def _tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny():
    return _tiny_llama()


def _saved(model, directory, **kwargs):
    model.save_pretrained(directory, **kwargs)
    return directory


def test_single_file_checkpoint(tiny, tmp_path):
    d = _saved(tiny, tmp_path / "m")
    assert [p.name for p in safetensors_files(d)] == ["model.safetensors"]
    weights = dict(iter_safetensors_weights(d))
    reference = tiny.state_dict()
    assert set(weights) == set(reference)
    for name, tensor in weights.items():
        assert torch.equal(tensor, reference[name]), name
    config = load_hf_config(d)
    assert config.model_type == "llama" and config.hidden_size == 32
    bf16 = dict(iter_safetensors_weights(d, dtype=torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())


def test_sharded_checkpoint(tiny, tmp_path):
    d = _saved(tiny, tmp_path / "m", max_shard_size="20KB")
    assert (d / INDEX_FILE).is_file()
    files = safetensors_files(d)
    assert len(files) > 1
    weights = dict(iter_safetensors_weights(d))
    reference = tiny.state_dict()
    assert set(weights) == set(reference)
    assert all(torch.equal(weights[k], reference[k]) for k in reference)

    files[1].unlink()
    with pytest.raises(FileNotFoundError) as e:
        list(iter_safetensors_weights(d))
    assert str(d) in str(e.value) and files[1].name in str(e.value) and "missing" in str(e.value)


def test_missing_directory_and_files(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        list(iter_safetensors_weights(missing))
    assert str(missing) in str(e.value)
    with pytest.raises(ValueError, match="does not exist") as e:
        load_hf_config(missing)
    assert str(missing) in str(e.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("hi")
    with pytest.raises(FileNotFoundError, match="model.safetensors") as e:
        list(iter_safetensors_weights(empty))
    assert str(empty) in str(e.value) and "README.md" in str(e.value)
    with pytest.raises(ValueError, match="no config.json") as e:
        load_hf_config(empty)
    assert str(empty) in str(e.value)


def test_corrupt_files(tiny, tmp_path):
    d = _saved(tiny, tmp_path / "m")
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupt") as e:
        list(iter_safetensors_weights(d))
    assert str(path) in str(e.value)
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match="weight_map"):
        list(iter_safetensors_weights(d))
