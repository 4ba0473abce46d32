"""Programmatic dependent launch (VLLM_CUDA_PDL=1, csrc/cuda/launch.cuh): every CUDA kernel of the
extension lets its successor launch early and waits for its predecessor before touching data,
and linear_small requests its weight rows into L2 before waiting. A decode layer's chain of
kernels, eager and replayed from a CUDA graph, gives bit-identical results with PDL on and off
(the same kernels do the same arithmetic; only when they start differs), at 1 row (the FMA GEMV)
and 4 rows (the tensor-core one), with each attention merge; weights rewritten by a torch
kernel just before a linear_small are read as rewritten; a bad setting is named."""
import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_attention import make_batch
from tests.utils import HAS_CUDA
from vllm import _custom_ops as ops
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]

HIDDEN, HEADS, KV_HEADS, HEAD, INTER, LAYERS, BLOCK = 512, 8, 2, 64, 1024, 3, 16
EPS = 1e-5


def make_layers(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g, device="cuda") * shape[-1]**-0.5).to(dtype)

    qkv = (HEADS + 2 * KV_HEADS) * HEAD
    return [dict(norm1=1 + w(HIDDEN) / 4, qkv=w(qkv, HIDDEN), o=w(HIDDEN, HEADS * HEAD),
                 norm2=1 + w(HIDDEN) / 4, gate_up=w(2 * INTER, HIDDEN), down=w(HIDDEN, INTER))
            for _ in range(LAYERS)]


def decode_step(layers, state):
    """The engine's decode layer as vllm._C calls (norm, qkv GEMV, rotary + cache write,
    paged attention, o GEMV, add + norm, gate/up GEMV, silu_and_mul, down GEMV), in place on
    state's buffers: hidden, residual and every layer's caches."""
    hidden, residual = state["hidden"], state["residual"]
    rows = hidden.shape[0]
    normed = torch.empty_like(hidden)
    for i, layer in enumerate(layers):
        if i == 0:
            residual.copy_(hidden)
            ops.rms_norm(normed, hidden, layer["norm1"], EPS)
        else:
            ops.fused_add_rms_norm(hidden, residual, layer["norm1"], EPS)
            normed = hidden
        qkv = torch.empty(rows, layer["qkv"].shape[0], dtype=hidden.dtype, device="cuda")
        ops.linear_small(qkv, normed, layer["qkv"])
        q, k, v = qkv.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        kc, vc = state["caches"][i]
        ops.rotary_embedding_and_cache(state["positions"], q, k.view(rows, KV_HEADS, HEAD),
                                       v.view(rows, KV_HEADS, HEAD), HEAD, state["cos_sin"],
                                       True, kc, vc, state["slots"])
        attn = torch.empty(rows, HEADS, HEAD, dtype=hidden.dtype, device="cuda")
        ops.paged_attention(attn, q.view(rows, HEADS, HEAD), kc, vc, state["tables"], state["ctx"],
                            state["qsl"], 512, HEAD**-0.5)  # q read in place, as the layer does
        out = torch.empty_like(hidden)
        ops.linear_small(out, attn.view(rows, -1), layer["o"])
        ops.fused_add_rms_norm(out, residual, layer["norm2"], EPS)
        gate_up = torch.empty(rows, 2 * INTER, dtype=hidden.dtype, device="cuda")
        ops.linear_small(gate_up, out, layer["gate_up"])
        act = torch.empty(rows, INTER, dtype=hidden.dtype, device="cuda")
        ops.silu_and_mul(act, gate_up)
        ops.linear_small(hidden, act, layer["down"])


def make_state(rows, dtype, seed):
    torch.manual_seed(seed)
    contexts = [300, 17, 129, 64][:rows]
    batch = [make_batch(contexts, [1] * rows, HEADS, KV_HEADS, HEAD, BLOCK, dtype, "cuda")
             for _ in range(LAYERS)]
    _, _, _, tables, ctx, qsl = batch[0]
    # the new token of each sequence goes to its context's last slot
    last = (ctx.long() - 1)
    slots = tables.long().gather(1, (last // BLOCK)[:, None])[:, 0] * BLOCK + last % BLOCK
    rope = RotaryEmbedding(HEAD, HEAD, 1024, 10000.0, True, dtype).to("cuda")
    return dict(hidden=torch.randn(rows, HIDDEN, dtype=dtype, device="cuda"),
                residual=torch.empty(rows, HIDDEN, dtype=dtype, device="cuda"),
                caches=[(b[1], b[2]) for b in batch], tables=tables, ctx=ctx, qsl=qsl,
                slots=slots, positions=last, cos_sin=rope.cos_sin_cache)


def clone_state(state):
    return {k: ([(a.clone(), b.clone()) for a, b in v] if k == "caches" else v.clone())
            for k, v in state.items()}


def assert_same_state(a, b, what):
    for key in ("hidden", "residual"):
        assert torch.equal(a[key], b[key]), f"{what}: {key} differs"
    for i, ((ka, va), (kb, vb)) in enumerate(zip(a["caches"], b["caches"])):
        assert torch.equal(ka, kb) and torch.equal(va, vb), f"{what}: layer {i}'s cache differs"


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("combine", ["last-block", "kernel", "cluster"])
def test_decode_chain_with_pdl_equals_without(rows, combine, monkeypatch):
    monkeypatch.setenv("VLLM_CUDA_ATTN_COMBINE", combine)
    layers = make_layers(torch.bfloat16)
    state = make_state(rows, torch.bfloat16, seed=rows)
    monkeypatch.setenv("VLLM_CUDA_PDL", "0")
    ref = clone_state(state)
    for _ in range(2):
        decode_step(layers, ref)
    assert torch.isfinite(ref["hidden"].float()).all()
    monkeypatch.setenv("VLLM_CUDA_PDL", "1")
    eager = clone_state(state)
    for _ in range(2):
        decode_step(layers, eager)
    torch.cuda.synchronize()
    assert_same_state(eager, ref, "eager with PDL")

    # captured with PDL, replayed on new inputs: each replay equals the same step without PDL
    graphed = clone_state(state)
    decode_step(layers, clone_state(state))  # warm-up (arrival counters, allocator)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_step(layers, graphed)
    monkeypatch.setenv("VLLM_CUDA_PDL", "0")
    for step in range(3):
        fresh = make_state(rows, torch.bfloat16, seed=100 + step)
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
        assert_same_state(graphed, fresh, f"graph replay {step} with PDL")


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_weights_rewritten_just_before_a_pdl_linear(rows, monkeypatch):
    """linear_small requests its weight rows into L2 before it waits: rows a torch kernel is
    still writing must be read as written (an L2 request never returns stale data)."""
    monkeypatch.setenv("VLLM_CUDA_PDL", "1")
    x = torch.randn(rows, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(1024, 4096, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(rows, 1024, dtype=torch.bfloat16, device="cuda")
    for i in range(4):
        src = (torch.randn(1024, 4096, device="cuda") / 64).bfloat16()
        w.copy_(src)  # the kernel right before the GEMV writes its weights
        ops.linear_small(out, x, w)
        ref = F.linear(x.double(), src.double())
        torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2, msg=f"round {i}")


def test_pdl_setting_is_checked(monkeypatch):
    monkeypatch.setenv("VLLM_CUDA_PDL", "yes")
    x = torch.randn(1, 64, device="cuda")
    with pytest.raises(RuntimeError, match="VLLM_CUDA_PDL must be 0 or 1"):
        ops.silu_and_mul(torch.empty(1, 32, device="cuda"), x)
