"""rms_norm and fused_add_rms_norm kernels against RMSNorm.forward_native."""
import pytest
import torch

from tests.utils import DEVICES, DTYPES, assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.layers.layernorm import RMSNorm

SHAPES = [(1, 64), (7, 896), (33, 1536), (5, 4096), (3, 100)]


def make_norm(hidden: int, dtype: torch.dtype, device: str) -> RMSNorm:
    norm = RMSNorm(hidden, eps=1e-6).to(dtype=dtype, device=device)
    norm.weight.data.normal_(1.0, 0.1)
    return norm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm(device, shape):
    for dtype in DTYPES[device]:
        norm = make_norm(shape[1], dtype, device)
        x = torch.randn(shape, dtype=dtype, device=device) * 3
        out = torch.full_like(x, float("nan"))
        ops.rms_norm(out, x, norm.weight, norm.variance_epsilon)
        assert_close("rms_norm", out, norm.forward_native(x), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_strided_input(device):
    """A row-strided view, as sliced out of a wider activation."""
    for dtype in DTYPES[device]:
        norm = make_norm(256, dtype, device)
        wide = torch.randn(9, 384, dtype=dtype, device=device)
        x = wide[:, :256]
        out = torch.empty(9, 256, dtype=dtype, device=device)
        ops.rms_norm(out, x, norm.weight, norm.variance_epsilon)
        assert_close("rms_norm", out, norm.forward_native(x.contiguous()), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_add_rms_norm(device, shape):
    for dtype in DTYPES[device]:
        norm = make_norm(shape[1], dtype, device)
        x = torch.randn(shape, dtype=dtype, device=device)
        residual = torch.randn(shape, dtype=dtype, device=device)
        ref_out, ref_residual = norm.forward_native(x.clone(), residual.clone())
        ops.fused_add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)
        assert_close("fused_add_rms_norm", x, ref_out, dtype)
        assert_close("fused_add_rms_norm", residual, ref_residual, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_layer_uses_kernel(device, monkeypatch):
    norm = make_norm(64, torch.float32, device)
    x = torch.randn(4, 64, device=device)
    ref = norm.forward_native(x)

    def fail(*args, **kwargs):
        raise AssertionError("forward_native ran instead of the kernel")

    monkeypatch.setattr(norm, "forward_native", fail)
    assert_close("rms_norm", norm(x), ref, torch.float32)


@pytest.mark.parametrize("hidden", [64, 512])
def test_bf16_roundings_are_torchs_bits(hidden):
    """The CPU kernels' own fp32-to-bf16 rounding (vec.h) gives torch's bits: the sum x +
    residual (fused_add_rms_norm's residual out, ties to even among its rows), and the norm's
    two roundings, on inputs whose mean square is exact in any summation order (small integers,
    a power-of-two width), so that only the roundings can differ; inf and NaN pass through."""
    g = torch.Generator().manual_seed(hidden)
    x = torch.randint(-8, 9, (9, hidden), generator=g).to(torch.bfloat16)
    residual = (torch.randn(9, hidden, generator=g) * 3).to(torch.bfloat16)
    residual[0, :8] = torch.tensor([2 ** -8, 3 * 2 ** -8, 2 ** -9, 0.5, 1, 255, 257, 1e-3])
    x[1, 3], residual[2, 5] = float("inf"), float("nan")
    norm = make_norm(hidden, torch.bfloat16, "cpu")
    norm.variance_epsilon = 0.0
    ref_out, ref_sum = norm.forward_native(x.clone(), residual.clone())
    out, summed = x.clone(), residual.clone()
    ops.fused_add_rms_norm(out, summed, norm.weight, 0.0)
    torch.testing.assert_close(summed, ref_sum, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(out[3:], ref_out[3:], rtol=0, atol=0)  # rows 1, 2: inf, NaN

    normed = torch.empty_like(x)
    ops.rms_norm(normed[3:], x[3:], norm.weight, 0.0)
    torch.testing.assert_close(normed[3:], norm.forward_native(x[3:]), rtol=0, atol=0)
