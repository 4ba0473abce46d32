"""VLLM_CUDA_CARVEOUT (csrc/cuda/launch.cu): every CUDA kernel of the extension asks for one split
of each SM's L1 and shared memory. Only where the kernels run changes, never what they compute:
a decode layer's chain of kernels (norm, GEMV, rotary + cache write, attention, silu) gives
bit-identical results at every setting, eager and replayed from a CUDA graph captured under it,
at 1 row (the FMA GEMV) and 4 (the wave kernel, 78 KB of shared memory); the GEMV alone at 5
and 12 rows (the k-step tensor-core kernel) likewise; a bad setting is named."""
import pytest
import torch

from tests.kernels.test_pdl import assert_same_state, clone_state, decode_step, make_layers
from tests.kernels.test_pdl import make_state
from tests.utils import HAS_CUDA
from vllm import _custom_ops as ops

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("setting", ["max", "0", "50"])
def test_decode_chain_at_a_carveout_equals_default(rows, setting, monkeypatch):
    layers = make_layers(torch.bfloat16)
    state = make_state(rows, torch.bfloat16, seed=rows)
    monkeypatch.setenv("VLLM_CUDA_CARVEOUT", "default")
    ref = clone_state(state)
    for _ in range(2):
        decode_step(layers, ref)
    assert torch.isfinite(ref["hidden"].float()).all()
    monkeypatch.setenv("VLLM_CUDA_CARVEOUT", setting)
    eager = clone_state(state)
    for _ in range(2):
        decode_step(layers, eager)
    torch.cuda.synchronize()
    assert_same_state(eager, ref, f"eager at carveout {setting}")

    graphed = clone_state(state)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_step(layers, graphed)
    monkeypatch.setenv("VLLM_CUDA_CARVEOUT", "default")
    fresh = make_state(rows, torch.bfloat16, seed=100 + rows)
    for key in fresh:
        if key == "caches":
            for (g_k, g_v), (f_k, f_v) in zip(graphed[key], fresh[key]):
                g_k.copy_(f_k)
                g_v.copy_(f_v)
        else:
            graphed[key].copy_(fresh[key])
    graph.replay()
    decode_step(layers, fresh)
    torch.cuda.synchronize()
    assert_same_state(graphed, fresh, f"graph replay at carveout {setting}")


@pytest.mark.parametrize("rows", [5, 12])
def test_tensor_core_gemv_at_max_carveout(rows, monkeypatch):
    """The 3-8-row wave kernel (78 KB of dynamic shared memory) and the k-step kernel above 8
    rows, at the largest shared split and at none: the same bits as the driver's choice."""
    x = torch.randn(rows, 4096, dtype=torch.bfloat16, device="cuda")
    w = (torch.randn(1536, 4096, device="cuda") / 64).bfloat16()
    ref = torch.empty(rows, 1536, dtype=torch.bfloat16, device="cuda")
    monkeypatch.setenv("VLLM_CUDA_CARVEOUT", "default")
    ops.linear_small(ref, x, w)
    for setting in ("max", "0"):
        monkeypatch.setenv("VLLM_CUDA_CARVEOUT", setting)
        out = torch.empty_like(ref)
        ops.linear_small(out, x, w)
        assert torch.equal(out, ref), setting
    torch.testing.assert_close(ref.double(), x.double() @ w.double().t(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bad", ["101", "-1", "most", ""])
def test_carveout_setting_is_checked(bad, monkeypatch):
    monkeypatch.setenv("VLLM_CUDA_CARVEOUT", bad)
    x = torch.randn(1, 64, device="cuda")
    with pytest.raises(RuntimeError, match="VLLM_CUDA_CARVEOUT must be default, max or a"):
        ops.silu_and_mul(torch.empty(1, 32, device="cuda"), x)
