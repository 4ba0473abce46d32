"""The one per-step context: attention metadata and the KV caches, set around each forward and
reset after it, so attention layers find them without threading them through every module."""
import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor  # [num_seqs] int32: cached tokens after this step's writes
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: each sequence's rows of the batch
    max_context_len: int
    query_lens: list[int]  # host copy of the per-sequence new-token counts
    prefill_only: bool  # every sequence starts from an empty cache (dense attention suffices)


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (key_cache, value_cache)


_context: Optional[ForwardContext] = None


@contextlib.contextmanager
def set_forward_context(attn_metadata: AttentionMetadata,
                        kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    global _context
    previous, _context = _context, ForwardContext(attn_metadata, kv_caches)
    try:
        yield
    finally:
        _context = previous


def get_forward_context() -> ForwardContext:
    if _context is None:
        raise RuntimeError("attention ran outside set_forward_context")
    return _context
