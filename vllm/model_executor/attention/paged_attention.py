"""Attention over a paged KV cache, as the kernels see it.

Cache layout: key_cache, value_cache [num_blocks, num_kv_heads, block_size, head_size]; token
`pos` of a sequence lives at block block_table[pos // block_size], offset pos % block_size;
slot = block * block_size + offset. A sequence's query rows are its newest q_len tokens, already
written to the cache; query token i attends keys 0 .. context_len - q_len + i (causal).

Each function takes the vllm._C kernel when one exists for the tensors' device and otherwise its
`*_native` reference (plain torch, fp32 math), which the kernel tests compare against.
"""
import torch

from vllm import _custom_ops as ops


def reshape_and_cache_native(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                             value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """key/value [num_tokens, num_kv_heads, head_size]; slot_mapping [num_tokens], <0 skips."""
    block_size = key_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, :, offsets] = key[keep]
    value_cache[blocks, :, offsets] = value[keep]


def copy_blocks_native(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],
                       block_mapping: torch.Tensor) -> None:
    """block_mapping [num_pairs, 2]: (src, dst) block pairs, applied to every layer."""
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for cache in (*key_caches, *value_caches):
        cache[dst] = cache[src]


def paged_attention_native(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, query_start_loc: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """query [num_tokens, num_heads, head_size] -> out of the same shape."""
    out = torch.empty_like(query)
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[1]
    block_size = key_cache.shape[2]
    for s in range(context_lens.shape[0]):
        start, end = int(query_start_loc[s]), int(query_start_loc[s + 1])
        q_len, ctx = end - start, int(context_lens[s])
        if q_len == 0:
            continue
        pos = torch.arange(ctx, device=query.device)
        blocks = block_tables[s, pos // block_size].long()
        # [ctx, num_kv_heads, head_size] -> [num_heads, ctx, head_size]
        k = key_cache[blocks, :, pos % block_size].float()
        v = value_cache[blocks, :, pos % block_size].float()
        k = k.repeat_interleave(num_heads // num_kv_heads, dim=1).transpose(0, 1)
        v = v.repeat_interleave(num_heads // num_kv_heads, dim=1).transpose(0, 1)
        q = query[start:end].float().transpose(0, 1)  # [num_heads, q_len, head_size]
        scores = q @ k.transpose(1, 2) * scale  # [num_heads, q_len, ctx]
        q_pos = torch.arange(ctx - q_len, ctx, device=query.device)
        scores.masked_fill_(pos[None, :] > q_pos[:, None], float("-inf"))
        out[start:end] = (scores.softmax(-1) @ v).transpose(0, 1).to(query.dtype)
    return out


def write_to_paged_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    if ops.has_kernel("reshape_and_cache", key.device.type):
        ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    else:
        reshape_and_cache_native(key, value, key_cache, value_cache, slot_mapping)


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor],
                block_mapping: torch.Tensor) -> None:
    if ops.has_kernel("copy_blocks", block_mapping.device.type):
        ops.copy_blocks(key_caches, value_caches, block_mapping)
    else:
        copy_blocks_native(key_caches, value_caches, block_mapping)


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, max_context_len: int,
                    scale: float) -> torch.Tensor:
    if not ops.has_kernel("paged_attention", query.device.type):
        return paged_attention_native(query, key_cache, value_cache, block_tables, context_lens,
                                      query_start_loc, scale)
    # the kernels read a query whose tokens are rows of a wider tensor (the q part of the qkv
    # projection's output) in place: heads contiguous within a token, the token stride a
    # multiple of 16 bytes; anything else is copied first
    t, h, d = query.shape
    token_stride_ok = t <= 1 or (query.stride(0) >= h * d
                                 and query.stride(0) * query.element_size() % 16 == 0)
    if not (query.stride(2) == 1 and query.stride(1) == d and token_stride_ok):
        query = query.contiguous()
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    ops.paged_attention(out, query, key_cache, value_cache, block_tables, context_lens,
                        query_start_loc, max_context_len, scale)
    return out
