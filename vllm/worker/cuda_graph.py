"""CUDA graphs for decode steps: the model's forward for batches of one new token per sequence is
captured once per batch size (1, 2, 4, 8, then steps of 8) over static input buffers, and each
decode step of up to that many sequences copies its inputs in and replays the graph: one launch
instead of hundreds. Padded rows write nowhere (slot -1) and their outputs are dropped."""
from typing import Optional

import torch
from torch import nn

from vllm.forward_context import AttentionMetadata, set_forward_context
from vllm.logger import init_logger

logger = init_logger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4] + list(range(8, 257, 8))
    return [s for s in sizes if s <= max_num_seqs] or [1]


class CudaGraphRunner:

    def __init__(self, model: nn.Module, kv_caches: list, max_num_seqs: int,
                 max_model_len: int, block_size: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        max_b = self.sizes[-1]
        max_blocks = -(-max_model_len // block_size)
        kw = dict(device=device)
        self.input_ids = torch.zeros(max_b, dtype=torch.long, **kw)
        self.positions = torch.zeros(max_b, dtype=torch.long, **kw)
        self.slot_mapping = torch.full((max_b,), -1, dtype=torch.long, **kw)
        self.block_tables = torch.zeros(max_b, max_blocks, dtype=torch.int32, **kw)
        self.context_lens = torch.ones(max_b, dtype=torch.int32, **kw)
        self.query_start_loc = torch.arange(max_b + 1, dtype=torch.int32, **kw)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def _metadata(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(self.slot_mapping[:b], self.block_tables[:b],
                                 self.context_lens[:b], self.query_start_loc[:b + 1],
                                 max_context_len=self.max_model_len, query_lens=[1] * b,
                                 prefill_only=False)

    @torch.inference_mode()
    def capture(self) -> None:
        for b in reversed(self.sizes):  # largest first, so smaller graphs reuse its pool
            md = self._metadata(b)
            with set_forward_context(md, self.kv_caches):
                self.model(self.input_ids[:b], self.positions[:b])  # warm-up
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self.outputs[b] = self.model(self.input_ids[:b], self.positions[:b])
            self.pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, num_seqs: int, md: AttentionMetadata) -> bool:
        return (num_seqs <= self.sizes[-1] and md.max_context_len <= self.max_model_len
                and all(n == 1 for n in md.query_lens))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            md: AttentionMetadata) -> Optional[torch.Tensor]:
        """Replays the smallest graph that fits; returns hidden states [num_seqs, hidden]."""
        b = input_ids.shape[0]
        size = next(s for s in self.sizes if s >= b)
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.slot_mapping[:b].copy_(md.slot_mapping)
        self.slot_mapping[b:size].fill_(-1)
        self.block_tables[:size].zero_()
        self.block_tables[:b, :md.block_tables.shape[1]].copy_(md.block_tables)
        self.context_lens[:b].copy_(md.context_lens)
        self.context_lens[b:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:b]
