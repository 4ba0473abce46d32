"""CustomOp: a layer with a plain-torch reference (`forward_native`) and a kernel path
(`forward_kernel`, through vllm._C). `forward` takes the kernel path when vllm._C has a kernel for
the input's device, so one process can run a CUDA target and a CPU draft with the same layers."""
import torch
from torch import nn

from vllm import _custom_ops as ops


class CustomOp(nn.Module):
    # Name of the vllm._C op that forward_kernel calls.
    op_name: str = ""

    def forward(self, x: torch.Tensor, *args, **kwargs):
        if ops.has_kernel(self.op_name, x.device.type):
            return self.forward_kernel(x, *args, **kwargs)
        return self.forward_native(x, *args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_kernel(self, *args, **kwargs):
        raise NotImplementedError
