"""The GGUF loader against transformers' own GGUF path, on real weights.

Our loader (gguf package + our name mapping + our q/k un-permutation) fills a plain transformers
model; transformers' `from_pretrained(dir, gguf_file=...)` builds the reference. Same weights =>
same logits to the last bit, and the same greedy text.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, \
    Qwen2ForCausalLM

from vllm.model_executor.model_loader.gguf_loader import GGUFError, _source_stamp, load_gguf, \
    unpermute_rotary_rows

_MODEL_CLASSES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Small models on a shared 2-core machine: one intra-op thread is as fast as two when the
    machine is idle and ~15x faster when other jobs compete (OpenMP threads then spin)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _load_ours(path: Path):
    """A transformers model filled from our loader: strict, with tied weights handled."""
    ckpt = load_gguf(path)
    config = ckpt.config
    model = _MODEL_CLASSES[config.model_type](config).to(torch.float32).eval()
    state = dict(ckpt.iter_weights())
    assert all(t.dtype == torch.float32 for t in state.values())
    if config.tie_word_embeddings:
        assert "lm_head.weight" not in state, "a tied checkpoint must not yield lm_head.weight"
        result = model.load_state_dict(state, strict=False)
        assert result.unexpected_keys == [] and result.missing_keys == ["lm_head.weight"], result
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        model.load_state_dict(state, strict=True)
    return ckpt, model, state


def _load_reference(path: Path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()


class _Pair:
    def __init__(self, path: Path):
        self.path = path
        self.ckpt, self.ours, self.state = _load_ours(path)
        self.ref = _load_reference(path)
        self.tokenizer = self.ckpt.load_tokenizer()

    def ids(self, prompt: str) -> torch.Tensor:
        return self.tokenizer(prompt, return_tensors="pt").input_ids

    def greedy(self, model, prompt: str, n: int = 16) -> torch.Tensor:
        ids = self.ids(prompt)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        return out[0, ids.shape[1]:]


def _check_weights_equal(pair: _Pair) -> None:
    ref_state = pair.ref.state_dict()
    assert set(pair.state) <= set(ref_state)
    for name, tensor in pair.state.items():
        assert tensor.shape == ref_state[name].shape, name
        assert torch.equal(tensor, ref_state[name]), f"{name} differs from transformers' GGUF load"


def _check_logits(pair: _Pair, prompts: list[str], atol: float) -> None:
    for prompt in prompts:
        ids = pair.ids(prompt)
        with torch.no_grad():
            ours = pair.ours(ids).logits
            ref = pair.ref(ids).logits
        assert ours.shape == ref.shape == (1, ids.shape[1], pair.ckpt.config.vocab_size)
        torch.testing.assert_close(ours, ref, atol=atol, rtol=0, msg=lambda m: f"{prompt!r}: {m}")
        assert torch.equal(ours[0, -1].argmax(), ref[0, -1].argmax())


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M (llama architecture: permuted q/k, tied embedding)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> _Pair:
    return _Pair(smollm2_gguf)


SMOLLM2_PROMPTS = ["The capital of France is", "def fibonacci(n):",
                   "Once upon a time, in a small village,"]


def test_smollm2_config_and_shapes(smollm2):
    config = smollm2.ckpt.config
    assert config == AutoConfig.from_pretrained(smollm2.path.parent, gguf_file=smollm2.path.name)
    assert config.model_type == "llama" and config.tie_word_embeddings
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size) == (30, 576, 9, 3, 49152)
    shapes = smollm2.ckpt.weight_shapes()
    assert shapes == {k: tuple(v.shape) for k, v in smollm2.state.items()}
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (576, 576)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (192, 576)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (576, 1536)
    assert "lm_head.weight" not in shapes


def test_smollm2_weights_equal_transformers(smollm2):
    _check_weights_equal(smollm2)


def test_smollm2_logits_equal_transformers(smollm2):
    _check_logits(smollm2, SMOLLM2_PROMPTS, atol=1e-5)


def test_smollm2_greedy_generation(smollm2):
    ours = smollm2.greedy(smollm2.ours, "The capital of France is")
    ref = smollm2.greedy(smollm2.ref, "The capital of France is")
    assert torch.equal(ours, ref)
    text = smollm2.tokenizer.decode(ours)
    assert len(ours) == 16 and "Paris" in text, text


def test_smollm2_tokenizer_matches_transformers_gguf(smollm2):
    ref = AutoTokenizer.from_pretrained(smollm2.path.parent, gguf_file=smollm2.path.name)
    tok = smollm2.tokenizer
    assert tok.is_fast and len(tok) == len(ref) == 49152
    for text in ["Hello, world!", "def f(x):\n\treturn x ** 2  # ünïcödé 你好", " "]:
        assert tok(text).input_ids == ref(text).input_ids
    messages = [{"role": "user", "content": "What is 2+2?"}]
    assert (tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    assert (tok.eos_token_id, tok.bos_token_id) == (ref.eos_token_id, ref.bos_token_id)


# ----------------------------------------------------------------------------------------------
# Qwen2.5-Coder-0.5B (qwen2: no permutation, q/k/v biases, untied lm_head)


@pytest.mark.slow
def test_qwen05_matches_transformers(qwen05_gguf):
    pair = _Pair(qwen05_gguf)
    config = pair.ckpt.config
    assert config == AutoConfig.from_pretrained(qwen05_gguf.parent, gguf_file=qwen05_gguf.name)
    assert config.model_type == "qwen2" and not config.tie_word_embeddings
    assert "lm_head.weight" in pair.state
    assert pair.state["model.layers.0.self_attn.q_proj.bias"].shape == (896,)
    assert pair.state["model.layers.0.self_attn.k_proj.weight"].shape == (128, 896)
    _check_weights_equal(pair)
    del pair.state
    _check_logits(pair, ["def quicksort(arr):", "The capital of France is"], atol=1e-4)
    prompt = "def fibonacci(n):\n"
    ours = pair.greedy(pair.ours, prompt)
    assert torch.equal(ours, pair.greedy(pair.ref, prompt))
    text = pair.tokenizer.decode(ours)
    assert "fibonacci" in text or "return" in text, text


# ----------------------------------------------------------------------------------------------
# the permutation, and broken files


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The row order llama.cpp's converter writes (its documented RoPE layout): the two halves
    of each head interleaved."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("shape,n_heads", [((24, 5), 3), ((8, 3), 1), ((12,), 2)])
def test_unpermute_inverts_llama_cpp_permute(shape, n_heads):
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(unpermute_rotary_rows(_llama_cpp_permute(w, n_heads), n_heads), w)
    # head h, rotary pair i: rows (h, i) and (h, i + d/2) end up adjacent in llama.cpp's order
    d = shape[0] // n_heads
    permuted = _llama_cpp_permute(w, n_heads)
    np.testing.assert_array_equal(permuted[1], w[d // 2])


def test_truncated_gguf_raises_naming_file(smollm2_gguf, tmp_path):
    for keep in (4096, 30_000_000):  # cut in the vocabulary metadata / in the tensor data
        broken = tmp_path / f"cut{keep}.gguf"
        with open(smollm2_gguf, "rb") as src, open(broken, "wb") as dst:
            dst.write(src.read(keep))
        with pytest.raises(GGUFError, match="truncated or corrupt") as e:
            load_gguf(broken)
        assert str(broken) in str(e.value)


def test_not_a_gguf_raises(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(GGUFError, match="is not a GGUF file") as e:
        load_gguf(bogus)
    assert str(bogus) in str(e.value)
    with pytest.raises(FileNotFoundError, match="nothere.gguf"):
        load_gguf(tmp_path / "nothere.gguf")


def test_sidecar_is_reused_and_invalidated_when_the_gguf_changes(smollm2_gguf, tmp_path):
    directory = load_gguf(smollm2_gguf).tokenizer_dir  # built (once) by the module fixture
    assert directory == smollm2_gguf.parent / "SmolLM2-135M-Instruct.Q4_1-hf"
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in directory.iterdir()}
    stamp = (directory / "gguf_source.json").stat().st_mtime_ns
    assert load_gguf(smollm2_gguf).tokenizer_dir == directory
    assert (directory / "gguf_source.json").stat().st_mtime_ns == stamp  # reused, not rebuilt

    copy = tmp_path / smollm2_gguf.name
    shutil.copyfile(smollm2_gguf, copy)
    side = tmp_path / directory.name
    shutil.copytree(directory, side)
    (side / "gguf_source.json").write_text(json.dumps(_source_stamp(copy)))
    ckpt = load_gguf(copy)
    assert ckpt._sidecar_valid(side)
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the GGUF was replaced
    assert not ckpt._sidecar_valid(side)
