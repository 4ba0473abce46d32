"""The GPU's prefill-only attention (every prompt from an empty cache): several prompts of
different lengths in one batch, each attending causally over its own rows only, equal a float64
reference; fp16/bf16 take one variable-length flash call, fp32 SDPA a prompt at a time."""
import pytest
import torch

from tests.utils import DEVICES, assert_close
from vllm.model_executor.attention.layer import Attention


def reference(q, k, v, lens, scale):
    out, start = [], 0
    group = q.shape[1] // k.shape[1]
    for n in lens:
        qs, ks, vs = (t[start:start + n].double().transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        scores = qs @ ks.transpose(1, 2) * scale
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1),
                                    float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out).to(q.dtype)


@pytest.mark.parametrize("device", DEVICES[1:])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", [(8, 8, 64), (8, 2, 128)])
def test_dense_prefill_of_several_prompts(device, dtype, num_heads, num_kv_heads, head_size):
    lens = [5, 17, 1, 33, 128]
    total = sum(lens)
    # q, k, v as the layer gets them: views into one fused qkv projection's rows
    qkv = torch.randn(total, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype,
                      device=device)
    q, k, v = qkv.split([num_heads * head_size, num_kv_heads * head_size,
                         num_kv_heads * head_size], dim=-1)
    q = q.view(total, num_heads, head_size)
    k, v = (t.view(total, num_kv_heads, head_size) for t in (k, v))
    starts = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    scale = head_size**-0.5
    layer = Attention(num_heads, head_size, scale, num_kv_heads, layer_idx=0)
    out = layer._dense_prefill(q, k, v, starts, lens)
    assert out.shape == q.shape
    assert_close("dense prefill", out, reference(q, k, v, lens, scale), dtype)
