"""The Llama family (Llama 2/3, Mistral, SmolLM2; Qwen2 adds q/k/v biases): decoder layers of
RMSNorm -> attention (fused qkv, rotary, paged KV) -> RMSNorm -> gated MLP, residual fused into the
norms. Weights load from HF names; q/k/v and gate/up are fused into one matmul each. Under tensor
parallelism each rank holds its heads and its share of the MLP (layers/linear.py) and of the
vocabulary (layers/vocab_parallel_embedding.py); o_proj and down_proj sum over ranks."""
from typing import Any, Iterable, Optional

import torch
from torch import nn

from vllm.model_executor import cpu_decode
from vllm.model_executor.attention.layer import Attention
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                               RowParallelLinear)
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
from vllm.model_executor.layers.vocab_parallel_embedding import (ParallelLMHead,
                                                                 VocabParallelEmbedding)


def rope_settings(config: Any) -> tuple[float, Optional[dict]]:
    """(rope_theta, rope_scaling) across transformers' old and new config layouts."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    scaling = getattr(config, "rope_scaling", None) or params
    return float(theta), scaling if scaling.get("rope_type", scaling.get("type")) else None


class LlamaAttention(nn.Module):

    def __init__(self, config: Any, layer_idx: int, qkv_bias: bool) -> None:
        super().__init__()
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, num_heads,
                                          num_kv_heads, bias=qkv_bias)
        # this rank's heads (all of them with one rank)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(num_heads * self.head_dim, config.hidden_size,
                                        bias=getattr(config, "attention_bias", False)
                                        and not qkv_bias)
        theta, scaling = rope_settings(config)
        self.rotary_emb = RotaryEmbedding(self.head_dim, self.head_dim,
                                          config.max_position_embeddings, theta, True,
                                          torch.get_default_dtype(), scaling)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5,
                              self.num_kv_heads, layer_idx)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return self.o_proj(self.attn(q, k, v, positions, self.rotary_emb))


class LlamaMLP(nn.Module):

    def __init__(self, config: Any) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], bias)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):

    def __init__(self, config: Any, layer_idx: int, qkv_bias: bool) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, qkv_bias)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):

    def __init__(self, config: Any, qkv_bias: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(config, i, qkv_bias) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        fused = cpu_decode.forward(self, hidden, positions)  # a CPU step of few rows
        if fused is not None:
            return fused
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    qkv_bias = False
    # HF name piece -> (fused parameter piece, shard index)
    stacked_params = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1),
                      "v_proj": ("qkv_proj", 2), "gate_proj": ("gate_up_proj", 0),
                      "up_proj": ("gate_up_proj", 1)}

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, self.qkv_bias)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def output_head(self) -> nn.Module:
        """The module whose weight makes the logits: the LM head, or the tied embedding."""
        return self.model.embed_tokens if self.tie_word_embeddings else self.lm_head

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [num_rows, hidden_size] -> fp32 logits [num_rows, vocab_size]."""
        return self.output_head().compute_logits(hidden)

    def compute_argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """argmax_rows(compute_logits(hidden)): greedy tokens, without fp32 logits on the CPU."""
        return self.output_head().compute_argmax(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named weights in (a sharded layer's weight_loader keeps this rank's slice);
        every parameter, and every part of a fused one, must be covered exactly once."""
        params = dict(self.named_parameters())
        owners = {f"{m}.{p}" if m else p: module for m, module in self.named_modules()
                  for p, _ in module.named_parameters(recurse=False)}
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            target, part = name, None
            for piece, (fused, index) in self.stacked_params.items():
                if f".{piece}." in name:
                    target, part = name.replace(piece, fused), index
                    break
            if target not in params:
                raise ValueError(f"checkpoint weight {name!r} matches no parameter of "
                                 f"{type(self).__name__}")
            param = params[target]
            loader = getattr(owners[target], "weight_loader", None)
            try:
                if loader is not None:
                    loader(param, tensor, part)
                elif param.shape != tensor.shape:
                    raise ValueError(f"has shape {tuple(tensor.shape)}, expected "
                                     f"{tuple(param.shape)}")
                else:
                    param.data.copy_(tensor)
            except ValueError as e:
                raise ValueError(f"checkpoint weight {name!r} {e}") from None
            loaded.add(target if part is None else f"{target}#{part}")
        parts = {}
        for fused, index in self.stacked_params.values():
            parts.setdefault(fused, []).append(index)
        expected = set()
        for n in params:
            fused = next((f for f in parts if f".{f}." in n), None)
            expected |= {n} if fused is None else {f"{n}#{i}" for i in parts[fused]}
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} weight(s), e.g. {missing[:3]}")


class MistralForCausalLM(LlamaForCausalLM):
    pass
