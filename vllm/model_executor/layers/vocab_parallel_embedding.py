"""The embedding and the LM head split by vocabulary rows over the tensor-parallel ranks. Rank r
holds rows [r * per, (r + 1) * per) with per = ceil(vocab / size) (the last share padded with
zero rows). The embedding looks up the ids it holds, zeros the others and sums over ranks; the
LM head's logits of each rank's rows are gathered and the padding cut off. With one rank each is
exactly nn.Embedding / nn.Linear over the whole vocabulary."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.distributed.parallel_state import get_tp_group
from vllm.model_executor import cpu_decode
from vllm.model_executor.layers.linear import linear
from vllm.model_executor.sampler import argmax_rows


class VocabParallelEmbedding(nn.Module):

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.num_embeddings = num_embeddings
        per = -(-num_embeddings // self.tp.size)
        self.vocab_start = self.tp.rank * per
        self.vocab_end = min(self.vocab_start + per, num_embeddings)
        self.weight = nn.Parameter(torch.empty(per, embedding_dim))
        nn.init.normal_(self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        held = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(held, input_ids - self.vocab_start, 0)
        out = F.embedding(local, self.weight) * held.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(out)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [num_rows, dim] -> fp32 logits [num_rows, vocab], on every rank."""
        # in the weights' dtype, then fp32; a GEMV for few rows (CPU: cpu_decode's; CUDA:
        # linear_small with VLLM_CUDA_GEMV on), else torch's GEMM
        if hidden.is_cuda:
            logits = linear(hidden, self.weight).float()
        else:  # the weight's packed copy kept on this module
            logits = cpu_decode.linear(hidden, self.weight, owner=self).float()
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits)[:, :self.num_embeddings]

    def compute_argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each row's first maximal index of compute_logits(hidden) (a NaN as the maximum):
        greedy tokens; on the CPU with one rank without the fp32 logits (cpu_decode.argmax)."""
        if not hidden.is_cuda and self.tp.size == 1:
            tokens = cpu_decode.argmax(hidden, self.weight, owner=self)
            if tokens is not None:
                return tokens
        return argmax_rows(self.compute_logits(hidden))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      part: Optional[int] = None) -> None:
        if tuple(loaded.shape) != (self.num_embeddings, param.shape[1]):
            raise ValueError(f"has shape {tuple(loaded.shape)}, expected "
                             f"{(self.num_embeddings, param.shape[1])}")
        n = self.vocab_end - self.vocab_start
        param.data[:n].copy_(loaded[self.vocab_start:self.vocab_end])
        param.data[n:].zero_()


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection: the same split, used through compute_logits only."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the LM head computes logits (compute_logits), it embeds nothing")
