"""The CPU decode path: a step of few rows (a draft step, a drafted batch, a CPU target's decode)
runs every decoder layer in one vllm._C call (decode_layers), so it costs the weight bytes rather
than a Python and dispatcher round trip per op. Its matmuls, and the logits', are linear_small's:
a GEMV (each weight streamed once for all rows) or register tiles where those beat torch's GEMM
(bf16 on AVX512_BF16 or in the AVX2 build up to MAX_ROWS rows, other dtypes up to 8), that GEMM
elsewhere; bf16 on AVX512_BF16 from 2 rows the tiles over a copy of the weights packed at the
first such step (VLLM_CPU_PACKED_WEIGHTS: the linear weights' bytes again in memory).
The per-op path (the model's own forward) stays the reference and runs wherever this one does
not apply: other devices, more rows, other dtypes, biases beyond Qwen2's q/k/v, partial rotary."""
from typing import Any, Optional

import torch

from vllm import _custom_ops as ops
from vllm import envs
from vllm.model_executor.layers import linear as layers_linear

# steps of more rows run the per-op path (at 40 and 64 rows, bf16, 2-core Zen 4, paired: this
# path with the register tiles 1.05-1.15x faster than the per-op path with torch's GEMM)
MAX_ROWS = 64
# steps of at least this many rows run bf16 linears on the weights' packed copies (linear.cpp's
# kPackedMinRows: Qwen2.5-0.5B forwards 1.22-1.24x faster than on the row-major weights at 2-4
# rows on an AMX Xeon, 0.97-1.01x at 4-6 on Zen 4, 1.44x at 20); a step of one row never makes
# the copies (a draft at batch 1 keeps its memory)
PACKED_MIN_ROWS = 2
DTYPES = (torch.float32, torch.bfloat16)
# where a step's time goes: set to a float64 tensor of len(ops.DECODE_STAGES) zeros, every
# decode_layers call adds each stage's milliseconds to it (benchmarks/benchmark_draft.py); None:
# nothing is timed
stage_ms: Optional[torch.Tensor] = None


def rows_apply(x: torch.Tensor) -> bool:
    """True when a [rows, features] CPU tensor takes the small-row path."""
    return (x.device.type == "cpu" and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS
            and x.dtype in DTYPES and envs.VLLM_CPU_DECODE_PATH == "fused"
            and ops.has_kernel("decode_layers", "cpu"))


def packed_copy(weight: torch.Tensor) -> torch.Tensor:
    """weight's copy packed for the packed tiles (ops.pack_linear), or an empty tensor where
    VLLM_CPU_PACKED_WEIGHTS is off or this CPU or dtype has none."""
    if not envs.VLLM_CPU_PACKED_WEIGHTS:
        return weight.new_empty(0)
    return ops.pack_linear(weight.detach())


def _packed_for(owner: Any, weight: torch.Tensor) -> torch.Tensor:
    """owner's packed copy of weight, made at its first step of PACKED_MIN_ROWS rows or more and
    again when the weight is replaced (a new storage: the key is its address)."""
    cached = getattr(owner, "_packed_weight", None)
    if cached is None or cached[0] != weight.data_ptr():
        cached = (weight.data_ptr(), packed_copy(weight))
        owner._packed_weight = cached
    return cached[1]


def _weight_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """x @ weight^T takes the small-row kernels (linear_small, linear_packed, linear_argmax)."""
    return rows_apply(x) and weight.dtype == x.dtype and weight.is_contiguous()


def _packed_rows(rows: int, weight: torch.Tensor, owner: Any) -> torch.Tensor:
    """weight's packed copy kept on owner for a step of `rows` rows from PACKED_MIN_ROWS, else an
    empty tensor (the row-major weight alone)."""
    if owner is None or rows < PACKED_MIN_ROWS:
        return weight.new_empty(0)
    return _packed_for(owner, weight)


def linear(x: torch.Tensor, weight: torch.Tensor, owner: Any = None) -> torch.Tensor:
    """x @ weight^T through linear_small when it applies (from PACKED_MIN_ROWS rows with
    weight's packed copy, kept on `owner`, when one is given), else the layers' linear (torch's
    GEMM; on an AVX2 CPU in bf16 never its bf16 one)."""
    if _weight_applies(x, weight):
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        ops.linear_packed(out, x.contiguous(), weight, _packed_rows(x.shape[0], weight, owner),
                          None)
        return out
    return layers_linear.linear(x, weight)


def argmax(x: torch.Tensor, weight: torch.Tensor, owner: Any = None) -> Optional[torch.Tensor]:
    """Each row's first maximal index of x @ weight^T (linear's logits, a NaN as the maximum)
    through linear_argmax, which makes no fp32 logits, where it applies; else None."""
    if not (_weight_applies(x, weight) and ops.has_kernel("linear_argmax", "cpu")):
        return None
    out = torch.empty(x.shape[0], dtype=torch.long)
    ops.linear_argmax(out, x.contiguous(), weight, _packed_rows(x.shape[0], weight, owner))
    return out


# _layer_weights' tensors per layer (decode_layers' order: ln1, qkv_w, qkv_b, o_w, ln2, gate_up_w,
# down_w) and the places of the four linear weights among them
_TENSORS_PER_LAYER = 7
_LINEAR_WEIGHTS = (1, 3, 5, 6)


def _layer_weights(model: Any) -> Optional[list[torch.Tensor]]:
    """The per-layer tensors decode_layers takes, or None when a layer has a piece it lacks."""
    tensors = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        rope = attn.rotary_emb
        if (attn.o_proj.bias is not None or mlp.gate_up_proj.bias is not None
                or mlp.down_proj.bias is not None or rope.rotary_dim != rope.head_size
                or not rope.is_neox_style):
            return None
        qkv_b = attn.qkv_proj.bias
        tensors += [layer.input_layernorm.weight, attn.qkv_proj.weight,
                    qkv_b if qkv_b is not None else attn.qkv_proj.weight.new_empty(0),
                    attn.o_proj.weight, layer.post_attention_layernorm.weight,
                    mlp.gate_up_proj.weight, mlp.down_proj.weight]
    return [t.detach() for t in tensors]


def _layer_packed(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """decode_layers' packed copies of each layer's qkv, o, gate_up and down weights (from
    _layer_weights' list), or none where no weight packs."""
    packed = [packed_copy(w) for i, w in enumerate(weights)
              if i % _TENSORS_PER_LAYER in _LINEAR_WEIGHTS]
    return packed if any(p.numel() > 0 for p in packed) else []


def _decode_weights(model: Any) -> Optional[list[torch.Tensor]]:
    """model's (a LlamaModel's) per-layer tensors for decode_layers, gathered once and again
    when its weights are replaced; None when a layer has a piece decode_layers lacks."""
    cached = getattr(model, "_decode_weights", None)
    key = model.layers[0].self_attn.qkv_proj.weight.data_ptr()  # weights replaced: pack again
    if cached is None or cached[0] != key:
        cached = (key, _layer_weights(model))
        model._decode_weights = cached
        model._decode_packed = None
    return cached[1]


def _decode_packed(model: Any, weights: list[torch.Tensor], rows: int) -> list[torch.Tensor]:
    """decode_layers' packed copies for a step of `rows` rows: made at the first step of
    PACKED_MIN_ROWS rows or more, none below."""
    if rows < PACKED_MIN_ROWS:
        return []
    if model._decode_packed is None:
        model._decode_packed = _layer_packed(weights)
    return model._decode_packed


def forward(model: Any, hidden: torch.Tensor, positions: torch.Tensor) -> Optional[torch.Tensor]:
    """The final norm's output for the embedded tokens `hidden`, or None when the path does not
    apply (the caller then runs the per-op layers). model: a LlamaModel."""
    if not rows_apply(hidden) or not model.layers:
        return None
    if model.layers[0].self_attn.o_proj.tp.size > 1:
        return None  # a shard's layer needs its all-reduces: the per-op path has them
    weights = _decode_weights(model)
    if weights is None or weights[1].dtype != hidden.dtype:
        return None
    from vllm.forward_context import get_forward_context
    ctx = get_forward_context()
    md = ctx.attn_metadata
    attn = model.layers[0].self_attn
    hidden = hidden.contiguous()
    ops.decode_layers(hidden, positions, weights, model.norm.weight.detach(),
                      attn.rotary_emb.cos_sin_cache, [k for k, _ in ctx.kv_caches],
                      [v for _, v in ctx.kv_caches], md.slot_mapping, md.block_tables,
                      md.context_lens, md.query_start_loc, md.max_context_len, attn.num_heads,
                      attn.num_kv_heads, attn.head_dim, model.norm.variance_epsilon,
                      attn.attn.scale, True, _decode_packed(model, weights, hidden.shape[0]),
                      stage_ms)
    return hidden


class GreedyStep:
    """A plain-greedy draft's next steps of a Llama-family model on the CPU in one native call
    (greedy_steps; the first step may catch a sequence up on several tokens, the later ones
    feed one token a sequence): each step the embedding, decode_layers (every layer and the
    final norm) and linear_argmax (the LM head's tokens), whose tokens feed the next step; the
    same ops and bits as that many steps of the model's forward and compute_argmax on this
    path, without the Python between them (a draft's loop spent ~0.25 ms of a 0.9 ms step in
    it on a 2-core Xeon, a 20M draft). A call returns None where the path does not apply (more
    than MAX_ROWS rows, VLLM_CPU_DECODE_PATH=native, a dtype it lacks); nothing has run then."""

    def __init__(self, model: Any, kv_caches: list) -> None:
        self.model = model
        self.head = model.output_head()
        self.key_caches = [k for k, _ in kv_caches]
        self.value_caches = [v for _, v in kv_caches]
        # (the weights' key, the op's arguments that only change with the weights or None where
        # the path cannot run them, the head's weight, an empty tensor: no packed head): see
        # _arguments
        self._arguments_of: Optional[tuple] = None

    @staticmethod
    def build(model: Any, kv_caches: list) -> Optional["GreedyStep"]:
        """A GreedyStep for model and its KV caches, or None where this path never runs (not a
        Llama-family model, a shard, not on the CPU, no greedy_steps kernel)."""
        from vllm.model_executor.models.llama import LlamaForCausalLM
        if not isinstance(model, LlamaForCausalLM) or not model.model.layers:
            return None
        embed = model.model.embed_tokens
        if (embed.weight.device.type != "cpu" or embed.tp.size > 1
                or model.model.layers[0].self_attn.o_proj.tp.size > 1
                or not ops.has_kernel("greedy_steps", "cpu")):
            return None
        return GreedyStep(model, kv_caches)

    def _arguments(self) -> tuple[Optional[tuple], torch.Tensor, torch.Tensor]:
        """(greedy_steps' arguments that change only with the weights: the embedding, the
        layers' weights, the final norm, the rotary cache, the heads' counts and size, the
        epsilon, the scale and is_neox; or None where this path cannot run these weights, the
        LM head's weight, an empty tensor of its dtype), gathered again when a weight's storage
        changes: a small draft's call spent ~65 us of a ~0.95 ms first forward on its Python
        (2 cores), most of it in such small calls."""
        inner = self.model.model
        weights = _decode_weights(inner)  # itself cached, and gathered again on new storage
        key = (id(weights), inner.embed_tokens.weight.data_ptr(), self.head.weight.data_ptr())
        if self._arguments_of is None or self._arguments_of[0] != key:
            embedding, head = inner.embed_tokens.weight.detach(), self.head.weight.detach()
            attn = inner.layers[0].self_attn
            args = None
            if (weights is not None and embedding.dtype in DTYPES
                    and weights[1].dtype == embedding.dtype == head.dtype
                    and head.is_contiguous() and ops.has_kernel("decode_layers", "cpu")):
                args = (embedding, weights, inner.norm.weight.detach(),
                        attn.rotary_emb.cos_sin_cache, attn.num_heads, attn.num_kv_heads,
                        attn.head_dim, inner.norm.variance_epsilon, attn.attn.scale, True)
            self._arguments_of = (key, args, head, head.new_empty(0))
        return self._arguments_of[1:]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 block_tables: torch.Tensor, steps: int = 1,
                 query_start_loc: Optional[torch.Tensor] = None,
                 step_ms: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The greedy tokens [steps, rows] after input_ids at positions (int64 [rows], one token
        a sequence; or [tokens] with query_start_loc int32 [rows + 1]: a sequence's tokens
        whose KV is missing, at consecutive positions, fed in the first step; block_tables int32
        [rows, blocks] covering every position the steps write), or None where this path does
        not apply. step_ms: none, or float64 [steps] that gets each step's ms (greedy_steps)."""
        rows, first_rows = block_tables.shape[0], input_ids.shape[0]
        if not (0 < first_rows <= MAX_ROWS and envs.VLLM_CPU_DECODE_PATH == "fused"):
            return None
        args, head, unpacked = self._arguments()
        if args is None:
            return None
        head_packed = unpacked if rows < PACKED_MIN_ROWS else _packed_for(self.head, head)
        tokens = torch.empty(steps, rows, dtype=torch.long)
        ops.greedy_steps(tokens, input_ids, positions, args[0], args[1], args[2], args[3],
                         self.key_caches, self.value_caches, block_tables, *args[4:],
                         _decode_packed(self.model.model, args[1], first_rows), head,
                         head_packed, stage_ms, query_start_loc, step_ms)
        return tokens
