"""rotary_embedding against RotaryEmbedding.forward_native, neox and gpt-j styles; the cos/sin
cache against Python's math module."""
import math

import numpy as np
import pytest
import torch

from tests.utils import DEVICES, DTYPES, assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding


def random_qkv(num_tokens, num_heads, num_kv_heads, head_size, dtype, device):
    """(qkv, q, k, v): one fused qkv activation and its row-strided q, k, v views [num_tokens,
    heads * head_size], as in the models."""
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype,
                      device=device)
    return (qkv, *split_qkv(qkv, num_heads, num_kv_heads, head_size))


def split_qkv(qkv, num_heads, num_kv_heads, head_size):
    return qkv.split([num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size],
                     dim=-1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim", [(64, 64), (128, 128), (80, 80), (128, 64)])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (14, 2)])
def test_rotary_embedding(device, is_neox, head_size, rotary_dim, num_heads, num_kv_heads):
    num_tokens = 37
    for dtype in DTYPES[device]:
        rope = RotaryEmbedding(head_size, rotary_dim, 4096, 10000.0, is_neox, dtype).to(device)
        positions = torch.randint(0, 4096, (num_tokens,), device=device)
        _, q, k, _ = random_qkv(num_tokens, num_heads, num_kv_heads, head_size, dtype, device)
        ref_q, ref_k = rope.forward_native(positions, q.contiguous(), k.contiguous())
        ops.rotary_embedding(positions, q, k, head_size, rope.cos_sin_cache, is_neox)
        assert_close("rotary_embedding", q, ref_q, dtype)
        assert_close("rotary_embedding", k, ref_k, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_embedding_3d_contiguous(device):
    rope = RotaryEmbedding(64, 64, 512, 10000.0, True, torch.float32).to(device)
    positions = torch.arange(10, device=device)
    q = torch.randn(10, 4, 64, device=device)
    k = torch.randn(10, 2, 64, device=device)
    ref_q, ref_k = rope.forward_native(positions, q.reshape(10, -1), k.reshape(10, -1))
    out_q, out_k = rope(positions, q, k)
    assert_close("rotary_embedding", out_q.reshape(10, -1), ref_q, torch.float32)
    assert_close("rotary_embedding", out_k.reshape(10, -1), ref_k, torch.float32)


def angles_of(rope: RotaryEmbedding, base: float, max_positions: int) -> torch.Tensor:
    """The fp32 angles the cache is built from (position x inverse frequency, as HF computes)."""
    inv_freq = 1.0 / (base**(torch.arange(0, rope.rotary_dim, 2, dtype=torch.float)
                             / rope.rotary_dim))
    return torch.outer(torch.arange(max_positions, dtype=torch.float), inv_freq)


def test_cos_sin_cache_is_the_nearest_fp32_of_each_angle():
    """Every cached cosine and sine is the fp32 nearest Python's math.cos / math.sin of its fp32
    angle: within half an ulp of its own magnitude (torch's fp32 cos and sin are within 0.6
    ulp here, so they would fail; its first cos call was seen 1.5e-4 off for half a cache in a
    process that had changed its thread count)."""
    base, positions = 10000.0, 4096
    rope = RotaryEmbedding(128, 128, positions, base, True, torch.float32)
    angles = angles_of(rope, base, positions).flatten().tolist()
    half = rope.rotary_dim // 2
    cached = rope.cos_sin_cache.double()
    exact = torch.tensor([[math.cos(a) for a in angles], [math.sin(a) for a in angles]],
                         dtype=torch.float64)
    got = torch.stack((cached[:, :half].flatten(), cached[:, half:].flatten()))
    ulp = torch.from_numpy(np.spacing(exact.abs().float().numpy())).double()
    worst = ((got - exact).abs() / ulp).max().item()
    assert worst <= 0.5 + 1e-6, f"cos/sin cache off by {worst:.3f} ulp"
