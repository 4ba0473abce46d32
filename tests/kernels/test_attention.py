"""paged_attention against paged_attention_native: decode (q_len 1), speculative verification
(q_len k + 1) and prefill (q_len = context), GQA, partial last blocks, shuffled block tables."""
import math

import pytest
import torch

from tests.utils import DEVICES, DTYPES, assert_close
from vllm import _custom_ops as ops
from vllm import envs
from vllm.model_executor.attention.paged_attention import (paged_attention,
                                                            paged_attention_native,
                                                            reshape_and_cache_native)


def make_batch(context_lens, q_lens, num_heads, num_kv_heads, head_size, block_size, dtype,
               device):
    """Random caches holding each sequence's context and the matching metadata."""
    max_blocks = max(math.ceil(c / block_size) for c in context_lens)
    num_blocks = sum(math.ceil(c / block_size) for c in context_lens) + 3
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    key_cache = torch.randn(shape, dtype=dtype, device=device)
    value_cache = torch.randn(shape, dtype=dtype, device=device)
    # each sequence gets distinct blocks in shuffled order; unused table entries point anywhere
    perm = torch.randperm(num_blocks).tolist()
    block_tables = torch.randint(0, num_blocks, (len(context_lens), max_blocks), dtype=torch.int32)
    for s, ctx in enumerate(context_lens):
        n = math.ceil(ctx / block_size)
        block_tables[s, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    query_start_loc = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    query = torch.randn(sum(q_lens), num_heads, head_size, dtype=dtype, device=device)
    return (query, key_cache, value_cache, block_tables.to(device),
            torch.tensor(context_lens, dtype=torch.int32, device=device),
            query_start_loc.to(device))


def run_and_compare(context_lens, q_lens, num_heads, num_kv_heads, head_size, block_size,
                    device, max_context_len=None):
    for dtype in DTYPES[device]:
        batch = make_batch(context_lens, q_lens, num_heads, num_kv_heads, head_size, block_size,
                           dtype, device)
        scale = head_size**-0.5
        ref = paged_attention_native(*batch, scale)
        out = torch.full_like(batch[0], float("nan"))
        ops.paged_attention(out, *batch, max_context_len or max(context_lens), scale)
        assert_close("paged_attention", out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_size", [64, 80, 96, 128])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (12, 2), (14, 2)])
def test_paged_attention_decode(device, head_size, block_size, num_heads, num_kv_heads):
    run_and_compare([1, 17, 64, 300, 33], [1] * 5, num_heads, num_kv_heads, head_size,
                    block_size, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_paged_attention_verify(device, head_size, block_size, k):
    """k drafts + the last accepted token scored at once, causal among themselves."""
    context_lens = [k + 1, 40, 129, 517]
    run_and_compare(context_lens, [k + 1] * 4, 16, 4, head_size, block_size, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_size", [32, 64, 80, 128])
@pytest.mark.parametrize("group,q_len", [(1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (1, 3),
                                         (1, 4), (2, 2), (5, 1)])
def test_paged_attention_few_rows_per_kv_head(device, head_size, group, q_len):
    """Tasks of 1-4 query rows per KV head (a GQA group's decode, a short causal verification
    with one KV head per query head: the CPU's register-held rows) and one past them."""
    context_lens = [q_len, 19, 64, 300, 33]
    run_and_compare(context_lens, [q_len] * 5, 3 * group, 3, head_size, 16, device)


@pytest.mark.parametrize("threads", [2, 8])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("num_kv_heads", [1, 3])
@pytest.mark.parametrize("context_lens,q_lens", [([1000], [1]), ([129], [1]), ([300, 5], [1, 1]),
                                                 ([700, 90], [1, 4])])
def test_paged_attention_decode_split_across_threads(threads, group, num_kv_heads,
                                                     context_lens, q_lens):
    """CPU: a decode step of fewer (sequence, KV head) tasks than twice the threads has each
    task's keys split into parts of 64 keys or more, merged after (1-4 rows per KV head held in
    registers, 5 on the general path); a verifying sequence beside it is not split."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run_and_compare(context_lens, q_lens, group * num_kv_heads, num_kv_heads, 64, 16, "cpu")
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_mixed_prefill_and_decode(device):
    """Variable q_len per sequence, including a whole-prompt prefill and an empty sequence."""
    run_and_compare([50, 7, 200, 90, 3], [50, 1, 9, 0, 3], 8, 2, 64, 16, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (8, 4)])
def test_paged_attention_few_rows_on_average_with_a_longer_query(device, num_heads,
                                                                 num_kv_heads):
    """Decoding sequences beside one verifying 12 tokens: few rows per sequence on average (the
    CUDA kernel's small-block variant), one sequence spanning several of its blocks."""
    run_and_compare([30, 5, 77, 64, 31, 2, 100, 45], [1] * 7 + [12], num_heads, num_kv_heads,
                    128, 16, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("parts", ["max", "context"])
@pytest.mark.parametrize("combine", ["last-block", "kernel", "cluster"])
def test_paged_attention_partitions_sized_for_a_longer_context(device, parts, combine,
                                                               monkeypatch):
    """As under a CUDA graph captured for the longest context: max_context_len far above the
    sequences' own, the CUDA kernel's partitions sized for it or per sequence on the device
    (VLLM_CUDA_ATTN_PARTS) and merged by their last block, a second kernel or inside a
    thread-block cluster (VLLM_CUDA_ATTN_COMBINE; the CPU kernel has no partitions): decode,
    verification, GQA. Each call runs 2-3 launches in a row: the arrival counts start from zero
    every time."""
    monkeypatch.setenv("VLLM_CUDA_ATTN_PARTS", parts)
    monkeypatch.setenv("VLLM_CUDA_ATTN_COMBINE", combine)
    assert envs.VLLM_CUDA_ATTN_PARTS == parts and envs.VLLM_CUDA_ATTN_COMBINE == combine
    run_and_compare([1, 17, 64, 300, 33, 129], [1] * 6, 32, 32, 128, 16, device, 2048)
    run_and_compare([5, 40, 129, 517], [5] * 4, 16, 4, 128, 16, device, 4096)
    run_and_compare([3, 64, 65, 1000], [1, 2, 1, 3], 12, 2, 64, 32, device, 1024)


@pytest.mark.parametrize("device", DEVICES[1:])
@pytest.mark.parametrize("combine", ["last-block", "cluster"])
def test_paged_attention_more_blocks_per_sm(device, combine, monkeypatch):
    """VLLM_CUDA_ATTN_BLOCKS_PER_SM at 16: batches of 8-32 sequences split into partitions
    (one each at the default), merged by the last block or inside a cluster."""
    monkeypatch.setenv("VLLM_CUDA_ATTN_BLOCKS_PER_SM", "16")
    monkeypatch.setenv("VLLM_CUDA_ATTN_COMBINE", combine)
    assert envs.VLLM_CUDA_ATTN_BLOCKS_PER_SM == 16
    run_and_compare([256, 3, 70, 129] * 8, [1] * 32, 32, 32, 128, 16, device, 1024)
    run_and_compare([256, 40, 129, 517] * 2, [5] * 8, 32, 32, 128, 16, device, 1024)
    run_and_compare([300, 17, 64, 1000] * 2, [1, 2, 1, 3] * 2, 64, 8, 128, 16, device, 2048)


@pytest.mark.parametrize("device", DEVICES[1:])
@pytest.mark.parametrize("variable,value,message", [
    ("VLLM_CUDA_ATTN_PARTS", "auto", "VLLM_CUDA_ATTN_PARTS must be max or context, got 'auto'"),
    ("VLLM_CUDA_ATTN_COMBINE", "tree",
     "VLLM_CUDA_ATTN_COMBINE must be cluster, last-block or kernel, got 'tree'"),
    ("VLLM_CUDA_ATTN_BLOCKS_PER_SM", "0",
     "VLLM_CUDA_ATTN_BLOCKS_PER_SM must be a whole number from 1 to 64, got '0'"),
])
def test_paged_attention_rejects_an_unknown_mode(device, variable, value, message, monkeypatch):
    """Checked at every call, also where the launch needs no partitions (one here)."""
    monkeypatch.setenv(variable, value)
    batch = make_batch([10], [1], 4, 4, 64, 16, torch.float16, device)
    with pytest.raises(RuntimeError, match=message):
        ops.paged_attention(torch.empty_like(batch[0]), *batch, 10, 0.125)


@pytest.mark.parametrize("device", DEVICES[1:])
@pytest.mark.parametrize("combine", ["last-block", "kernel", "cluster"])
def test_paged_attention_replayed_in_a_cuda_graph(device, combine, monkeypatch):
    """Captured once after a warm-up (which sizes the arrival counters), replayed with new
    queries and context lengths: every replay equals the reference (the counters are left at
    zero by each launch, also inside a graph)."""
    monkeypatch.setenv("VLLM_CUDA_ATTN_COMBINE", combine)
    query, kc, vc, tables, ctx, qsl = make_batch([300, 17, 64, 129], [1, 1, 2, 1], 16, 4, 128,
                                                 16, torch.bfloat16, device)
    out = torch.empty_like(query)
    ops.paged_attention(out, query, kc, vc, tables, ctx, qsl, 1024, 128**-0.5)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.paged_attention(out, query, kc, vc, tables, ctx, qsl, 1024, 128**-0.5)
    for lens in ([300, 17, 64, 129], [5, 200, 64, 1], [129, 129, 2, 290]):
        query.copy_(torch.randn_like(query))
        ctx.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        ref = paged_attention_native(query, kc, vc, tables, ctx, qsl, 128**-0.5)
        assert_close("paged_attention graph", out, ref, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_lens", [[1, 1, 1], [5, 1, 3]])
def test_paged_attention_reads_a_query_inside_wider_rows(device, q_lens):
    """The query as the q part of a fused qkv projection's rows, read in place (tokens a row
    apart, heads contiguous within one), equals the reference on the same values; the layer's
    wrapper passes such a query without a copy."""
    for dtype in DTYPES[device]:
        query, *rest = make_batch([40, 300, 17], q_lens, 8, 2, 64, 16, dtype, device)
        rows = torch.randn(query.shape[0], (8 + 2 * 2) * 64, dtype=dtype, device=device)
        rows[:, :8 * 64] = query.reshape(query.shape[0], -1)
        strided = rows[:, :8 * 64].view(query.shape)
        assert not strided.is_contiguous()
        ref = paged_attention_native(query, *rest, 0.125)
        out = torch.full_like(query, float("nan"))
        ops.paged_attention(out, strided, *rest, 300, 0.125)
        assert_close("paged_attention strided query", out, ref, dtype)
        assert_close("paged_attention() strided query",
                     paged_attention(strided, *rest, 300, 0.125), ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_names_a_query_whose_heads_are_apart(device):
    query, *rest = make_batch([40, 30], [1, 1], 4, 2, 64, 16, torch.float32, device)
    heads_apart = torch.randn(4, 2, 64, device=device).transpose(0, 1)  # [tokens, heads, d]
    with pytest.raises(RuntimeError, match="query must have contiguous heads"):
        ops.paged_attention(torch.empty(2, 4, 64, device=device), heads_apart, *rest, 40, 0.125)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_long_context(device):
    run_and_compare([4096 + 5, 2000], [1, 3], 32, 8, 128, 16, device)


@pytest.mark.parametrize("device", DEVICES)
def test_write_then_attend(device):
    """reshape_and_cache followed by paged_attention equals dense causal attention."""
    num_tokens, num_heads, head_size, block_size = 21, 4, 64, 16
    q = torch.randn(num_tokens, num_heads, head_size, device=device)
    k = torch.randn(num_tokens, num_heads, head_size, device=device)
    v = torch.randn(num_tokens, num_heads, head_size, device=device)
    cache_shape = (4, num_heads, block_size, head_size)
    kc, vc = torch.zeros(cache_shape, device=device), torch.zeros(cache_shape, device=device)
    block_table = torch.tensor([[3, 1]], dtype=torch.int32, device=device)
    slots = torch.tensor([int(block_table[0, t // block_size]) * block_size + t % block_size
                          for t in range(num_tokens)], device=device)
    ops.reshape_and_cache(k, v, kc, vc, slots)
    out = torch.empty_like(q)
    ops.paged_attention(out, q, kc, vc, block_table,
                        torch.tensor([num_tokens], dtype=torch.int32, device=device),
                        torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
                        num_tokens, head_size**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True).transpose(0, 1)
    assert_close("paged_attention", out, ref, torch.float32)
