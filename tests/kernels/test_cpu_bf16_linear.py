"""The layers' bf16 linear on a CPU whose vllm._C is the AVX2 build (no AVX512_BF16), where
torch's bf16 GEMM is 3-5x slower than the alternatives: linear_small up to 64 rows, torch's fp32
GEMM on fp32 copies above (a prefill, a draft's catch-up). Both equal F.linear in fp32 within
bf16 tolerance, and the layers' linear routes a bf16 CPU call there (never to torch's bf16 GEMM)
when the build is AVX2, and nowhere else."""
import pytest
import torch
import torch.nn.functional as F

from tests.utils import assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.layers import linear as linear_layers

pytestmark = pytest.mark.skipif(not ops.has_kernel("linear_small", "cpu"),
                                reason="vllm._C without the CPU linear_small")


# rows: the GEMV (1, 8), its 4-row passes with rows left over (13), the most it takes (64), the
# fp32 GEMM above (65, 200); a [batch, tokens, in] input (the fp32 GEMM)
@pytest.mark.parametrize("shape", [(1, 96), (8, 96), (13, 96), (64, 96), (65, 96), (200, 96),
                                   (2, 5, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_bf16_linear_matches_f_linear(shape, bias):
    torch.manual_seed(shape[0])
    x = torch.randn(*shape, dtype=torch.bfloat16)
    w = torch.randn(70, 96, dtype=torch.bfloat16) / 10
    b = torch.randn(70, dtype=torch.bfloat16) if bias else None
    out = linear_layers.cpu_bf16_linear(x, w, b)
    assert out.dtype == torch.bfloat16 and out.shape == (*shape[:-1], 70)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert_close("cpu bf16 linear", out.float(), ref, torch.bfloat16)


def test_the_fp32_path_converts_the_weight_a_slice_at_a_time(monkeypatch):
    """Above 64 rows the weight goes to fp32 in slices of rows (an LM head whole would be ~1
    GB): several slices, a ragged last one and a bias, the reference's values."""
    torch.manual_seed(1)
    x = torch.randn(100, 96, dtype=torch.bfloat16)
    w = torch.randn(70, 96, dtype=torch.bfloat16) / 10
    b = torch.randn(70, dtype=torch.bfloat16)
    whole = linear_layers.cpu_bf16_linear(x, w, b)
    monkeypatch.setattr(linear_layers, "CPU_FP32_SLICE_ELEMS", 96 * 16)  # 16 rows a slice
    sliced = linear_layers.cpu_bf16_linear(x, w, b)
    assert_close("cpu bf16 linear slices vs whole", sliced.float(), whole.float(),
                 torch.bfloat16)
    assert_close("cpu bf16 linear sliced", sliced.float(),
                 F.linear(x.float(), w.float(), b.float()), torch.bfloat16)


def spy_bf16_gemms(monkeypatch) -> list:
    """The input shapes of every bf16 call of torch's F.linear from here on (the list fills as
    the calls come)."""
    calls = []
    f_linear = F.linear

    def spy(x, w, b=None):
        if x.dtype == torch.bfloat16:
            calls.append(tuple(x.shape))
        return f_linear(x, w, b)
    monkeypatch.setattr(linear_layers.F, "linear", spy)
    return calls


@pytest.mark.parametrize("avx2", [True, False])
def test_layers_route_cpu_bf16_by_build(avx2, monkeypatch):
    """With the AVX2 build a bf16 CPU call (8 rows: linear_small; 100 rows: the fp32 GEMM) never
    reaches torch's bf16 GEMM; with another build it does, as before; fp32 never changes."""
    monkeypatch.setattr(linear_layers, "_cpu_bf16_gemm_is_slow", lambda: avx2)
    bf16_gemms = spy_bf16_gemms(monkeypatch)
    w = torch.randn(40, 32, dtype=torch.bfloat16)
    for rows in (8, 100):
        x = torch.randn(rows, 32, dtype=torch.bfloat16)
        with torch.no_grad():
            out = linear_layers.linear(x, w)
        assert_close("layers linear", out.float(), F.linear(x.float(), w.float()), torch.bfloat16)
    assert bf16_gemms == ([] if avx2 else [(8, 32), (100, 32)])
    # fp32 stays torch's GEMM
    x = torch.randn(8, 32)
    assert torch.equal(linear_layers.linear(x, w.float()), F.linear(x, w.float()))


def test_the_loaded_build_decides(monkeypatch):
    """Without a stand-in for the build check: with vllm._C's AVX2 build a bf16 CPU call never
    reaches torch's bf16 GEMM, with any other it does (the detection itself, cached once)."""
    linear_layers._cpu_bf16_gemm_is_slow.cache_clear()
    bf16_gemms = spy_bf16_gemms(monkeypatch)
    with torch.no_grad():
        linear_layers.linear(torch.randn(8, 32, dtype=torch.bfloat16),
                             torch.randn(40, 32, dtype=torch.bfloat16))
    assert bf16_gemms == ([] if ops.cpu_isa() == "avx2" else [(8, 32)])
