"""Why a synchronous CPU draft's first forward costs more than a warm one (issue 10). In run 33
(H100 host, 14 draft threads, the trained 13B pair at k = 1) a synchronous proposal's one
forward took 0.69 ms, where the drafting-ahead rows' first forwards (back to back) took 0.21.
Between two synchronous proposals the drafter idles for a verification (~10 ms, its threads
spinning), and most proposals catch up on two tokens (the last draft and the bonus token),
which run the linears on the packed weight copies, while one-token steps read the row-major
weights: the two sets together may not stay in the cores' caches.

This times GreedyStep first steps of a draft-20m-shaped model (random bf16 weights) with one
and two tokens, and the two alternating as at k = 1: back to back, after an idle of
`--sleep-ms` (the verification), and after that idle with a one-token forward `--warm-ms`
before the call (would a keep-warm step help?), with the packed copies used from two rows (the
default) or never. Medians in ms of `--calls` calls, the cells in turns, `--passes` passes.
(Run 34, the H100 machine's host at 14 threads: the idle cost 0.07-0.2 ms of a 0.26-0.33 ms
step and a forward 2 ms before won back half at most; a keep-warm built on it did not shorten
the engine's first forward and was reverted: benchmarks/RESULTS.md.)
Usage: python benchmarks/lab/draft_idle_lab.py [--threads N] [--sleep-ms 10] [--warm-ms 2,0.5]
       [--busy-wait] [--calls 60]"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# the drafter's OpenMP threads spin as long as its spin window (draft_process.gomp_spin_count)
os.environ.setdefault("GOMP_SPINCOUNT", str(int(0.05 / 11e-9)))

import torch  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from benchmarks.model_shapes import SHAPES  # noqa: E402
from vllm.model_executor import cpu_decode  # noqa: E402
from vllm.model_executor.models.llama import LlamaForCausalLM  # noqa: E402

BLOCK = 16


def build(context: int):
    config = LlamaConfig(max_position_embeddings=4096, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, **SHAPES["draft-20m"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.02 + ("norm" in name))
    model = model.to(torch.bfloat16).eval()
    blocks = -(-(context + 64) // BLOCK)
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    caches = [(torch.randn(blocks + 1, heads, BLOCK, dim).to(torch.bfloat16),
               torch.randn(blocks + 1, heads, BLOCK, dim).to(torch.bfloat16))
              for _ in range(config.num_hidden_layers)]
    tables = torch.arange(1, blocks + 1, dtype=torch.int32)[None]
    return model, caches, tables


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sleep-ms", type=float, default=10.0)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--warm-ms", type=lambda v: [float(x) for x in v.split(",")],
                        default=[2.0, 0.5])
    parser.add_argument("--busy-wait", action="store_true",
                        help="the calling thread polls the clock between calls instead of "
                             "sleeping (the drafter's main thread polls its pipe)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, caches, tables = build(args.context)
    step = cpu_decode.GreedyStep.build(model, caches)
    packed_rows = cpu_decode.PACKED_MIN_ROWS

    def call(tokens: int) -> float:
        ids = torch.randint(0, 32000, (tokens,))
        positions = torch.arange(args.context, args.context + tokens)
        starts = None if tokens == 1 else torch.tensor([0, tokens], dtype=torch.int32)
        start = time.perf_counter()
        step(ids, positions, tables, 1, starts)
        return time.perf_counter() - start

    def wait(ms: float) -> None:
        if args.busy_wait:
            until = time.perf_counter() + ms / 1e3
            while time.perf_counter() < until:
                pass
        elif ms:
            time.sleep(ms / 1e3)

    # waits before a timed call: none (back to back), the verification's idle, or the idle with
    # a one-token forward (a keep-warm step) `warm` ms before the call
    idle = args.sleep_ms
    waits = {"back to back": (0.0, None), f"idle {idle:g} ms": (idle, None)}
    for warm in args.warm_ms:
        waits[f"idle, a forward {warm:g} ms before"] = (idle - warm, warm)
    patterns = {"1 token": [1], "2 tokens": [2], "2, 1 alternating": [2, 1]}
    cells = [(p, w, packed) for p in patterns for w in waits for packed in (True, False)]
    times = {c: [] for c in cells}
    with torch.inference_mode():
        for _ in range(args.passes):
            for cell in cells:
                pattern, w, packed = cell
                cpu_decode.PACKED_MIN_ROWS = packed_rows if packed else 1 << 30
                before, warm = waits[w]
                for i in range(args.calls + 4):
                    wait(before)
                    if warm is not None:
                        call(1)
                        wait(warm)
                    t = call(patterns[pattern][i % len(patterns[pattern])])
                    if i >= 4:
                        times[cell].append(t)
    cpu_decode.PACKED_MIN_ROWS = packed_rows
    print(f"draft-20m, bf16, {args.threads} threads, context {args.context}, "
          f"{'busy-waiting' if args.busy_wait else 'sleeping'}: ms a first step "
          f"(median of {args.calls} x {args.passes}; packed / row-major linears)")
    for pattern in patterns:
        cols = []
        for w in waits:
            ms = [1e3 * statistics.median(times[(pattern, w, packed)]) for packed in (True, False)]
            cols.append(f"{w} {ms[0]:.3f} / {ms[1]:.3f}")
        print(f"  {pattern:>16}: " + "; ".join(cols), flush=True)


if __name__ == "__main__":
    main()
