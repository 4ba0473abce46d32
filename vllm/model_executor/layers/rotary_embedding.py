"""Rotary position embedding (Su et al. 2021, RoFormer, arXiv 2104.09864): neox style rotates the
two halves of each head, gpt-j style interleaved pairs; only the first rotary_dim dims rotate."""
import math
from typing import Optional

import numpy as np
import torch

from vllm import _custom_ops as ops
from vllm import envs
from vllm.model_executor.custom_op import CustomOp


def cos_sin_of(angles: torch.Tensor) -> torch.Tensor:
    """[..., d] fp32 angles -> [..., 2d] fp32: their cosines, then their sines, each the fp32
    nearest the float64 value (numpy's, on the calling thread). Not torch's fp32 cos: on the
    CPU it splits a few thousand elements over the thread pool, and the first cos call of a
    process (seen in 3 of 25 test processes that had first run a test changing the thread
    count) returned one thread's half up to 1.5e-4 off, later calls exact; as the rotary cache
    that moved a decode test's hidden states 50x past their usual error."""
    a = angles.detach().cpu().numpy().astype(np.float64)
    d = a.shape[-1]
    both = np.empty(a.shape[:-1] + (2 * d,), dtype=np.float32)  # each half rounded on the way in
    both[..., :d] = np.cos(a)
    both[..., d:] = np.sin(a)
    return torch.from_numpy(both).to(angles.device)


class RotaryEmbedding(CustomOp):
    op_name = "rotary_embedding"

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, is_neox_style: bool, dtype: torch.dtype,
                 rope_scaling: Optional[dict] = None) -> None:
        super().__init__()
        if rotary_dim > head_size or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and at most head_size ({head_size}), "
                             f"got {rotary_dim}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.is_neox_style = is_neox_style
        inv_freq = 1.0 / (base**(torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        inv_freq = scale_inv_freq(inv_freq, rope_scaling)
        freqs = torch.outer(torch.arange(max_position_embeddings, dtype=torch.float), inv_freq)
        self.register_buffer("cos_sin_cache", cos_sin_of(freqs).to(dtype), persistent=False)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor,
                       key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [num_tokens]; query/key [num_tokens, num_heads * head_size]."""
        cos, sin = self.cos_sin_cache[positions].float().chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(shape[0], -1, self.head_size)
        rot, rest = x[..., :self.rotary_dim].float(), x[..., self.rotary_dim:]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [num_tokens, 1, rotary_dim / 2]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
            rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((rot.to(x.dtype), rest), dim=-1).reshape(shape)

    def forward_kernel(self, positions: torch.Tensor, query: torch.Tensor,
                       key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotates query and key in place."""
        ops.rotary_embedding(positions, query, key, self.head_size, self.cos_sin_cache,
                             self.is_neox_style)
        return query, key

    def fuses_cache_write(self, query: torch.Tensor) -> bool:
        """Whether forward_with_cache serves query's device (VLLM_FUSED_ROTARY_CACHE on)."""
        return (envs.VLLM_FUSED_ROTARY_CACHE
                and ops.has_kernel("rotary_embedding_and_cache", query.device.type))

    def forward_with_cache(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Rotates query [num_tokens, num_heads * head_size] and key [num_tokens, num_kv_heads,
        head_size] in place and writes key and value into the paged caches at slot_mapping:
        forward_kernel and reshape_and_cache in one call."""
        ops.rotary_embedding_and_cache(positions, query, key, value, self.head_size,
                                       self.cos_sin_cache, self.is_neox_style, key_cache,
                                       value_cache, slot_mapping)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        if ops.has_kernel(self.op_name, query.device.type):
            return self.forward_kernel(positions, query, key)
        return self.forward_native(positions, query, key)


def scale_inv_freq(inv_freq: torch.Tensor, rope_scaling: Optional[dict]) -> torch.Tensor:
    """Applies a checkpoint's rope scaling to the frequencies: none/default, linear, or llama3
    (Llama 3.1: low frequencies divided by `factor`, high kept, a smooth ramp between)."""
    rope_type = (rope_scaling or {}).get("rope_type", rope_scaling and rope_scaling.get("type"))
    if rope_type in (None, "default"):
        return inv_freq
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    if rope_type == "llama3":
        factor = rope_scaling["factor"]
        low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
        old_len = rope_scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    raise ValueError(f"rope scaling type {rope_type!r} is not supported (default, linear, llama3)")
