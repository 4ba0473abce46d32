"""Linear layers split over the tensor-parallel ranks. Column-parallel layers hold a share of the
output features (fused QKV by heads, fused gate/up by each part's share) and need no
communication; a row-parallel layer holds a share of the input features and sums the partial
products over ranks (the one all-reduce of an attention or MLP block). With one rank each is
exactly nn.Linear. Each layer's weight_loader takes a full checkpoint tensor (or one part of a
fused layer) and copies in this rank's slice. On CUDA, a step of few rows can take vllm._C's
linear_small (a GEMV streaming each weight byte once for all rows) instead of torch's GEMM:
up to VLLM_CUDA_GEMV rows (default on: GEMV_MAX_ROWS; a row count; off: never). On a CPU whose
vllm._C is the AVX2 build (no AVX512_BF16), a bf16 linear never runs torch's bf16 GEMM, which
there takes 3.1-4.7x the time of the alternatives: up to CPU_SMALL_MAX_ROWS rows linear_small,
above them torch's fp32 GEMM on fp32 copies (a prefill, a draft's catch-up)."""
import functools
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vllm import _custom_ops as ops
from vllm import envs
from vllm.distributed.parallel_state import get_tp_group, kv_head_range, shard_range

GEMV_MAX_ROWS = 8  # CUDA rows that linear_small takes in one pass over the weights
GEMV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# bf16 rows that linear_small takes on an AVX2 CPU (its kSmallMaxRows; from there torch's fp32
# GEMM on fp32 copies: 2-core AVX2 EPYC, Qwen2.5-0.5B's gate/up at 160 rows 37 ms against 42 ms
# for linear_small 64 rows at a time and 151 ms for torch's bf16 GEMM)
CPU_SMALL_MAX_ROWS = 64
CPU_FP32_SLICE_ELEMS = 1 << 24  # weight elements converted to fp32 at a time above it


def cuda_gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when x [rows, in] @ weight^T runs as linear_small: a CUDA step of at most
    VLLM_CUDA_GEMV rows (read per call; inside a CUDA graph the capture's choice stays; on:
    GEMV_MAX_ROWS), one dtype, unit-stride rows, a contiguous weight and no autograd. The
    switch and the device are read first: a CPU or larger step costs two lookups."""
    limit = envs.VLLM_CUDA_GEMV
    return (limit > 0 and x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= limit
            and x.dtype == weight.dtype and x.dtype in GEMV_DTYPES and x.stride(-1) == 1
            and weight.is_contiguous() and not (torch.is_grad_enabled() and weight.requires_grad)
            and _has_cuda_gemv())


@functools.cache
def _has_cuda_gemv() -> bool:
    """Whether vllm._C was built with the CUDA linear_small (fixed once it is loaded)."""
    return ops.has_kernel("linear_small", "cuda")


@functools.cache
def _cpu_bf16_gemm_is_slow() -> bool:
    """Whether vllm._C is the AVX2 build, where torch's bf16 GEMM is the slow one (fixed once it
    is loaded)."""
    return ops.cpu_isa() == "avx2" and ops.has_kernel("linear_small", "cpu")


def cpu_bf16_linear(x: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for bf16 CPU tensors without torch's bf16 GEMM: linear_small
    for [rows, in] inputs of at most CPU_SMALL_MAX_ROWS rows, else torch's fp32 GEMM on fp32
    copies rounded back to bf16 (fp32 sums either way, as torch's bf16 GEMM)."""
    if (x.dim() == 2 and 0 < x.shape[0] <= CPU_SMALL_MAX_ROWS and weight.is_contiguous()
            and (bias is None or bias.dtype == x.dtype)):
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        ops.linear_small(out, x.contiguous(), weight, None if bias is None else bias.contiguous())
        return out
    # the weight's fp32 copy a slice of rows at a time, at most CPU_FP32_SLICE_ELEMS (64 MB; an
    # LM head whole would be ~1 GB)
    xf = x.float()
    out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.bfloat16)
    rows = max(1, CPU_FP32_SLICE_ELEMS // max(1, weight.shape[1]))
    for n0 in range(0, weight.shape[0], rows):
        n1 = min(weight.shape[0], n0 + rows)
        out[..., n0:n1] = F.linear(xf, weight[n0:n1].float(),
                                   None if bias is None else bias[n0:n1].float())
    return out


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through linear_small when cuda_gemv_applies: the result goes to
    a fresh tensor of torch's caching allocator (a CUDA graph's pool during capture) and the
    kernel runs on the current stream, with no host sync; bf16 on an AVX2 CPU through
    cpu_bf16_linear (without autograd)."""
    if cuda_gemv_applies(x, weight) and (bias is None or bias.dtype == x.dtype):
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        ops.linear_small(out, x, weight, None if bias is None else bias.contiguous())
        return out
    if (x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and weight.requires_grad)
            and _cpu_bf16_gemm_is_slow()):
        return cpu_bf16_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _check_shape(loaded: torch.Tensor, expected: Sequence[int]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(expected)}")


class ColumnParallelLinear(nn.Linear):
    """y[:, parts of this rank] = x W_rank^T; parts are the output pieces of a fused layer
    (one piece for a plain layer), each split into equal row ranges by rank."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool) -> None:
        self.tp = get_tp_group()
        # per part: (rows in the full part, [start, end) of this rank's rows)
        self.parts = [(n, self._rank_rows(i, n)) for i, n in enumerate(output_sizes)]
        super().__init__(input_size, sum(e - s for _, (s, e) in self.parts), bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def _rank_rows(self, part: int, rows: int) -> tuple[int, int]:
        return shard_range(rows, self.tp.rank, self.tp.size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      part: Optional[int] = None) -> None:
        """Copies this rank's rows of part (None: the whole unfused output) into param."""
        part = 0 if part is None else part
        rows, (start, end) = self.parts[part]
        _check_shape(loaded, (rows,) + tuple(param.shape[1:]))
        offset = sum(e - s for _, (s, e) in self.parts[:part])
        param.data[offset:offset + end - start].copy_(loaded[start:end])


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Fused gate/up: each part split by rank, so this rank's [gate_r, up_r] feed SiluAndMul."""


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v split by heads: num_heads / size query heads per rank, and the KV heads
    shared out the same way, or replicated when there are fewer KV heads than ranks."""

    def __init__(self, hidden_size: int, head_size: int, num_heads: int, num_kv_heads: int,
                 bias: bool) -> None:
        tp = get_tp_group()
        if num_heads % tp.size:
            raise ValueError(f"num_attention_heads={num_heads} is not divisible by "
                             f"tensor_parallel_size={tp.size}")
        if num_kv_heads % tp.size and tp.size % num_kv_heads:
            raise ValueError(f"num_key_value_heads={num_kv_heads} and tensor_parallel_size="
                             f"{tp.size}: one must divide the other")
        self.head_size = head_size
        self.num_kv_heads_total = num_kv_heads
        self.num_heads = num_heads // tp.size
        start, end = kv_head_range(num_kv_heads, tp.rank, tp.size)
        self.num_kv_heads = end - start
        super().__init__(hidden_size, [num_heads * head_size, num_kv_heads * head_size,
                                       num_kv_heads * head_size], bias)

    def _rank_rows(self, part: int, rows: int) -> tuple[int, int]:
        if part == 0:
            return shard_range(rows, self.tp.rank, self.tp.size)
        start, end = kv_head_range(self.num_kv_heads_total, self.tp.rank, self.tp.size)
        return start * self.head_size, end * self.head_size

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_size


class RowParallelLinear(nn.Linear):
    """y = sum over ranks of x_rank W_rank^T (+ bias once): x arrives split by features, as a
    column-parallel layer (or the attention over this rank's heads) left it."""

    def __init__(self, input_size: int, output_size: int, bias: bool) -> None:
        self.tp = get_tp_group()
        self.input_range = shard_range(input_size, self.tp.rank, self.tp.size)
        self.input_size_full = input_size
        super().__init__(self.input_range[1] - self.input_range[0], output_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return linear(x, self.weight, self.bias)
        out = self.tp.all_reduce(linear(x, self.weight))
        return out if self.bias is None else out + self.bias

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      part: Optional[int] = None) -> None:
        if param.dim() == 1:  # the bias: whole on every rank, added after the sum
            _check_shape(loaded, param.shape)
            param.data.copy_(loaded)
            return
        _check_shape(loaded, (param.shape[0], self.input_size_full))
        start, end = self.input_range
        param.data.copy_(loaded[:, start:end])
