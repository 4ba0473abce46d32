"""Test helpers: the devices to run on, their dtypes, tolerances, and error recording."""
import collections

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# Every kernel test runs on the CPU; the CUDA half carries the `cuda` marker and is skipped
# where there is no GPU.
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda",
                 marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]),
]

# dtypes each device's kernels support
DTYPES = {
    "cpu": (torch.float32, torch.bfloat16),
    "cuda": (torch.float32, torch.float16, torch.bfloat16),
}

# allowed relative error ||out - ref|| / ||ref|| against the fp32 reference, per dtype
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# (op, device, dtype) -> the largest relative error seen; conftest prints it at the end
ERRORS: dict = collections.defaultdict(float)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), "output has NaN or inf"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_close(op: str, out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
                 tol_scale: float = 1.0) -> None:
    """Checks the relative error against the dtype's tolerance and records it for the report."""
    err = relative_error(out, ref)
    key = (op, str(out.device.type), str(dtype).replace("torch.", ""))
    ERRORS[key] = max(ERRORS[key], err)
    assert err <= REL_TOL[dtype] * tol_scale, f"{op}: relative error {err:.2e} on {key}"


def cpu_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists this CPU flag (False where there is no /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            return flag in f.read().split()
    except OSError:
        return False


def has_avx512_bf16() -> bool:
    """Whether this CPU has AVX512_BF16 (the CPU kernels' bf16 dot products, packed weights)."""
    return cpu_has("avx512_bf16")


def check_strided_bf16_linear(op: str, linear, m: int, n: int, k: int) -> None:
    """linear(out, x, w, b) against F.linear in fp32 on bf16 rows inside wider buffers (as
    decode_layers passes them) with a bias; nothing written outside out's columns."""
    torch.manual_seed(m * n + k)
    x = torch.randn(m, k + 32, dtype=torch.bfloat16)[:, 16:16 + k]
    w = torch.randn(n, k, dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, dtype=torch.bfloat16)
    out_buf = torch.full((m, n + 8), float("nan"), dtype=torch.bfloat16)
    out = out_buf[:, 4:4 + n]
    linear(out, x, w, b)
    ref = torch.nn.functional.linear(x.float(), w.float(), b.float())
    assert_close(op, out.float(), ref, torch.bfloat16)
    assert out_buf[:, :4].isnan().all() and out_buf[:, 4 + n:].isnan().all()
