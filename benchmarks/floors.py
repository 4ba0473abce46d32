"""The bytes a decode step must move, and the floor they set: every weight streamed once (an
untied embedding table is only gathered from, one row per token) plus the KV cache read, over the
memory bandwidth measured in the same run."""
from typing import Any

import torch


def weight_bytes(model: torch.nn.Module) -> int:
    tied = getattr(model, "tie_word_embeddings", False)
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if "embed_tokens" not in n or tied)


def kv_bytes_per_token(config: Any) -> float:
    from vllm.worker.kv_cache import block_bytes
    return block_bytes(config) / config.cache_config.block_size


def step_floor_ms(model: torch.nn.Module, config: Any, context_tokens: float,
                  bandwidth_gbps: float) -> float:
    """One forward over a batch whose sequences hold context_tokens tokens in all."""
    nbytes = weight_bytes(model) + kv_bytes_per_token(config) * context_tokens
    return nbytes / (bandwidth_gbps * 1e9) * 1e3
