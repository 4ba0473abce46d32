"""RMSNorm (Zhang & Sennrich 2019), optionally fused with the residual add before it."""
from typing import Optional, Union

import torch
from torch import nn

from vllm import _custom_ops as ops
from vllm.model_executor.custom_op import CustomOp

Output = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


class RMSNorm(CustomOp):
    op_name = "rms_norm"

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward_native(self, x: torch.Tensor,
                       residual: Optional[torch.Tensor] = None) -> Output:
        """With a residual: residual = x + residual, x = norm(residual); returns (x, residual)."""
        if residual is not None:
            x = x + residual
            residual = x
        orig_dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        out = h.to(orig_dtype) * self.weight
        return out if residual is None else (out, residual)

    def forward_kernel(self, x: torch.Tensor,
                       residual: Optional[torch.Tensor] = None) -> Output:
        """The fused variant updates x and residual in place."""
        if residual is not None:
            ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)
            return x, residual
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        ops.rms_norm(out, x, self.weight, self.variance_epsilon)
        return out
