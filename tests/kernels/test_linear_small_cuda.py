"""linear_small's CUDA kernel (csrc/cuda/linear.cu) against an fp64 F.linear: fp32, fp16 and bf16,
1 to 8 rows (and more, one launch per 8), K a multiple of the 16-byte chunk or not, strided and
misaligned operands, with and without bias; its argument errors and torch.library.opcheck; a
CUDA graph capture of it; and the layers' routing behind VLLM_CUDA_GEMV, down to a tiny model's
greedy tokens with the switch on and off. The routing's CPU fallback is checked without a GPU."""
import dataclasses
import gc

import pytest
import torch
import torch.nn.functional as F

from tests.utils import HAS_CUDA, assert_close
from vllm import _custom_ops as ops
from vllm.model_executor.layers import linear as linear_layers
from vllm.model_executor.layers.linear import (ColumnParallelLinear, RowParallelLinear,
                                               cuda_gemv_applies)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]


def on_cuda(test):
    """Marks a test `cuda` and skips it without a GPU."""
    for mark in cuda:
        test = mark(test)
    return test


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def reference(x, w, b=None):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def run_op(x, w, b=None):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    ops.linear_small(out, x, w, b)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 19])
# k: whole 16-byte chunks for every dtype (256, 576, 4096, 11008, 1280; 328 and 8: a last k-step
# of the k-step tensor-core kernel that is 1 chunk of 4), chunks of fp32 only (100, 4100),
# neither (17, 1); multiples of 256 (the wave kernel at 3-8 rows of bf16/fp16: 1, 5, 16 and 43
# segments over its 8 warps) or not (576, 328, 8: the k-step kernel); n: blocks of 4 or 16 rows
# split unevenly (13, 257, 1, 7, 50, 20, 37), 7B's o_proj
@pytest.mark.parametrize("n,k", [(768, 256), (13, 100), (1, 17), (257, 576), (7, 1),
                                 (4096, 4096), (96, 11008), (33, 4100), (50, 328), (20, 8),
                                 (37, 1280)])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@on_cuda
def test_linear_small_cuda(dtype, m, n, k, bias):
    torch.manual_seed(m * n + k)
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    out = run_op(x, w, b)
    assert_close("linear_small", out, reference(x, w, b), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("offset,width", [(20, 160), (64, 4160)],
                         ids=["misaligned", "aligned"])
@on_cuda
def test_linear_small_cuda_strided_rows(dtype, m, offset, width):
    """Input and out rows inside wider buffers: row strides != K, the input 16-byte aligned
    (the vector path) or not (the one-element path); out's neighbours stay untouched."""
    k = width - offset - (40 if offset == 20 else 0)
    x = torch.randn(m, width, device="cuda").to(dtype)[:, offset:offset + k]
    w = (torch.randn(70, k, device="cuda") / k**0.5).to(dtype)
    out_buf = torch.full((m, 90), float("nan"), dtype=dtype, device="cuda")
    out = out_buf[:, 10:80]
    ops.linear_small(out, x, w, None)
    assert_close("linear_small strided", out, reference(x, w), dtype)
    assert out_buf[:, :10].isnan().all() and out_buf[:, 80:].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@on_cuda
def test_linear_small_cuda_misaligned_weight(dtype):
    """A weight starting 1 element past a 16-byte boundary takes the one-element path."""
    n, k = 40, 512
    w = (torch.randn(n * k + 1, device="cuda") / k**0.5).to(dtype)[1:].view(n, k)
    x = torch.randn(3, k, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    assert_close("linear_small misaligned", run_op(x, w, b), reference(x, w, b), dtype)


@on_cuda
def test_linear_small_cuda_matches_torch_fp32():
    """fp32 against torch's own fp32 GEMM (TF32 off), tightly."""
    torch.manual_seed(0)
    x, w = torch.randn(5, 4096, device="cuda"), torch.randn(1000, 4096, device="cuda") / 64
    b = torch.randn(1000, device="cuda")
    torch.testing.assert_close(run_op(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call,message", [
    (lambda d: ops.linear_small(torch.empty(2, 4, device=d), torch.randn(2, 8, device=d),
                                torch.randn(4, 7, device=d)), "features"),
    (lambda d: ops.linear_small(torch.empty(2, 5, device=d), torch.randn(2, 8, device=d),
                                torch.randn(4, 8, device=d)), "out has shape"),
    (lambda d: ops.linear_small(torch.empty(2, 4, device=d, dtype=torch.bfloat16),
                                torch.randn(2, 8, device=d), torch.randn(4, 8, device=d)),
     "one dtype"),
    (lambda d: ops.linear_small(torch.empty(2, 4, device=d), torch.randn(2, 8, device=d),
                                torch.randn(4, 8, device=d), torch.randn(5, device=d)),
     "bias must be"),
    (lambda d: ops.linear_small(torch.empty(2, 4, device=d), torch.randn(2, 8, device=d),
                                torch.randn(8, 4, device=d).t()), "contiguous weight"),
    (lambda d: ops.linear_small(torch.empty(2, 4, device=d), torch.randn(2, 8, device=d),
                                torch.randn(4, 8)), "weight is on cpu"),
])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_linear_small_bad_args_are_named(device, call, message):
    if device == "cpu" and message == "weight is on cpu":
        pytest.skip("needs a second device")
    with pytest.raises(RuntimeError, match=message):
        call(device)


@pytest.mark.parametrize("dtype", DTYPES)
@on_cuda
def test_opcheck_cuda(dtype):
    x = torch.randn(3, 64, device="cuda").to(dtype)
    w = torch.randn(40, 64, device="cuda").to(dtype)
    b = torch.randn(40, device="cuda").to(dtype)
    torch.library.opcheck(torch.ops._C.linear_small.default,
                          (torch.empty(3, 40, device="cuda", dtype=dtype), x, w, b))
    torch.library.opcheck(torch.ops._C.linear_small.default,
                          (torch.empty(3, 40, device="cuda", dtype=dtype), x, w, None))


@on_cuda
def test_registered_on_cuda():
    assert ops.has_kernel("linear_small", "cuda") and ops.has_kernel("linear_small", "cpu")
    assert "linear_small" not in ops.CPU_OP_NAMES


@pytest.mark.parametrize("rows,k", [(4, 128), (5, 512)], ids=["k-step", "wave"])
@on_cuda
def test_captured_in_a_cuda_graph(rows, k, monkeypatch):
    """The layers' GEMV under capture (both tensor-core kernels: K of 128, K a multiple of 256):
    its out comes from the graph's pool, and a replay with new input values gives the new
    products."""
    monkeypatch.setenv("VLLM_CUDA_GEMV", "on")
    w = (torch.randn(300, k, device="cuda") / k**0.5).bfloat16()
    b = torch.randn(300, device="cuda").bfloat16()
    x = torch.randn(rows, k, device="cuda").bfloat16()
    with torch.inference_mode():
        linear_layers.linear(x, w, b)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = linear_layers.linear(x, w, b)
        x.copy_(torch.randn(rows, k, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
    assert_close("linear_small graph", out, reference(x, w, b), torch.bfloat16)


def spy(monkeypatch):
    """Records the rows of each linear_small call on CUDA tensors (still running it)."""
    calls = []
    real = ops.linear_small

    def counted(*args):
        if args[1].is_cuda:
            calls.append(args[1].shape[0])
        real(*args)

    monkeypatch.setattr(ops, "linear_small", counted)
    return calls


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("switch", ["on", "off", "2"])
def test_layers_route_few_cuda_rows(device, switch, monkeypatch):
    """With VLLM_CUDA_GEMV on (or 2), a CUDA step of at most 8 (2) rows runs linear_small in
    every linear layer and the LM head (logits fp32, computed in the weights' dtype), and more
    rows, CPU tensors or the switch off run F.linear; the results agree either way."""
    monkeypatch.setenv("VLLM_CUDA_GEMV", switch)
    calls = spy(monkeypatch)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    col = ColumnParallelLinear(64, [48, 48], bias=True).to(device, dtype)
    row = RowParallelLinear(96, 64, bias=True).to(device, dtype)
    head = ParallelLMHead(100, 64).to(device, dtype)
    for rows in (1, 2, 3, 8, 9):
        x = torch.randn(rows, 64, device=device).to(dtype)
        calls.clear()
        with torch.inference_mode():
            h = col(x)
            y = row(h)
            logits = head.compute_logits(y)
            refs = (reference(x, col.weight, col.bias), reference(h, row.weight, row.bias),
                    F.linear(y, head.weight).float())
        taken = device == "cuda" and rows <= {"on": 8, "off": 0, "2": 2}[switch]
        assert calls == ([rows] * 3 if taken else []), (rows, calls)
        assert logits.dtype == torch.float32 and logits.shape == (rows, 100)
        assert_close("layers h", h, refs[0], dtype)
        assert_close("layers y", y, refs[1], dtype)
        assert_close("layers logits", logits, refs[2], dtype)


def test_switch_parses(monkeypatch):
    from vllm import envs

    monkeypatch.delenv("VLLM_CUDA_GEMV", raising=False)
    assert envs.VLLM_CUDA_GEMV == 8  # every step of at most 8 rows by default
    for raw, rows in (("on", 8), ("true", 8), ("off", 0), ("0", 0), ("1", 1), ("4", 4)):
        monkeypatch.setenv("VLLM_CUDA_GEMV", raw)
        assert envs.VLLM_CUDA_GEMV == rows
    for raw in ("maybe", "9"):
        monkeypatch.setenv("VLLM_CUDA_GEMV", raw)
        with pytest.raises(ValueError, match="VLLM_CUDA_GEMV"):
            envs.VLLM_CUDA_GEMV


def test_gemv_never_applies_to_cpu_or_autograd(monkeypatch):
    monkeypatch.setenv("VLLM_CUDA_GEMV", "on")
    w = torch.nn.Parameter(torch.randn(4, 8))
    assert not cuda_gemv_applies(torch.randn(2, 8), w)
    if HAS_CUDA:
        wc = torch.nn.Parameter(torch.randn(4, 8, device="cuda"))
        x = torch.randn(2, 8, device="cuda")
        assert not cuda_gemv_applies(x, wc)  # grad mode and a weight that wants grads
        with torch.no_grad():
            assert cuda_gemv_applies(x, wc)
            assert not cuda_gemv_applies(x.half(), wc)
            assert not cuda_gemv_applies(torch.randn(2, 3, 8, device="cuda"), wc)


def engine_tokens(model_dir, dtype, enforce_eager, switch, monkeypatch):
    from tests.engine.test_correctness import PROMPTS, greedy, token_ids
    from vllm import LLM

    monkeypatch.setenv("VLLM_CUDA_GEMV", switch)
    calls = spy(monkeypatch)
    llm = LLM(model_dir, dtype=dtype, device="cuda", enforce_eager=enforce_eager,
              gpu_memory_utilization=0.3, max_num_seqs=8)
    tokens = token_ids(llm.generate(PROMPTS, greedy(), use_tqdm=False))
    tok = llm.get_tokenizer()
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    monkeypatch.undo()
    # decode steps (and the logits of steps of <= 8 sequences) took the GEMV exactly when on
    assert bool(calls) == (switch == "on")
    return tokens, prompt_ids


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "graphs"])
@on_cuda
def test_engine_greedy_with_gemv_equals_transformers(arch, enforce_eager, tiny_llama, tiny_qwen2,
                                                     monkeypatch):
    from tests.tiny_models import hf_greedy

    model_dir = tiny_llama if arch == "llama" else tiny_qwen2
    tokens, prompt_ids = engine_tokens(model_dir, "float32", enforce_eager, "on", monkeypatch)
    for ids, out in zip(prompt_ids, tokens):
        assert out == hf_greedy(model_dir, ids, len(out))


@on_cuda
def test_engine_greedy_same_with_gemv_on_and_off(tiny_llama, monkeypatch):
    """fp32 (in bf16 the GEMV's other summation order may flip a near tie after some tokens)."""
    on, _ids = engine_tokens(tiny_llama, "float32", False, "on", monkeypatch)
    off, _ids = engine_tokens(tiny_llama, "float32", False, "off", monkeypatch)
    assert on == off


@pytest.mark.parametrize("rows", [1, 3, 8])
@on_cuda
def test_model_logits_close_with_gemv_on_and_off_in_bf16(rows, monkeypatch):
    """A bf16 Llama's decode-step logits with the GEMV in every linear layer and the LM head
    agree with torch's GEMM's to bf16 accuracy."""
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
    for switch in ("on", "off"):
        monkeypatch.setenv("VLLM_CUDA_GEMV", switch)
        calls = spy(monkeypatch)
        with torch.inference_mode(), set_forward_context(md, [(k.clone(), v.clone())
                                                              for k, v in caches]):
            logits[switch] = model.compute_logits(model(ids, positions.cuda()))
        assert bool(calls) == (switch == "on")
    assert_close("model logits gemv", logits["on"], logits["off"].double(), torch.bfloat16)
