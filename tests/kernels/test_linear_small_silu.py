"""linear_small_silu (the MLP's gate/up projection with its activation applied to the GEMV's own
sums) against linear_small then silu_and_mul, and against an fp64 reference; the layers' routing
through it (VLLM_FUSED_GATE_UP_SILU)."""
import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_linear_small_cuda import bf16_decode_step_logits, cuda, on_cuda
from tests.utils import DTYPES, assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.linear import MergedColumnParallelLinear

DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def two_ops(x, w, b):
    gate_up = torch.empty(x.shape[0], w.shape[0], dtype=w.dtype, device=w.device)
    ops.linear_small(gate_up, x, w, b)
    out = torch.empty(x.shape[0], w.shape[0] // 2, dtype=w.dtype, device=w.device)
    ops.silu_and_mul(out, gate_up)
    return out, gate_up


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 3, 5])
# (2 I, K): whole 16-byte chunks for every dtype (7B's gate/up: 2 x 11008 by 4096, cut to 64
# columns of each half), an odd number of output columns (I = 13), fp32's chunks only (K = 100)
@pytest.mark.parametrize("n,k", [(128, 4096), (26, 256), (40, 100)])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_linear_small_silu(device, m, n, k, bias):
    torch.manual_seed(m * 7 + n)
    for dtype in DTYPES[device]:
        x = torch.randn(m, k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
        b = torch.randn(n, device=device).to(dtype) if bias else None
        out = torch.full((m, n // 2), float("nan"), dtype=dtype, device=device)
        ops.linear_small_silu(out, x, w, b)
        want, gate_up = two_ops(x, w, b)
        # the GEMV's sums may be added in another order (a row's place in its block differs):
        # gate and up within the GEMV's own tolerance, so the product within bf16's
        assert_close("linear_small_silu vs the two ops", out, want.double(), dtype)
        ref_gate_up = F.linear(x.double(), w.double(), None if b is None else b.double())
        ref = SiluAndMul().forward_native(ref_gate_up.to(dtype))  # rounded like the kernels
        assert_close("linear_small_silu", out, ref.double(), dtype)
        if device == "cpu":  # the CPU runs the two ops themselves
            assert torch.equal(out, want)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_small_silu_strided_rows(device):
    """Input rows that are views into a wider activation (row stride above K)."""
    wide = torch.randn(2, 256 + 64, device=device)
    x = wide[:, :256]
    w = torch.randn(40, 256, device=device) / 16
    out = torch.empty(2, 20, device=device)
    ops.linear_small_silu(out, x, w, None)
    assert_close("linear_small_silu strided", out, two_ops(x, w, None)[0].double(),
                 torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_small_silu_names_bad_shapes(device):
    with pytest.raises(RuntimeError, match="even number of rows"):
        ops.linear_small_silu(torch.empty(2, 3, device=device), torch.randn(2, 8, device=device),
                              torch.randn(7, 8, device=device), None)
    with pytest.raises(RuntimeError, match=r"out has shape \[2, 8\], expected \[2, 4\]"):
        ops.linear_small_silu(torch.empty(2, 8, device=device), torch.randn(2, 8, device=device),
                              torch.randn(8, 8, device=device), None)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.library.opcheck(torch.ops._C.linear_small_silu.default,
                          (torch.empty(2, 20, device=device), torch.randn(2, 64, device=device),
                           torch.randn(40, 64, device=device), torch.randn(40, device=device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", ["1", "0"])
def test_gate_up_layer_takes_the_fused_call(device, fused, monkeypatch):
    """forward_silu runs linear_small_silu exactly for CUDA steps of at most VLLM_CUDA_GEMV rows
    with the switch on, and returns None otherwise (the MLP then runs the two ops); the result
    agrees with the layer's output through silu_and_mul."""
    monkeypatch.setenv("VLLM_CUDA_GEMV", "2")
    monkeypatch.setenv("VLLM_FUSED_GATE_UP_SILU", fused)
    calls = []
    real = ops.linear_small_silu
    monkeypatch.setattr(ops, "linear_small_silu", lambda *a: calls.append(1) or real(*a))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layer = MergedColumnParallelLinear(64, [48, 48], bias=True).to(device, dtype)
    for rows in (1, 2, 3):
        x = torch.randn(rows, 64, device=device).to(dtype)
        calls.clear()
        with torch.inference_mode():
            got = layer.forward_silu(x)
            want = SiluAndMul()(layer(x))
        taken = device == "cuda" and fused == "1" and rows <= 2
        assert (got is not None) == taken and len(calls) == int(taken)
        if taken:
            assert_close("gate/up layer silu", got, want.double(), dtype)


@pytest.mark.parametrize("rows", [1, 2])
@on_cuda
def test_model_logits_close_with_the_fused_call_on_and_off(rows, monkeypatch):
    """A bf16 Llama's decode-step logits with the activation inside the gate/up GEMV agree with
    those through silu_and_mul to bf16 accuracy."""
    run = bf16_decode_step_logits(rows)
    logits = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("VLLM_FUSED_GATE_UP_SILU", switch)
        logits[switch] = run()
    assert_close("model logits gate/up silu", logits["1"], logits["0"].double(), torch.bfloat16)


@on_cuda
def test_engine_greedy_with_the_fused_call_equals_transformers(tiny_llama, monkeypatch):
    """fp32, CUDA graphs: with the activation inside the GEMV the engine's greedy tokens are
    transformers' (the engine_tokens helper asserts the GEMV ran)."""
    from tests.kernels.test_linear_small_cuda import engine_tokens
    from tests.tiny_models import hf_greedy

    monkeypatch.setenv("VLLM_FUSED_GATE_UP_SILU", "1")
    tokens, prompt_ids = engine_tokens(tiny_llama, "float32", False, "on", monkeypatch)
    for ids, out in zip(prompt_ids, tokens):
        assert out == hf_greedy(tiny_llama, ids, len(out))
