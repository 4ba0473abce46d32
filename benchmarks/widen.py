"""Widen a small trained Llama ("core") into a large Llama shape so that the large model computes
the core's function up to small noise (benchmarks/trained_pair.py; benchmarks/METHOD.md).

Every wide parameter starts as noise N(0, noise_std); the core is then written into a corner:

- embed_tokens[:, :h] and lm_head[:, :h] = the core's (h = core hidden, H = wide hidden).
- Core layer i goes to wide layer round(i * L_wide / L_core); the other wide layers stay all noise
  (their outputs are ~noise-sized, so they add ~nothing to the residual stream).
- Attention heads: core KV head t goes to wide KV head T_t = t * (kv_wide // kv_core); core query
  head j of KV group g (index r within it) goes to wide query head S_j = T_g * G_wide + r (G: query
  heads per KV group). For an MHA core that is one core head per wide KV group, in the group's
  first query head; for MHA wide shapes S_j = T_j = j * (heads_wide // heads_core). Rows / columns
  of a head are copied whole, so RoPE (applied per head) acts identically. In a GQA shape the
  other query heads of a group that holds a core KV head read the core's real k/v (noise queries:
  near-uniform attention) through noise o_proj columns, the largest noise path (tests: ~2% logit
  error on a random core, against ~0.1% for MHA).
- MLP: gate/up[:I_core, :h] and down[:h, :I_core] = the core's.
- RMSNorm weights (input, post-attention, final): the first h entries = core * sqrt(h/H), the rest
  = sqrt(h/H) (a constant, not noise). The residual lives in the first h dims, so its RMS over H
  dims is sqrt(h/H) times the core's; the factor undoes that. RMSNorm adds eps to the mean square,
  so this is exact only when the core was trained with eps_core = eps_wide * H / h, which
  trained_pair.py does (core_eps below).

With noise_std = 0 the wide model equals the core exactly (up to rounding): extra heads see q = k
= v = 0 and o_proj = 0, extra MLP units see silu(0) * 0, unplaced layers are identities.

Also here: the config.json / LlamaConfig of the checkpoints, building a transformers model of one,
and saving bf16 safetensors checkpoints (sharded with an index, as Hugging Face does).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

WIDE_EPS = 1e-5


def _get(cfg, key, default=None):
    value = cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)
    return default if value is None else value


def dims(cfg) -> dict:
    hidden, heads = _get(cfg, "hidden_size"), _get(cfg, "num_attention_heads")
    return dict(hidden=hidden, inter=_get(cfg, "intermediate_size"), heads=heads,
                layers=_get(cfg, "num_hidden_layers"), vocab=_get(cfg, "vocab_size"),
                kv=_get(cfg, "num_key_value_heads", heads),
                head_dim=_get(cfg, "head_dim", hidden // heads))


def core_eps(wide_eps: float, core_hidden: int, wide_hidden: int) -> float:
    """The RMSNorm eps a core must be trained with so that widening is exact at noise 0."""
    return wide_eps * wide_hidden / core_hidden


def layer_map(core_layers: int, wide_layers: int) -> list[int]:
    """Wide layer index of each core layer: round(i * L_wide / L_core), half up."""
    assert core_layers <= wide_layers, (core_layers, wide_layers)
    placed = [(2 * i * wide_layers + core_layers) // (2 * core_layers) for i in range(core_layers)]
    assert len(set(placed)) == core_layers and placed[-1] < wide_layers
    return placed


def head_slots(core, wide) -> tuple[list[int], list[int]]:
    """(wide query head of each core query head, wide KV head of each core KV head)."""
    c, w = dims(core), dims(wide)
    g_core, g_wide = c["heads"] // c["kv"], w["heads"] // w["kv"]
    assert c["kv"] <= w["kv"] and g_core <= g_wide, (
        f"core heads {c['heads']}/{c['kv']} kv do not fit one per KV group into wide "
        f"{w['heads']}/{w['kv']}")
    kv_slots = [t * (w["kv"] // c["kv"]) for t in range(c["kv"])]
    q_slots = [kv_slots[j // g_core] * g_wide + j % g_core for j in range(c["heads"])]
    return q_slots, kv_slots


def check_fits(core, wide) -> None:
    """AssertionError unless `core` can be widened into `wide` (call before training)."""
    c, w = dims(core), dims(wide)
    assert c["head_dim"] == w["head_dim"], f"head_dim differs: core {c['head_dim']}, wide {w}"
    assert c["vocab"] == w["vocab"] and c["hidden"] <= w["hidden"], (c, w)
    assert c["inter"] <= w["inter"] and c["layers"] <= w["layers"], (c, w)
    head_slots(core, wide)


def widen(core_state_dict: dict, core_config, wide_config, noise_std: float,
          generator: torch.Generator, dtype: torch.dtype | None = None) -> dict:
    """The wide model's state dict (HF LlamaForCausalLM names) on generator.device, in `dtype`
    (default: the core's). Pure torch: on a GPU a 7B widening takes seconds (bf16: 13.5 GB)."""
    check_fits(core_config, wide_config)
    c, w = dims(core_config), dims(wide_config)
    d, h, H = c["head_dim"], c["hidden"], w["hidden"]
    device = generator.device
    dtype = dtype or next(iter(core_state_dict.values())).dtype
    scale = math.sqrt(h / H)
    q_slots, kv_slots = head_slots(core_config, wide_config)

    def noise(*shape):
        if not noise_std:
            return torch.zeros(shape, device=device, dtype=dtype)
        return torch.randn(shape, generator=generator, device=device, dtype=dtype).mul_(noise_std)

    def core(name):
        return core_state_dict[name].to(device=device, dtype=dtype)

    def norm(name=None):
        out = torch.full((H,), scale, device=device, dtype=dtype)
        if name is not None:
            out[:h] = core(name).mul(scale)
        return out

    out = {}
    out["model.embed_tokens.weight"] = noise(w["vocab"], H)
    out["model.embed_tokens.weight"][:, :h] = core("model.embed_tokens.weight")
    placed = {wi: ci for ci, wi in enumerate(layer_map(c["layers"], w["layers"]))}
    for i in range(w["layers"]):
        p, ci = f"model.layers.{i}.", placed.get(i)
        shapes = {"self_attn.q_proj": (w["heads"] * d, H), "self_attn.k_proj": (w["kv"] * d, H),
                  "self_attn.v_proj": (w["kv"] * d, H), "self_attn.o_proj": (H, w["heads"] * d),
                  "mlp.gate_proj": (w["inter"], H), "mlp.up_proj": (w["inter"], H),
                  "mlp.down_proj": (H, w["inter"])}
        layer = {p + k + ".weight": noise(*s) for k, s in shapes.items()}
        cp = None if ci is None else f"model.layers.{ci}."
        for k in ("input_layernorm", "post_attention_layernorm"):
            layer[p + k + ".weight"] = norm(None if cp is None else cp + k + ".weight")
        if cp is not None:
            wide_w = lambda k: layer[p + k + ".weight"]  # noqa: E731
            core_w = lambda k: core(cp + k + ".weight")  # noqa: E731
            q, o = core_w("self_attn.q_proj"), core_w("self_attn.o_proj")
            for j, s in enumerate(q_slots):
                wide_w("self_attn.q_proj")[s * d:(s + 1) * d, :h] = q[j * d:(j + 1) * d]
                wide_w("self_attn.o_proj")[:h, s * d:(s + 1) * d] = o[:, j * d:(j + 1) * d]
            for k in ("self_attn.k_proj", "self_attn.v_proj"):
                src = core_w(k)
                for t, s in enumerate(kv_slots):
                    wide_w(k)[s * d:(s + 1) * d, :h] = src[t * d:(t + 1) * d]
            for k in ("mlp.gate_proj", "mlp.up_proj"):
                wide_w(k)[:c["inter"], :h] = core_w(k)
            wide_w("mlp.down_proj")[:h, :c["inter"]] = core_w("mlp.down_proj")
        out.update(layer)
    out["model.norm.weight"] = norm("model.norm.weight")
    out["lm_head.weight"] = noise(w["vocab"], H)
    out["lm_head.weight"][:, :h] = core("lm_head.weight")
    return out


def llama_config(hidden, intermediate, layers, heads, kv_heads, vocab, head_dim=None,
                 eps=WIDE_EPS) -> dict:
    """config.json of a Llama checkpoint (also the kwargs of LlamaConfig)."""
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads,
                head_dim=head_dim or hidden // heads, vocab_size=vocab,
                max_position_embeddings=4096, rms_norm_eps=eps, rope_theta=10000.0,
                tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)


def build_model(config: dict, device, dtype=torch.float32, seed: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    kwargs = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    cfg = LlamaConfig(attn_implementation="sdpa", **kwargs)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old)


def save_checkpoint(out_dir, state_dict, config, tokenizer, shard_bytes=None):
    """bf16 safetensors; with shard_bytes: shards of at most that size plus an index."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)
    names, shards, size = list(state_dict), [[]], 0
    for n in names:
        nbytes = state_dict[n].numel() * 2
        if shard_bytes and shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(n)
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = (f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if shard_bytes
                else "model.safetensors")
        save_file({n: state_dict[n].to("cpu", torch.bfloat16).contiguous() for n in shard},
                  str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    if shard_bytes:
        total = sum(t.numel() * 2 for t in state_dict.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out
