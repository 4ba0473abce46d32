"""The compiled extension is what runs: it is loaded, every op has a CPU kernel, layers take the
kernel path, and bad input gets an error that names the problem."""
import re
from pathlib import Path

import pytest
import torch

from vllm import _custom_ops as ops
from vllm.model_executor.layers.activation import SiluAndMul


def test_extension_is_a_compiled_library():
    import vllm._C

    assert ops._C is vllm._C
    assert Path(vllm._C.__file__).suffix == ".so"
    assert vllm._C.cpu_isa in ("avx512", "avx2", "scalar")


def test_cpu_kernels_use_the_best_isa_of_this_machine():
    import vllm._C

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq")):
        assert vllm._C.cpu_isa == "avx512"
    elif "avx2" in flags:
        assert vllm._C.cpu_isa == "avx2"


@pytest.mark.parametrize("op_name", ops.OP_NAMES)
def test_every_op_has_a_cpu_kernel(op_name):
    assert ops.has_kernel(op_name, "cpu")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{op_name}", "CPU")


def test_cuda_kernels_registered_exactly_in_cuda_builds():
    import vllm._C

    for op_name in ops.OP_NAMES:
        assert ops.has_kernel(op_name, "cuda") == bool(vllm._C.cuda_enabled)


def test_layer_takes_kernel_path(monkeypatch):
    layer = SiluAndMul()
    x = torch.randn(3, 8)
    ref = layer.forward_native(x)
    monkeypatch.setattr(layer, "forward_native", lambda *a: pytest.fail("native path ran"))
    torch.testing.assert_close(layer(x), ref)


def test_op_without_kernel_for_device_names_supported_devices():
    x = torch.empty(2, 8, device="meta")
    with pytest.raises(NotImplementedError, match=r"no kernel for device 'meta'.*supports: cpu"):
        ops.silu_and_mul(torch.empty(2, 4, device="meta"), x)


@pytest.mark.parametrize("call,message", [
    (lambda: ops.rms_norm(torch.empty(2, 8), torch.randn(2, 8), torch.ones(4), 1e-6),
     "weight must have shape [hidden_size] = [8]"),
    (lambda: ops.rms_norm(torch.empty(2, 8), torch.randn(2, 8), torch.ones(8).double(), 1e-6),
     "weight has dtype Double but input has dtype Float"),
    (lambda: ops.silu_and_mul(torch.empty(2, 3), torch.randn(2, 8)),
     "out must have shape [2, 4]"),
    (lambda: ops.silu_and_mul(torch.empty(2, 4).half(), torch.randn(2, 8).half()),
     "silu_and_mul"),
    (lambda: ops.rotary_embedding(torch.zeros(3, dtype=torch.int32), torch.randn(3, 64),
                                  torch.randn(3, 64), 64, torch.randn(16, 64), True),
     "positions must have dtype Long"),
    (lambda: ops.rotary_embedding(torch.tensor([0, 99, 1]), torch.randn(3, 64),
                                  torch.randn(3, 64), 64, torch.randn(16, 64), True),
     "positions[1] = 99 is outside cos_sin_cache's 16 positions"),
    (lambda: ops.reshape_and_cache(torch.randn(3, 2, 64), torch.randn(3, 2, 64),
                                   torch.zeros(4, 2, 16, 64), torch.zeros(4, 2, 16, 64),
                                   torch.tensor([0, 1, 64])),
     "slot_mapping[2] = 64 is past the cache's 64 slots"),
    (lambda: ops.reshape_and_cache(torch.randn(3, 2, 64), torch.randn(3, 2, 64),
                                   torch.zeros(4, 3, 16, 64), torch.zeros(4, 3, 16, 64),
                                   torch.tensor([0, 1, 2])),
     "does not match key"),
    (lambda: ops.copy_blocks([torch.zeros(4, 2, 16, 8)], [torch.zeros(4, 2, 16, 8)],
                             torch.tensor([[0, 9]])),
     "block_mapping holds block 9, outside the cache's 4 blocks"),
    (lambda: ops.paged_attention(torch.empty(1, 6, 64), torch.randn(1, 6, 64),
                                 torch.zeros(4, 4, 16, 64), torch.zeros(4, 4, 16, 64),
                                 torch.zeros(1, 4, dtype=torch.int32),
                                 torch.tensor([5], dtype=torch.int32),
                                 torch.tensor([0, 1], dtype=torch.int32), 5, 0.1),
     "num_heads (6) must be a multiple of key_cache's num_kv_heads (4)"),
    (lambda: ops.paged_attention(torch.empty(1, 4, 48), torch.randn(1, 4, 48),
                                 torch.zeros(4, 4, 16, 48), torch.zeros(4, 4, 16, 48),
                                 torch.zeros(1, 4, dtype=torch.int32),
                                 torch.tensor([5], dtype=torch.int32),
                                 torch.tensor([0, 1], dtype=torch.int32), 5, 0.1),
     "supports head sizes"),
    (lambda: ops.paged_attention(torch.empty(1, 4, 64), torch.randn(1, 4, 64),
                                 torch.zeros(4, 4, 16, 64), torch.zeros(4, 4, 16, 64),
                                 torch.zeros(1, 4, dtype=torch.int32),
                                 torch.tensor([65], dtype=torch.int32),
                                 torch.tensor([0, 1], dtype=torch.int32), 65, 0.1),
     "context_lens[0] = 65 must cover"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        call()
