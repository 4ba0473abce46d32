"""rotary_embedding against RotaryEmbedding.forward_native, neox and gpt-j styles."""
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
