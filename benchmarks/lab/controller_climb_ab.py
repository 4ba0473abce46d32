"""`make demo`'s goodput controller against fixed k and against another version of itself, in
turns: `make demo`'s pair and prompts (Qwen2.5-Coder-1.5B target, 0.5B draft, both on the CPU,
batch 4, greedy) generated with plain decoding, each fixed k, the engine's controller (`now`, a
fresh one each run, as in `make demo`) and, with BEFORE=path, the controller of another
goodput.py (`before`; e.g. `git show REV:vllm/spec_decode/goodput.py > f`). One engine; every
mode runs once a round, the order reversed every other round; tokens/s summed over the rounds,
and each controller run's steps (k: ms) printed.

    python benchmarks/lab/controller_climb_ab.py [ROUNDS] [MAX_TOKENS] [KS]
Environment: MODES (comma list of plain, k1.., now, before; default all), BEFORE."""
import importlib.util
import inspect
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]
from vllm import huge_pages  # noqa: E402

huge_pages.request()
from cpu_draft_spec_decode import PROMPTS  # noqa: E402  (make demo's)
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.model_loader.fetch import fetch_model  # noqa: E402
from vllm.spec_decode.goodput import TRACE_FIELDS  # noqa: E402


def before_controller(path: str, max_k: int):
    """A controller from another version of goodput.py (BEFORE=path, e.g. `git show
    REV:vllm/spec_decode/goodput.py > f`), made as the engine makes a CPU target's; the
    arguments it does not know are dropped."""
    spec = importlib.util.spec_from_file_location("goodput_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known = inspect.signature(module.GoodputController.decide).parameters

    class Before(module.GoodputController):
        def decide(self, *args, **kwargs):
            return super().decide(*args[:len(known) - 1],
                                  **{k: v for k, v in kwargs.items() if k in known})

    return Before(max_k, explore_upward=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    ks = [int(k) for k in (sys.argv[3] if len(sys.argv) > 3 else "1,2,3,4").split(",")]
    default = ["plain"] + [f"k{k}" for k in ks] + ["now"] + ["before"] * ("BEFORE" in os.environ)
    modes = os.environ.get("MODES", ",".join(default)).split(",")
    llm = LLM(str(fetch_model("qwen2.5-coder-1.5b-instruct")),
              speculative_model=str(fetch_model("qwen2.5-coder-0.5b-instruct")),
              cpu_draft_worker=True, num_speculative_tokens=max(ks),
              speculative_draft_dtype="bfloat16", dtype="bfloat16", max_model_len=1024,
              max_num_seqs=8)
    engine = llm.llm_engine
    proposer = engine.proposer
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    seconds = dict.fromkeys(modes, 0.0)
    tokens = dict.fromkeys(modes, 0)
    hist: dict = {m: [0] * (max(ks) + 1) for m in modes}
    outputs: dict = {}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            engine.proposer = None if mode == "plain" else proposer
            engine.spec.controller = None
            if mode.startswith("k"):
                engine.spec_config.num_speculative_tokens = int(mode[1:])
            elif mode != "plain":
                engine.spec_config.num_speculative_tokens = max(ks)
                engine.spec.controller = (engine.spec.make_controller(max(ks)) if mode == "now"
                                          else before_controller(os.environ["BEFORE"], max(ks)))
            start = time.perf_counter()
            outs = llm.generate(PROMPTS, params, use_tqdm=False)
            seconds[mode] += time.perf_counter() - start
            tokens[mode] += sum(len(o.outputs[0].token_ids) for o in outs)
            ids = [o.outputs[0].token_ids for o in outs]
            for ref in dict.fromkeys((modes[0], mode)):  # against the first mode and itself
                first = outputs.setdefault(ref, ids)
                for j, (a, b) in enumerate(zip(first, ids)):
                    if a != b:  # greedy: equal but for bf16's near-ties between row counts
                        at = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), None)
                        print(f"  {mode}: prompt {j} differs from {ref}'s first run from token "
                              f"{at}", flush=True)
            ctrl = engine.spec.controller
            if ctrl is not None:
                hist[mode] = [a + b for a, b in zip(hist[mode], ctrl.k_histogram)]
                steps = [dict(zip(TRACE_FIELDS, t)) for t in ctrl.trace]
                print(f"  {mode} steps (k:ms): " + " ".join(
                    f"{s['k']}:{1e3 * s['step_s']:.0f}" for s in steps), flush=True)
            print(f"round {r + 1} {mode:<8} {tokens[mode] / seconds[mode]:6.1f} tok/s so far",
                  flush=True)
    engine.proposer, engine.spec.controller = proposer, None
    base = tokens["plain"] / seconds["plain"] if "plain" in modes else None
    print(f"batch {len(PROMPTS)}, {max_tokens} tokens, {rounds} rounds in turns")
    for mode in modes:
        rate = tokens[mode] / seconds[mode]
        ratio = f"{rate / base:5.2f}x plain" if base else ""
        extra = f"  k steps {hist[mode]}" if mode in ("now", "before") else ""
        print(f"  {mode:<8} {rate:6.1f} tok/s {ratio}{extra}")


if __name__ == "__main__":
    main()
