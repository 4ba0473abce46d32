"""Checkpoint directories of real model shapes with no weights (config.json plus a tiny offline
tokenizer), for timing with --load-format dummy where real checkpoints cannot be had.

    python -m benchmarks.model_shapes llama-2-7b OUT_DIR"""
import json
import sys
from pathlib import Path

SHAPES = {
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "llama-2-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                        num_attention_heads=40, num_key_value_heads=40, vocab_size=32000),
    "codellama-34b": dict(hidden_size=8192, intermediate_size=22016, num_hidden_layers=48,
                          num_attention_heads=64, num_key_value_heads=8, vocab_size=32000),
    # the trained pair's draft (benchmarks/trained_pair.py): 19.8M parameters
    "draft-20m": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=32000),
    # SmolLM2-135M: GQA 9/3 heads of 64, tied embeddings
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         tie_word_embeddings=True),
    "llama-68m": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
                      num_attention_heads=12, num_key_value_heads=12, vocab_size=32000),
    # CPU tests of benchmarks/trained_pair.py (--tiny): GQA, head_dim 32
    "tiny-wide": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=512),
}


def write_shape_dir(name: str, out_dir: str) -> Path:
    from tests.tiny_models import build_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                  max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=1,
                  eos_token_id=2)
    config.update(SHAPES[name])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    build_tokenizer(out)  # prompts are token ids; the tokenizer only satisfies the engine
    return out


if __name__ == "__main__":
    print(write_shape_dir(sys.argv[1], sys.argv[2]))
