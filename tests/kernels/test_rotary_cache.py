"""rotary_embedding_and_cache against its native reference (RotaryEmbedding.forward_native, then
reshape_and_cache_native), and a model's step with the fused call against the two ops in turn."""
import dataclasses

import pytest
import torch

from tests.kernels.test_rotary_embedding import random_qkv, split_qkv
from tests.utils import DEVICES, DTYPES, assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.attention.paged_attention import reshape_and_cache_native
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim", [(64, 64), (128, 128), (80, 80), (128, 64)])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (14, 2)])
def test_rotary_embedding_and_cache(device, is_neox, head_size, rotary_dim, num_heads,
                                    num_kv_heads):
    num_tokens, num_blocks, block_size = 37, 12, 16
    for dtype in DTYPES[device]:
        rope = RotaryEmbedding(head_size, rotary_dim, 4096, 10000.0, is_neox, dtype).to(device)
        positions = torch.randint(0, 4096, (num_tokens,), device=device)
        _, q, k, v = random_qkv(num_tokens, num_heads, num_kv_heads, head_size, dtype, device)
        k3, v3 = (t.view(num_tokens, num_kv_heads, head_size) for t in (k, v))
        slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
        slots[::5] = -1  # padding tokens: rotated, not cached
        shape = (num_blocks, num_kv_heads, block_size, head_size)
        kc, vc = (torch.randn(shape, dtype=dtype, device=device) for _ in range(2))
        ref_q, ref_k = rope.forward_native(positions, q.contiguous(), k.contiguous())
        ref_kc, ref_vc = kc.clone(), vc.clone()
        reshape_and_cache_native(ref_k.view(num_tokens, num_kv_heads, head_size), v3.clone(),
                                 ref_kc, ref_vc, slots)
        v_before = v.clone()
        ops.rotary_embedding_and_cache(positions, q, k3, v3, head_size, rope.cos_sin_cache,
                                       is_neox, kc, vc, slots)
        assert_close("rotary_embedding_and_cache", q, ref_q, dtype)
        assert_close("rotary_embedding_and_cache", k, ref_k, dtype)
        assert_close("rotary_embedding_and_cache", kc, ref_kc, dtype)
        assert torch.equal(vc, ref_vc) and torch.equal(v, v_before)
        # the cache holds exactly the rotated key rows the op left in place
        keep = slots >= 0
        blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
        assert torch.equal(kc[blocks, :, offsets], k3[keep])
        untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=device)
        untouched[slots[keep]] = False
        flat = lambda c: c.transpose(1, 2).reshape(num_blocks * block_size, -1)
        assert torch.equal(flat(kc)[untouched], flat(ref_kc)[untouched])


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_and_cache_equals_the_two_ops(device):
    """Same values as rotary_embedding then reshape_and_cache (the layer's other path)."""
    num_tokens, heads, kv_heads, head_size = 9, 4, 2, 64
    for dtype in DTYPES[device]:
        rope = RotaryEmbedding(head_size, head_size, 512, 10000.0, True, dtype).to(device)
        positions = torch.randint(0, 512, (num_tokens,), device=device)
        qkv, *_ = random_qkv(num_tokens, heads, kv_heads, head_size, dtype, device)
        kc, vc = (torch.zeros(6, kv_heads, 16, head_size, dtype=dtype, device=device)
                  for _ in range(2))
        slots = torch.arange(num_tokens, device=device) * 3
        results = []
        for fused in (True, False):
            x, c_k, c_v = qkv.clone(), kc.clone(), vc.clone()
            q, k, v = split_qkv(x, heads, kv_heads, head_size)
            k3, v3 = (t.view(num_tokens, kv_heads, head_size) for t in (k, v))
            if fused:
                ops.rotary_embedding_and_cache(positions, q, k3, v3, head_size,
                                               rope.cos_sin_cache, True, c_k, c_v, slots)
            else:
                ops.rotary_embedding(positions, q, k, head_size, rope.cos_sin_cache, True)
                ops.reshape_and_cache(k3, v3, c_k, c_v, slots)
            results.append((x, c_k, c_v))
        for fused, separate in zip(*results):
            assert_close("rotary_embedding_and_cache vs the two ops", fused, separate, dtype,
                         tol_scale=0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_and_cache_names_bad_args(device):
    rope = RotaryEmbedding(64, 64, 512, 10000.0, True, torch.float32).to(device)
    positions = torch.arange(4, device=device)
    q = torch.randn(4, 2 * 64, device=device)
    kv = torch.randn(4, 2, 2, 64, device=device)  # [tokens, k|v, kv heads, head]
    kc, vc = (torch.zeros(4, 2, 16, 64, device=device) for _ in range(2))
    slots = torch.arange(4, device=device)
    with pytest.raises(RuntimeError, match="heads must be adjacent"):
        # heads 2 x 64 elements apart (k and v interleaved per head): no [tokens, row] view
        inter = torch.randn(4, 2, 2, 64, device=device)  # [tokens, heads, k|v, head]
        ops.rotary_embedding_and_cache(positions, q, inter[:, :, 0], inter[:, :, 1], 64,
                                       rope.cos_sin_cache, True, kc, vc, slots)
    with pytest.raises(RuntimeError, match="head_size"):
        ops.rotary_embedding_and_cache(positions, q, kv[:, 0], kv[:, 1], 32, rope.cos_sin_cache,
                                       True, kc, vc, slots)
    with pytest.raises(RuntimeError, match="slot_mapping"):
        ops.rotary_embedding_and_cache(positions, q, kv[:, 0], kv[:, 1], 64, rope.cos_sin_cache,
                                       True, kc, vc, slots[:3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", ["llama-mha", "llama-gqa", "qwen2-bias"])
def test_model_step_same_with_the_fused_call_on_and_off(device, shape, monkeypatch):
    """A model's prefill + decode step (the layers' path, not the CPU's decode_layers) gives the
    same hidden states and caches with VLLM_FUSED_ROTARY_CACHE on and off, and the switch
    decides which op runs."""
    from tests.kernels.test_cpu_decode import make_model, make_step
    from vllm.forward_context import set_forward_context

    monkeypatch.setenv("VLLM_CPU_DECODE_PATH", "native")
    model, config = make_model(shape, torch.float32)
    model = model.to(device)
    caches, md, positions = make_step(config, torch.float32, [9, 21, 4], [3, 1, 4])
    caches = [(k.to(device), v.to(device)) for k, v in caches]
    md = dataclasses.replace(md, **{f: getattr(md, f).to(device) for f in (
        "slot_mapping", "block_tables", "context_lens", "query_start_loc")})
    ids = torch.randint(0, config.vocab_size, (positions.shape[0],), device=device)
    calls = []
    real = ops.rotary_embedding_and_cache
    monkeypatch.setattr(ops, "rotary_embedding_and_cache",
                        lambda *a: calls.append(1) or real(*a))
    out = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("VLLM_FUSED_ROTARY_CACHE", switch)
        calls.clear()
        step_caches = [(k.clone(), v.clone()) for k, v in caches]
        with torch.inference_mode(), set_forward_context(md, step_caches):
            out[switch] = (model(ids, positions.to(device)), step_caches)
        assert len(calls) == (config.num_hidden_layers if switch == "1" else 0)
    (h_on, c_on), (h_off, c_off) = out["1"], out["0"]
    assert_close("model step fused rotary+cache", h_on, h_off.double(), torch.float32)
    # the first layer's values come straight from the embeddings: the same bits either way;
    # later layers' inputs differ in the last bits where the CUDA kernels' rotations round apart
    assert torch.equal(c_on[0][1], c_off[0][1])
    for (k_on, v_on), (k_off, v_off) in zip(c_on, c_off):
        assert_close("caches fused rotary+cache", k_on, k_off.double(), torch.float32)
        assert_close("caches fused rotary+cache", v_on, v_off.double(), torch.float32)
