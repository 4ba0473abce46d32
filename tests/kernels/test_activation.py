"""silu_and_mul against SiluAndMul.forward_native."""
import pytest
import torch

from tests.utils import DEVICES, DTYPES, assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.layers.activation import SiluAndMul


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 128), (7, 2 * 4864), (16, 2 * 11008), (3, 2 * 50)])
def test_silu_and_mul(device, shape):
    layer = SiluAndMul()
    for dtype in DTYPES[device]:
        x = torch.randn(shape, dtype=dtype, device=device) * 4
        out = torch.full((shape[0], shape[1] // 2), float("nan"), dtype=dtype, device=device)
        ops.silu_and_mul(out, x)
        assert_close("silu_and_mul", out, layer.forward_native(x), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_silu_and_mul_3d(device):
    x = torch.randn(2, 5, 64, device=device)
    ref = SiluAndMul().forward_native(x)
    assert_close("silu_and_mul", SiluAndMul()(x), ref, torch.float32)
