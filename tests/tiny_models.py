"""Tiny random-weight checkpoints built offline in seconds: a byte-level BPE tokenizer trained on
a small built-in corpus, and Llama / Qwen2 models of a few hundred thousand parameters saved as
HF checkpoint directories (config.json, model.safetensors, tokenizer files)."""
from pathlib import Path

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "import torch\nx = torch.randn(4, 4)\nprint(x @ x.T)\n",
    "Once upon a time, in a land far away, there lived a curious engineer.",
    "for i in range(10):\n    print(i * i)\n",
    "The cache holds keys and values for every token that came before.",
] * 20

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_tokenizer(out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_model(out_dir: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """Saves a tiny random model of `arch` (llama or qwen2) with its tokenizer into out_dir."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(out_dir)
    common = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
                  initializer_range=0.1, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    common.update(overrides)
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **common))
    else:
        raise ValueError(arch)
    model.save_pretrained(out_dir)
    return out_dir


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int,
              dtype: torch.dtype = torch.float32) -> list[int]:
    """Greedy continuation by Hugging Face transformers (the reference): plain argmax with its
    KV cache, no logits processors (so eos is an ordinary token, as with ignore_eos). `model` is
    a checkpoint directory or an already loaded transformers model."""
    from transformers import AutoModelForCausalLM

    if isinstance(model, (str, Path)):
        model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    out, past = [], None
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(max_new_tokens):
            result = model(ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            next_id = int(result.logits[0, -1].argmax())
            out.append(next_id)
            ids = torch.tensor([[next_id]])
    return out
