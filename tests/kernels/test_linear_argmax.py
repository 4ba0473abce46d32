"""linear_argmax (the CPU's greedy tokens without fp32 logits) against the argmax of the same
linear's logits (linear_small / linear_packed, then argmax_rows: numpy's first maximal index, a
NaN counting as the maximum): equal indices for fp32 and bf16, 1 to 64 rows, on the packed tiles
(its fold: each task's columns) and elsewhere (column chunks), with ties, NaNs and -inf placed
across chunk and panel boundaries; plus the model's compute_argmax and bad arguments."""
import pytest
import torch

from tests.utils import has_avx512_bf16
from vllm import _custom_ops as ops
from vllm.model_executor.sampler import argmax_rows

pytestmark = pytest.mark.skipif(not ops.has_kernel("linear_argmax", "cpu"),
                                reason="vllm._C without the CPU decode ops")


def reference(x, w, packed):
    logits = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
    if packed.numel() > 0:
        ops.linear_packed(logits, x, w, packed, None)
    else:
        ops.linear_small(logits, x, w, None)
    return argmax_rows(logits.float())


def argmax(x, w, packed):
    out = torch.full((x.shape[0],), -7, dtype=torch.long)
    ops.linear_argmax(out, x, w, packed)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 17, 40, 64])
# n: one column, a vector, a panel and one, a vector's tail, a chunk (4096) and a tail, a vocab
@pytest.mark.parametrize("n,k", [(1, 64), (16, 64), (17, 100), (300, 64), (4133, 96),
                                 (32000, 64)])
# the row-major kernels, the packed AVX512_BF16 tiles, AMX on the packed copy (where the CPU
# has it; auto: from 8 rows)
@pytest.mark.parametrize("packed,amx", [(False, "0"), (True, "0"), (True, "auto")])
def test_linear_argmax_equals_argmax_of_logits(dtype, m, n, k, packed, amx, monkeypatch):
    if packed and not (dtype == torch.bfloat16 and has_avx512_bf16()):
        pytest.skip("weights pack only bf16 on AVX512_BF16")
    monkeypatch.setenv("VLLM_CPU_AMX", amx)
    torch.manual_seed(m * 7 + n)
    x = torch.randn(m, k).to(dtype)
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    # ties: copies of earlier rows later on (a panel, a vector, a chunk apart)
    for src, dst in ((0, n - 1), (3, 3 + 16), (5, 5 + 4096), (1, 2)):
        if dst < n:
            w[dst] = w[src]
    p = ops.pack_linear(w) if packed else w.new_empty(0)
    assert torch.equal(argmax(x, w, p), reference(x, w, p))
    # a NaN column (beats every number; the first of two) and -inf rows
    if n >= 17:
        w2 = w.clone()
        w2[n // 2, 0] = float("nan")
        w2[n - 2, 0] = float("nan")
        p2 = ops.pack_linear(w2) if packed else w2.new_empty(0)
        got = argmax(x, w2, p2)
        assert torch.equal(got, reference(x, w2, p2)) and (got == n // 2).all()
    w3 = torch.full((n, k), float("-inf"), dtype=dtype)
    x3 = torch.ones(m, k, dtype=dtype)
    p3 = ops.pack_linear(w3) if packed else w3.new_empty(0)
    assert (argmax(x3, w3, p3) == 0).all()


@pytest.mark.parametrize("m", [1, 8, 40])
@pytest.mark.parametrize("packed", [False, True])
def test_linear_argmax_at_16_threads(m, packed, monkeypatch):
    """As above at the GPU machine's 16 host threads (here more threads than cores): more
    tasks and chunks to merge, the same indices."""
    if packed and not has_avx512_bf16():
        pytest.skip("weights pack only on AVX512_BF16")
    saved = torch.get_num_threads()
    torch.set_num_threads(16)
    try:
        torch.manual_seed(m)
        x, w = torch.randn(m, 64).bfloat16(), (torch.randn(32000, 64) / 8).bfloat16()
        w[20000] = w[7]  # a tie across tasks
        p = ops.pack_linear(w) if packed else w.new_empty(0)
        assert torch.equal(argmax(x, w, p), reference(x, w, p))
    finally:
        torch.set_num_threads(saved)


def test_linear_argmax_rejects_bad_arguments():
    x, w = torch.randn(2, 8), torch.randn(5, 8)
    with pytest.raises(RuntimeError, match="out must be a contiguous CPU int64"):
        ops.linear_argmax(torch.empty(2, dtype=torch.int32), x, w, w.new_empty(0))
    with pytest.raises(RuntimeError, match="features"):
        ops.linear_argmax(torch.empty(2, dtype=torch.long), x, torch.randn(5, 7), w.new_empty(0))
    with pytest.raises(RuntimeError, match="packed weight must be"):
        ops.linear_argmax(torch.empty(2, dtype=torch.long), x.bfloat16(), w.bfloat16(),
                          torch.empty(3, 3, dtype=torch.bfloat16))
