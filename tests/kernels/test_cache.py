"""reshape_and_cache and copy_blocks against their native references."""
import pytest
import torch

from tests.utils import DEVICES, DTYPES
from vllm import _custom_ops as ops
from vllm.model_executor.attention.paged_attention import (copy_blocks_native,
                                                            reshape_and_cache_native)


def random_caches(num_blocks, num_kv_heads, block_size, head_size, dtype, device, num_layers=1):
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    return ([torch.randn(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            [torch.randn(shape, dtype=dtype, device=device) for _ in range(num_layers)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_kv_heads,head_size", [(2, 64), (8, 128), (4, 80)])
def test_reshape_and_cache(device, block_size, num_kv_heads, head_size):
    num_blocks, num_tokens = 24, 45
    for dtype in DTYPES[device]:
        (kc,), (vc,) = random_caches(num_blocks, num_kv_heads, block_size, head_size, dtype,
                                     device)
        # key/value are views of one qkv activation: strided in their first dimension
        kv = torch.randn(num_tokens, 2, num_kv_heads, head_size, dtype=dtype, device=device)
        key, value = kv[:, 0], kv[:, 1]
        slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
        slots[::7] = -1  # padding tokens are skipped
        ref_kc, ref_vc = kc.clone(), vc.clone()
        reshape_and_cache_native(key, value, ref_kc, ref_vc, slots)
        ops.reshape_and_cache(key, value, kc, vc, slots)
        assert torch.equal(kc, ref_kc) and torch.equal(vc, ref_vc)
        t = 1  # slots[1] is a real slot: its rows landed at [block, :, offset]
        block, offset = divmod(int(slots[t]), block_size)
        assert torch.equal(kc[block, :, offset], key[t]) and torch.equal(vc[block, :, offset], value[t])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers", [1, 3])
def test_copy_blocks(device, num_layers):
    for dtype in DTYPES[device]:
        kcs, vcs = random_caches(32, 2, 16, 64, dtype, device, num_layers)
        perm = torch.randperm(32, device=device)
        mapping = torch.stack([perm[:6], perm[6:12]], dim=1)  # distinct src and dst blocks
        before = [c.clone() for c in kcs + vcs]
        ref_k, ref_v = [c.clone() for c in kcs], [c.clone() for c in vcs]
        copy_blocks_native(ref_k, ref_v, mapping)
        ops.copy_blocks(kcs, vcs, mapping)
        for got, want, old in zip(kcs + vcs, ref_k + ref_v, before):
            assert torch.equal(got, want)
            assert torch.equal(got[mapping[:, 1]], old[mapping[:, 0]])
