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
