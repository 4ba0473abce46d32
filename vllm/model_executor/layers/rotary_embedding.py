"""Rotary position embedding (Su et al. 2021, RoFormer, arXiv 2104.09864): neox style rotates the
two halves of each head, gpt-j style interleaved pairs; only the first rotary_dim dims rotate."""
import torch

from vllm import _custom_ops as ops
from vllm.model_executor.custom_op import CustomOp


class RotaryEmbedding(CustomOp):
    op_name = "rotary_embedding"

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int,
                 base: float, is_neox_style: bool, dtype: torch.dtype) -> None:
        super().__init__()
        if rotary_dim > head_size or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and at most head_size ({head_size}), "
                             f"got {rotary_dim}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.is_neox_style = is_neox_style
        inv_freq = 1.0 / (base**(torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        freqs = torch.outer(torch.arange(max_position_embeddings, dtype=torch.float), inv_freq)
        # [max_position, rotary_dim]: cos in the first half, sin in the second
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

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

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        if ops.has_kernel(self.op_name, query.device.type):
            return self.forward_kernel(positions, query, key)
        return self.forward_native(positions, query, key)
