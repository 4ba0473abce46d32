"""The sharded layers, rank by rank in one process (no communication): each rank's slice of full
checkpoint tensors, put back together (outputs concatenated for column-parallel layers, partial
products summed for row-parallel ones, logits concatenated for the LM head), equals the unsplit
layer; KV heads are replicated when there are fewer than ranks."""
import pytest
import torch
import torch.nn.functional as F

from vllm.distributed import parallel_state
from vllm.distributed.parallel_state import TPGroup
from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                               RowParallelLinear)
from vllm.model_executor.layers.vocab_parallel_embedding import (ParallelLMHead,
                                                                 VocabParallelEmbedding)


def build_on_rank(monkeypatch, rank, size, factory):
    monkeypatch.setattr(parallel_state, "_building", TPGroup(rank, size))
    return factory()


@pytest.mark.parametrize("size,num_kv_heads", [(1, 2), (2, 2), (4, 2), (4, 1), (2, 4)])
def test_qkv_split_by_heads(monkeypatch, size, num_kv_heads):
    hidden, head, num_heads = 32, 8, 4
    wq, wk, wv = (torch.randn(n * head, hidden) for n in (num_heads, num_kv_heads, num_kv_heads))
    bq, bk, bv = (w[:, 0].clone() for w in (wq, wk, wv))
    x = torch.randn(5, hidden)
    q_parts, k_heads = [], {}
    for rank in range(size):
        layer = build_on_rank(monkeypatch, rank, size, lambda: QKVParallelLinear(
            hidden, head, num_heads, num_kv_heads, bias=True))
        for part, (w, b) in enumerate(((wq, bq), (wk, bk), (wv, bv))):
            layer.weight_loader(layer.weight, w, part)
            layer.weight_loader(layer.bias, b, part)
        q, k, v = layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
        q_parts.append(q)
        # the KV heads this rank's query heads attend to (GQA groups), in order
        per = num_heads // size
        groups = sorted({h // (num_heads // num_kv_heads)
                         for h in range(rank * per, (rank + 1) * per)})
        assert layer.num_kv_heads == len(groups)
        for j, group in enumerate(groups):  # every copy of a KV head must be that head
            kv = torch.cat([k[:, j * head:(j + 1) * head], v[:, j * head:(j + 1) * head]], -1)
            k_heads.setdefault(group, []).append(kv)
    torch.testing.assert_close(torch.cat(q_parts, -1), F.linear(x, wq, bq))
    assert sorted(k_heads) == list(range(num_kv_heads))
    k_full, v_full = F.linear(x, wk, bk), F.linear(x, wv, bv)
    for h, copies in k_heads.items():
        ref = torch.cat([k_full[:, h * head:(h + 1) * head], v_full[:, h * head:(h + 1) * head]],
                        -1)
        for kv in copies:
            torch.testing.assert_close(kv, ref)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_mlp_split_gate_up_columns_down_rows(monkeypatch, size):
    hidden, inter = 16, 32
    w_gate, w_up, w_down = torch.randn(inter, hidden), torch.randn(inter, hidden), \
        torch.randn(hidden, inter)
    b_down = torch.randn(hidden)
    x = torch.randn(3, hidden)
    total = torch.zeros(3, hidden)
    for rank in range(size):
        gate_up = build_on_rank(monkeypatch, rank, size, lambda: MergedColumnParallelLinear(
            hidden, [inter, inter], bias=False))
        gate_up.weight_loader(gate_up.weight, w_gate, 0)
        gate_up.weight_loader(gate_up.weight, w_up, 1)
        down = build_on_rank(monkeypatch, rank, size, lambda: RowParallelLinear(
            inter, hidden, bias=True))
        down.weight_loader(down.weight, w_down)
        down.weight_loader(down.bias, b_down)
        g, u = gate_up(x).chunk(2, dim=-1)
        total += F.linear(F.silu(g) * u, down.weight)  # the partial product; the sum is the
    total += b_down                                    # all-reduce, the bias is added once
    ref = F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down, b_down)
    torch.testing.assert_close(total, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("size,vocab", [(1, 10), (2, 10), (4, 10), (3, 11)])
def test_vocab_split_embedding_and_logits(monkeypatch, size, vocab):
    # each rank's own result: the sum over ranks (embedding) and the concatenation (logits) are
    # done here instead of by the collectives
    monkeypatch.setattr(TPGroup, "all_reduce", lambda self, x: x)
    monkeypatch.setattr(TPGroup, "all_gather", lambda self, x, dim=-1: x)
    dim = 6
    weight = torch.randn(vocab, dim)
    ids = torch.tensor([0, vocab - 1, 3, 3, vocab // 2])
    hidden = torch.randn(4, dim)
    embedded, logits = 0, []
    for rank in range(size):
        embed = build_on_rank(monkeypatch, rank, size,
                              lambda: VocabParallelEmbedding(vocab, dim))
        embed.weight_loader(embed.weight, weight)
        embedded = embedded + embed(ids)
        head = build_on_rank(monkeypatch, rank, size, lambda: ParallelLMHead(vocab, dim))
        head.weight_loader(head.weight, weight)
        logits.append(head.compute_logits(hidden))
    torch.testing.assert_close(embedded, weight[ids])
    torch.testing.assert_close(torch.cat(logits, -1)[:, :vocab], hidden @ weight.T)


def test_impossible_head_split(monkeypatch):
    with pytest.raises(ValueError, match="num_attention_heads=6 is not divisible by "
                                         "tensor_parallel_size=4"):
        build_on_rank(monkeypatch, 0, 4, lambda: QKVParallelLinear(32, 8, 6, 2, bias=False))
    with pytest.raises(ValueError, match="num_key_value_heads=3 and tensor_parallel_size=2"):
        build_on_rank(monkeypatch, 0, 2, lambda: QKVParallelLinear(32, 8, 6, 3, bias=False))
