"""SiluAndMul: the gated activation of Llama/Qwen2 MLPs, silu(gate) * up."""
import torch
import torch.nn.functional as F

from vllm import _custom_ops as ops
from vllm.model_executor.custom_op import CustomOp


class SiluAndMul(CustomOp):
    op_name = "silu_and_mul"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., 2 * d] (gate then up) -> [..., d]."""
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    def forward_kernel(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
        ops.silu_and_mul(out, x)
        return out
