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


def hf_spec_baseline(args, target_config: Any, draft_config: Any, engine_outputs: list
                     ) -> list[dict]:
    """transformers greedy generation of the engine's prompts one at a time: plain, and assisted
    generation (its speculative decoding) with the draft on the CPU proposing args.hf_k tokens a
    step. Each row says how many of its tokens equal the engine's greedy tokens."""
    device = target_config.device.type
    dummy = target_config.model_config.load_format == "dummy"
    target = load_hf_model(args.model, target_config.hf_config, target_config.torch_dtype,
                           device, dummy)
    # like ignore_eos: run to max_new_tokens without suppressing the end token
    target.generation_config.eos_token_id = None
    modes = [("plain", None)]
    if draft_config is not None:
        assistant = load_hf_model(draft_config.model_config.model, draft_config.hf_config,
                                  draft_config.torch_dtype, "cpu", dummy)
        assistant.generation_config.eos_token_id = None
        assistant.generation_config.num_assistant_tokens = args.hf_k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        modes.append((f"assisted, CPU draft, k={args.hf_k}", assistant))
    outputs = engine_outputs[:args.hf_num_prompts]
    rows = []
    for mode, assistant in modes:
        def generate(ids, n):
            return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=n, pad_token_id=0, assistant_model=assistant)
        with torch.no_grad():
            generate(torch.tensor([outputs[0].prompt_token_ids], device=device), 4)  # warm-up
            synchronize(device)
            seconds, same, total = 0.0, 0, 0
            for out in outputs:
                ids = torch.tensor([out.prompt_token_ids], device=device)
                t0 = time.perf_counter()
                new = generate(ids, args.max_tokens)[0, ids.shape[1]:].tolist()
                synchronize(device)
                seconds += time.perf_counter() - t0
                ref = list(out.outputs[0].token_ids)
                same += sum(a == b for a, b in zip(new, ref))
                total += len(ref)
        rows.append({"mode": mode, "num_prompts": len(outputs), "seconds": seconds,
                     "tokens_per_s": total / seconds, "agreement_with_engine": same / total})
    return rows
