"""The Hugging Face transformers baseline: eager greedy generation of the same shapes, timed the
same way as the engine (prefill-only run vs full run, the difference per decode step)."""
import time
from typing import Any

import torch

from benchmarks.timing import synchronize


def load_hf_model(model: str, hf_config: Any, dtype: torch.dtype, device: str, dummy: bool):
    from transformers import AutoModelForCausalLM

    if dummy:
        with torch.device(device):
            return AutoModelForCausalLM.from_config(hf_config, dtype=dtype).eval()
    if model.endswith(".gguf"):
        import os
        return AutoModelForCausalLM.from_pretrained(
            os.path.dirname(model), gguf_file=os.path.basename(model),
            dtype=dtype).to(device).eval()
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()


def hf_generate_latency(hf_model, batch_size: int, input_len: int, output_len: int,
                        device: str, iters: int) -> list[float]:
    """Seconds per greedy generate() of output_len new tokens for batch_size random prompts."""
    vocab = hf_model.config.vocab_size
    ids = torch.randint(0, vocab, (batch_size, input_len), device=device)
    times = []
    with torch.no_grad():
        for _ in range(iters + 1):  # the first is a warm-up
            synchronize(device)
            t0 = time.perf_counter()
            hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=output_len, min_new_tokens=output_len,
                              pad_token_id=0)
            synchronize(device)
            times.append(time.perf_counter() - t0)
    return times[1:]
