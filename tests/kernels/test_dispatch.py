"""Tensor-device dispatch, shown in one process: each op is called with CPU tensors and with the
same values on CUDA; the profiler sees a CUDA kernel run only for the CUDA call, and the two
results agree (each is also checked against the native reference by the per-op tests)."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.kernels.test_opcheck import op_cases
from tests.utils import HAS_CUDA, relative_error
from vllm import _custom_ops as ops

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]


def to_device(arg, device):
    if isinstance(arg, torch.Tensor):
        return arg.to(device)
    if isinstance(arg, list):
        return [to_device(a, device) for a in arg]
    return arg


def tensors_of(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list):
            yield from a


def cuda_kernels_run(fn) -> list[str]:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
            and e.key not in ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)")
            and not e.key.startswith("Memcpy") and not e.key.startswith("Memset")]


@pytest.mark.parametrize("op_name", ops.OP_NAMES)
def test_same_op_runs_on_both_devices(op_name):
    cpu_args = list(op_cases("cpu")[op_name])
    cuda_args = to_device(cpu_args, "cuda")
    op = getattr(torch.ops._C, op_name)
    assert ops.has_kernel(op_name, "cpu") and ops.has_kernel(op_name, "cuda")
    assert cuda_kernels_run(lambda: op(*cpu_args)) == []
    kernels = cuda_kernels_run(lambda: op(*cuda_args))
    assert kernels, f"no CUDA kernel ran for {op_name} on CUDA tensors"
    print(f"\n{op_name}: CUDA kernels {kernels}")
    for cpu_t, cuda_t in zip(tensors_of(cpu_args), tensors_of(cuda_args)):
        assert relative_error(cuda_t.cpu(), cpu_t) < 1e-4
