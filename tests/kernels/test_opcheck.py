"""torch.library.opcheck on every schema of vllm._C (schema, fake tensors, aot dispatch)."""
import pytest
import torch

from tests.utils import DEVICES
from tests.kernels.test_attention import make_batch
from vllm import _custom_ops  # noqa: F401  (loads vllm._C)


def op_cases(device: str):
    dtype = torch.float32
    x = torch.randn(5, 64, device=device)
    w = torch.randn(64, device=device)
    qkv = torch.randn(5, 3, 2, 64, device=device)
    cos_sin = torch.randn(32, 64, device=device)
    positions = torch.randint(0, 32, (5,), device=device)
    kc = torch.randn(8, 2, 16, 64, device=device)
    vc = torch.randn(8, 2, 16, 64, device=device)
    slots = torch.tensor([3, 17, -1, 40, 99], device=device)
    batch = make_batch([20, 5], [2, 1], 4, 2, 64, 16, dtype, device)
    return {
        "rms_norm": (torch.empty_like(x), x, w, 1e-6),
        "fused_add_rms_norm": (x.clone(), x.clone(), w, 1e-6),
        "silu_and_mul": (torch.empty(5, 32, device=device), x),
        "rotary_embedding": (positions, qkv[:, 0].reshape(5, -1).clone(),
                             qkv[:, 1].reshape(5, -1).clone(), 64, cos_sin, True),
        "reshape_and_cache": (qkv[:, 0], qkv[:, 1], kc, vc, slots),
        "rotary_embedding_and_cache": (positions, qkv[:, 0].reshape(5, -1).clone(),
                                       qkv[:, 1].clone(), qkv[:, 2], 64, cos_sin, True,
                                       kc.clone(), vc.clone(), slots),
        "copy_blocks": ([kc.clone()], [vc.clone()],
                        torch.tensor([[0, 3], [5, 1]], device=device)),
        "paged_attention": (torch.empty_like(batch[0]), *batch, 20, 0.125),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(op_cases("cpu")))
def test_opcheck(device, op_name):
    torch.library.opcheck(getattr(torch.ops._C, op_name).default, op_cases(device)[op_name])
