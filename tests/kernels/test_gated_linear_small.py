"""gated_linear_small (the MLP's down projection with its activation applied as the GEMV loads
its input) against silu_and_mul then linear_small, bit for bit, and against an fp64 reference;
the layers' routing through it (VLLM_FUSED_SILU_DOWN)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_linear_small_cuda import cuda, on_cuda
from tests.utils import DTYPES, assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.linear import RowParallelLinear

DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def two_ops(gate_up, w, b):
    act = torch.empty(gate_up.shape[0], w.shape[1], dtype=gate_up.dtype, device=gate_up.device)
    ops.silu_and_mul(act, gate_up.contiguous())
    out = torch.empty(gate_up.shape[0], w.shape[0], dtype=w.dtype, device=w.device)
    ops.linear_small(out, act, w, b)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 3, 5])
# k: whole 16-byte chunks for every dtype (256, 11008: 7B's down projection), fp32's only (100)
@pytest.mark.parametrize("n,k", [(96, 256), (13, 100), (64, 11008)])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_gated_linear_small(device, m, n, k, bias):
    torch.manual_seed(m * 7 + n)
    for dtype in DTYPES[device]:
        gate_up = torch.randn(m, 2 * k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
        b = torch.randn(n, device=device).to(dtype) if bias else None
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        ops.gated_linear_small(out, gate_up, w, b)
        # the same rounding as the two ops (the activation rounded to dtype, fp32 sums)
        assert torch.equal(out, two_ops(gate_up, w, b))
        act = SiluAndMul().forward_native(gate_up)  # rounded to dtype like the kernels'
        ref = F.linear(act.double(), w.double(), None if b is None else b.double())
        assert_close("gated_linear_small", out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_gated_linear_small_strided_rows(device):
    """gate_up rows that are views into a wider activation (row stride above 2 K)."""
    wide = torch.randn(2, 2 * 256 + 64, device=device)
    gate_up = wide[:, :512]
    w = torch.randn(40, 256, device=device)
    out = torch.empty(2, 40, device=device)
    ops.gated_linear_small(out, gate_up, w, None)
    assert torch.equal(out, two_ops(gate_up, w, None))


@pytest.mark.parametrize("device", DEVICES)
def test_gated_linear_small_names_a_mismatched_width(device):
    with pytest.raises(RuntimeError, match=r"gate_up must be \[M, 2 x 8\]"):
        ops.gated_linear_small(torch.empty(2, 4, device=device), torch.randn(2, 12, device=device),
                               torch.randn(4, 8, device=device), None)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.library.opcheck(torch.ops._C.gated_linear_small.default,
                          (torch.empty(2, 40, device=device), torch.randn(2, 128, device=device),
                           torch.randn(40, 64, device=device), torch.randn(40, device=device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", ["1", "0"])
def test_row_parallel_layer_takes_the_gated_call(device, fused, monkeypatch):
    """forward_gated runs gated_linear_small exactly for CUDA steps of at most VLLM_CUDA_GEMV
    rows with the switch on, and returns None otherwise (the MLP then runs the two ops); the
    result equals the layer over silu_and_mul's output."""
    monkeypatch.setenv("VLLM_CUDA_GEMV", "2")
    monkeypatch.setenv("VLLM_FUSED_SILU_DOWN", fused)
    calls = []
    real = ops.gated_linear_small
    monkeypatch.setattr(ops, "gated_linear_small", lambda *a: calls.append(1) or real(*a))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layer = RowParallelLinear(96, 64, bias=True).to(device, dtype)
    for rows in (1, 2, 3):
        gate_up = torch.randn(rows, 192, device=device).to(dtype)
        calls.clear()
        with torch.inference_mode():
            got = layer.forward_gated(gate_up)
            want = layer(SiluAndMul()(gate_up))
        taken = device == "cuda" and fused == "1" and rows <= 2
        assert (got is not None) == taken and len(calls) == int(taken)
        if taken:
            assert torch.equal(got, want)


@pytest.mark.parametrize("rows", [1, 2])
@on_cuda
def test_model_step_same_with_the_gated_call_on_and_off(rows, monkeypatch):
    """A bf16 Llama's decode-step logits are identical with the activation inside the down
    projection's GEMV and with silu_and_mul before it."""
    from tests.kernels.test_cpu_decode import make_model, make_step
    from vllm.forward_context import set_forward_context

    model, config = make_model("llama-gqa", torch.bfloat16)
    model = model.cuda()
    caches, md, positions = make_step(config, torch.bfloat16, [5 + 7 * i for i in range(rows)],
                                      [1] * rows)
    caches = [(k.cuda(), v.cuda()) for k, v in caches]
    md = dataclasses.replace(md, **{f: getattr(md, f).cuda() for f in (
        "slot_mapping", "block_tables", "context_lens", "query_start_loc")})
    ids = torch.randint(0, config.vocab_size, (rows,), device="cuda")
    logits = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("VLLM_FUSED_SILU_DOWN", switch)
        with torch.inference_mode(), set_forward_context(md, [(k.clone(), v.clone())
                                                              for k, v in caches]):
            logits[switch] = model.compute_logits(model(ids, positions.cuda()))
    assert torch.equal(logits["1"], logits["0"])
