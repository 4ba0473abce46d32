"""Attention layer: rotates the step's queries and keys, writes its new K/V into the paged cache
(both in one vllm._C call where the op has a kernel), then attends over it.
Prefill-only batches on the GPU use dense causal flash attention over the fresh K/V: in fp16 and
bf16 every prompt's rows in one variable-length call, otherwise SDPA a prompt at a time; every
other batch (decode, speculative verification, chunked prefill, and everything on the CPU) uses
the paged_attention op of vllm._C."""
import torch
import torch.nn.functional as F
from torch import nn

from torch.nn.attention import SDPBackend, sdpa_kernel

from vllm.forward_context import get_forward_context
from vllm.model_executor.attention import paged_attention as pa
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding


# Dense prefill runs on flash (or memory-efficient) attention, never cuDNN's: cuDNN builds an
# execution plan for every new sequence length, the likely cause of what the H200 showed: the
# prefill of each new prompt length took ~70 ms, of a length seen before ~10-20 ms
# (benchmarks/RESULTS.md, the serving sweep's engine-side TTFT).
PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class Attention(nn.Module):

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 layer_idx: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.layer_idx = layer_idx

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                rotary_emb: RotaryEmbedding) -> torch.Tensor:
        """q [num_tokens, num_heads * head_size], k/v [num_tokens, num_kv_heads * head_size],
        before the rotary embedding at positions [num_tokens]."""
        ctx = get_forward_context()
        md = ctx.attn_metadata
        key_cache, value_cache = ctx.kv_caches[self.layer_idx]
        num_tokens = q.shape[0]
        if rotary_emb.fuses_cache_write(q):
            k, v = (t.view(num_tokens, self.num_kv_heads, self.head_size) for t in (k, v))
            rotary_emb.forward_with_cache(positions, q, k, v, key_cache, value_cache,
                                          md.slot_mapping)
        else:
            q, k = rotary_emb(positions, q, k)
            k, v = (t.view(num_tokens, self.num_kv_heads, self.head_size) for t in (k, v))
            pa.write_to_paged_cache(k, v, key_cache, value_cache, md.slot_mapping)
        q = q.view(num_tokens, self.num_heads, self.head_size)
        if md.prefill_only and q.is_cuda:
            out = self._dense_prefill(q, k, v, md.query_start_loc, md.query_lens)
        else:
            out = pa.paged_attention(q, key_cache, value_cache, md.block_tables,
                                     md.context_lens, md.query_start_loc, md.max_context_len,
                                     self.scale)
        return out.view(num_tokens, self.num_heads * self.head_size)

    def _dense_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       query_start_loc: torch.Tensor, query_lens: list[int]) -> torch.Tensor:
        """Causal attention of each prompt over its own rows: q [num_tokens, num_heads,
        head_size], k/v [num_tokens, num_kv_heads, head_size], the prompts' rows from
        query_start_loc (int32, on q's device)."""
        if q.dtype in (torch.float16, torch.bfloat16) and self.head_size % 8 == 0 and (
                self.head_size <= 256):
            # one launch for all prompts (a call a prompt cost ~3 ms of host time per prompt
            # over 32 layers on the H200's host: 16 prompts of 128 tokens took 92 ms, 44 on
            # the GPU); flash takes the GQA groups itself
            n = max(query_lens)
            return torch.ops.aten._flash_attention_forward(
                q, k, v, query_start_loc, query_start_loc, n, n, 0.0, True, False,
                scale=self.scale)[0]
        out = torch.empty_like(q)
        start = 0
        with sdpa_kernel(PREFILL_BACKENDS):
            for n in query_lens:
                start = self._dense_one(q, k, v, out, start, n)
        return out

    def _dense_one(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   start: int, n: int) -> int:
        # [num_heads, n, head_size]
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs.unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0),
                                           is_causal=True, scale=self.scale,
                                           enable_gqa=self.num_heads != self.num_kv_heads)
        out[start:start + n] = o[0].transpose(0, 1)
        return start + n
