"""Typed wrappers over the ops of vllm._C (csrc/torch_bindings.cpp). PyTorch's dispatcher runs
the CPU or the CUDA kernel by the tensors' device; `has_kernel` says whether one exists."""
import functools
from typing import Optional

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

try:
    import vllm._C as _C  # registers torch.ops._C.*
except ImportError as e:  # a source tree that was never built
    _C = None
    logger.warning("vllm._C is not built (%s); layers fall back to plain torch", e)

_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}
OP_NAMES = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding",
            "reshape_and_cache", "rotary_embedding_and_cache", "copy_blocks", "paged_attention")


def cpu_isa() -> Optional[str]:
    """The vector ISA vllm._C's CPU kernels were built for ('avx512', 'avx2', 'scalar'), or None
    where it is not built."""
    return getattr(_C, "cpu_isa", None) if _C is not None else None


@functools.lru_cache(maxsize=None)
def has_kernel(op_name: str, device_type: str) -> bool:
    """True when vllm._C registered a kernel for `op_name` on `device_type` ('cpu', 'cuda')."""
    key = _DISPATCH_KEYS.get(device_type)
    if _C is None or key is None:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{op_name}", key)


def kernel_devices(op_name: str) -> list[str]:
    return [d for d in _DISPATCH_KEYS if has_kernel(op_name, d)]


def _call(op_name: str, device: torch.device, *args) -> None:
    if _C is None:
        raise RuntimeError(f"vllm._C::{op_name} is unavailable: the extension is not built "
                           "(pip install --no-build-isolation -e .)")
    try:
        getattr(torch.ops._C, op_name)(*args)
    except NotImplementedError as e:
        if has_kernel(op_name, device.type):
            raise
        hint = (" (vllm._C was built without CUDA: rebuild it with VLLM_TARGET_DEVICE=cuda)"
                if device.type == "cuda" and not getattr(_C, "cuda_enabled", 0) else "")
        raise NotImplementedError(
            f"vllm._C::{op_name} has no kernel for device '{device.type}'; this build supports: "
            f"{', '.join(kernel_devices(op_name)) or 'none'}{hint}") from e


def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
             epsilon: float) -> None:
    _call("rms_norm", input.device, out, input, weight, epsilon)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       epsilon: float) -> None:
    _call("fused_add_rms_norm", input.device, input, residual, weight, epsilon)


def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    _call("silu_and_mul", input.device, out, input)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    _call("rotary_embedding", query.device, positions, query, key, head_size, cos_sin_cache,
          is_neox)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    _call("reshape_and_cache", key.device, key, value, key_cache, value_cache, slot_mapping)


def rotary_embedding_and_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, head_size: int, cos_sin_cache: torch.Tensor,
                               is_neox: bool, key_cache: torch.Tensor, value_cache: torch.Tensor,
                               slot_mapping: torch.Tensor) -> None:
    """rotary_embedding(query, key) then reshape_and_cache(key, value) in one call (one launch
    on CUDA); key/value [num_tokens, num_kv_heads, head_size], each row's heads adjacent."""
    _call("rotary_embedding_and_cache", query.device, positions, query, key, value, head_size,
          cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping)


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],
                block_mapping: torch.Tensor) -> None:
    _call("copy_blocks", block_mapping.device, key_caches, value_caches, block_mapping)


def paged_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, query_start_loc: torch.Tensor,
                    max_context_len: int, scale: float) -> None:
    _call("paged_attention", query.device, out, query, key_cache, value_cache, block_tables,
          context_lens, query_start_loc, max_context_len, scale)


# CPU-only ops (no CUDA kernel): a decode step of few rows (vllm/model_executor/cpu_decode.py)
CPU_OP_NAMES = ("decode_layers", "pack_linear", "linear_packed", "linear_argmax",
                "greedy_steps")


def linear_small(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                 bias: "torch.Tensor | None" = None) -> None:
    """out [M, N] = input [M, K] @ weight [N, K]^T (+ bias); for few rows (the CPU's up to ~32,
    CUDA's up to 8 per pass over the weights). CPU: fp32, bf16; CUDA: fp32, fp16, bf16."""
    _call("linear_small", input.device, out, input, weight, bias)


def decode_layers(hidden: torch.Tensor, positions: torch.Tensor, weights: list[torch.Tensor],
                  final_norm: torch.Tensor, cos_sin_cache: torch.Tensor,
                  key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],
                  slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, query_start_loc: torch.Tensor,
                  max_context_len: int, num_heads: int, num_kv_heads: int, head_size: int,
                  epsilon: float, scale: float, is_neox: bool,
                  packed: "list[torch.Tensor] | None" = None,
                  stage_ms: Optional[torch.Tensor] = None) -> None:
    """Every decoder layer and the final norm over hidden (the embedded tokens), in place.
    packed: none, or per layer pack_linear's copies of qkv, o, gate_up and down. stage_ms: none,
    or float64 [len(DECODE_STAGES)] to which each stage's wall time (ms) is added."""
    _call("decode_layers", hidden.device, hidden, positions, weights, final_norm, cos_sin_cache,
          key_caches, value_caches, slot_mapping, block_tables, context_lens, query_start_loc,
          max_context_len, num_heads, num_kv_heads, head_size, epsilon, scale, is_neox,
          packed or [], stage_ms)


# decode_layers' stages, then greedy_steps' own (each step's input rows, its LM head), in
# stage_ms order (csrc/ops.h, DecodeStage)
DECODE_STAGES = ("norms", "qkv", "rotary_cache", "attention", "o", "gate_up", "silu", "down",
                 "inputs", "lm_head")
GREEDY_STAGES = ("inputs", "lm_head")


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """A CPU weight [N, K] repacked for linear_packed's tiles (bf16 on a CPU with AVX512_BF16; an
    empty tensor elsewhere): [ceil(N / 16), ceil(K / 2) * 32], a column pair of 16 rows a vector."""
    if not has_kernel("pack_linear", "cpu"):
        return weight.new_empty(0)
    return torch.ops._C.pack_linear(weight)


def linear_packed(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                  packed: torch.Tensor, bias: "torch.Tensor | None" = None) -> None:
    """linear_small, with weight's packed copy (pack_linear's; empty: none) for the row counts
    where its tiles pay."""
    _call("linear_packed", input.device, out, input, weight, packed, bias)


def linear_argmax(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                  packed: torch.Tensor) -> None:
    """out [M] (int64) = each row's first maximal index of input @ weight^T in weight's dtype (a
    NaN counting as the maximum, as numpy's argmax): a greedy draft's tokens without its logits.
    packed: as for linear_packed."""
    _call("linear_argmax", input.device, out, input, weight, packed)


def greedy_steps(tokens: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                 embedding: torch.Tensor, weights: list[torch.Tensor], final_norm: torch.Tensor,
                 cos_sin_cache: torch.Tensor, key_caches: list[torch.Tensor],
                 value_caches: list[torch.Tensor], block_tables: torch.Tensor, num_heads: int,
                 num_kv_heads: int, head_size: int, epsilon: float, scale: float,
                 is_neox: bool, packed: list[torch.Tensor], head: torch.Tensor,
                 head_packed: torch.Tensor, stage_ms: Optional[torch.Tensor] = None,
                 query_start_loc: Optional[torch.Tensor] = None,
                 step_ms: Optional[torch.Tensor] = None) -> None:
    """tokens [steps, rows] (int64) = a plain-greedy draft's next steps tokens a sequence, in one
    call: from input_ids at positions (one token a sequence; with query_start_loc, int32
    [rows + 1], a sequence's first step feeds several tokens at consecutive positions), each
    step embedding's rows, decode_layers (its arguments; the slots and context lengths from
    block_tables) and linear_argmax over head of each sequence's last row, whose tokens the
    next step feeds at the next positions. step_ms: none, or float64 [steps] that gets each
    step's wall time in ms (the first step's from the call's start)."""
    _call("greedy_steps", input_ids.device, tokens, input_ids, positions, embedding, weights,
          final_norm, cos_sin_cache, key_caches, value_caches, block_tables, num_heads,
          num_kv_heads, head_size, epsilon, scale, is_neox, packed, head, head_packed, stage_ms,
          query_start_loc, step_ms)
