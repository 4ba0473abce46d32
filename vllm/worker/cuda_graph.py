"""CUDA graphs for decode and verification steps: the model's forward for batches in which every
sequence brings the same number q of new tokens (q = 1: decode; q = k + 1: a speculative step's
last token and k drafts) is captured once per (batch size, q) over static input buffers, and each
such step of up to that many sequences copies its inputs in and replays the graph: one launch
instead of hundreds. Graphs for batch sizes 1, 2, 4, 8, then steps of 8, and every q up to
max_query_len are captured at start (a batch of a new size or k never waits for a capture).
Padded rows write nowhere (slot -1), attend only to themselves, and their outputs are
dropped."""
import time
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
                 max_model_len: int, block_size: int, device: torch.device,
                 max_query_len: int = 1) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        self.max_query_len = max_query_len
        max_b = self.sizes[-1]
        max_tokens = max_b * max_query_len
        max_blocks = -(-max_model_len // block_size)
        kw = dict(device=device)
        self.input_ids = torch.zeros(max_tokens, dtype=torch.long, **kw)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, **kw)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.long, **kw)
        self.block_tables = torch.zeros(max_b, max_blocks, dtype=torch.int32, **kw)
        self.context_lens = torch.ones(max_b, dtype=torch.int32, **kw)
        # per q: sequence i's tokens are rows i*q .. i*q + q - 1
        self.query_start_locs = {q: torch.arange(max_b + 1, dtype=torch.int32, **kw) * q
                                 for q in range(1, max_query_len + 1)}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.pool = None

    def _metadata(self, b: int, q: int) -> AttentionMetadata:
        return AttentionMetadata(self.slot_mapping[:b * q], self.block_tables[:b],
                                 self.context_lens[:b], self.query_start_locs[q][:b + 1],
                                 max_context_len=self.max_model_len, query_lens=[q] * b,
                                 prefill_only=False)

    def _capture_one(self, b: int, q: int) -> None:
        n = b * q
        # the warm-up run executes: it must write no KV (slot -1) and read valid lengths, whatever
        # earlier replays left in the buffers
        self.slot_mapping[:n].fill_(-1)
        self.block_tables[:b].zero_()
        self.context_lens[:b].fill_(q)
        with set_forward_context(self._metadata(b, q), self.kv_caches):
            self.model(self.input_ids[:n], self.positions[:n])  # warm-up
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[(b, q)] = self.model(self.input_ids[:n], self.positions[:n])
        self.pool = graph.pool()
        self.graphs[(b, q)] = graph

    @torch.inference_mode()
    def capture(self) -> None:
        """Decode graphs and, with speculation, the graphs of every verification length
        (q = 2 .. max_query_len, the goodput controller's k = 1 .. K) for every batch size, at
        start: captured mid-serving, each would stall every running request (~36 ms per graph
        at the 7B shape on the H200) and the controller would take that stall for the cost of
        a k + 1 token verification (on the H200 it then kept to plain decoding)."""
        start = time.perf_counter()
        qs = range(self.max_query_len, 0, -1)
        for b in reversed(self.sizes):  # largest first, so smaller graphs reuse its pool
            for q in qs:
                self._capture_one(b, q)
        torch.cuda.synchronize()
        logger.info("captured %d CUDA graphs (batch sizes %s x 1..%d tokens per sequence) in "
                    "%.1f s", len(self.graphs), self.sizes, self.max_query_len,
                    time.perf_counter() - start)

    def can_run(self, num_seqs: int, md: AttentionMetadata) -> bool:
        q = md.query_lens[0]
        return (num_seqs <= self.sizes[-1] and md.max_context_len <= self.max_model_len
                and q <= self.max_query_len and all(n == q for n in md.query_lens))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            md: AttentionMetadata) -> Optional[torch.Tensor]:
        """Replays the smallest graph that fits; returns hidden states [num_tokens, hidden]."""
        b, q = len(md.query_lens), md.query_lens[0]
        size = next(s for s in self.sizes if s >= b)
        if (size, q) not in self.graphs:
            with torch.inference_mode():
                self._capture_one(size, q)
        n = b * q
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(md.slot_mapping)
        self.slot_mapping[n:size * q].fill_(-1)
        self.block_tables[:size].zero_()
        self.block_tables[:b, :md.block_tables.shape[1]].copy_(md.block_tables)
        self.context_lens[:b].copy_(md.context_lens)
        self.context_lens[b:size].fill_(q)
        self.graphs[(size, q)].replay()
        return self.outputs[(size, q)][:n]
