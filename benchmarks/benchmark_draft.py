"""The CPU draft's forward, alone: milliseconds per one-token draft forward (the loop the draft
worker runs k times per step) against its floor (the draft's weights plus its KV at the timed
forwards' mean context, over the host memory bandwidth measured with the same thread count),
per model shape, dtype, thread count,
batch size and CPU decode path (fused: one decode_layers call per step; native: one op per layer
piece), with the share of the time spent outside the GEMMs (1 - the time of the step's matmuls
alone, run back to back, over the forward's), the fused path's time by stage of its
decode_layers call (the norms, each linear, rotary and cache write, attention, the activation;
with VLLM_CPU_DECODE_FOLD's folds an op is timed in the loop it runs in: rotary and the cache
write in attention, and on the packed tiles the norms in qkv and gate/up, silu in gate/up; of
the rest of the forward, the input building (positions, slots) and the LM head (linear_argmax,
the greedy tokens), and what is left: the embedding and the Python around the calls; a forward
inside greedy_steps (VLLM_CPU_GREEDY_STEP) builds its inputs and runs its LM head in that call,
counted in what is left), the thread
count the draft picks at start-up, and the top ops from torch's profiler on request. A summary
table comes last. --settings times settings of the kernels' environment variables in turns,
so that an A/B shares the host's drift (a row per setting); the batch sizes take turns the same
way (each its own sequences), so that batch b's time over batch 1's does too. A turn is a block
of --turn-block timed forwards after an untimed one of the same turn (time_forwards).

    python benchmarks/benchmark_draft.py --model DRAFT[,DRAFT2] [--load-format dummy] \
        [--dtypes float32,bfloat16] [--threads 1,4,16] [--batch-sizes 1,8] \
        [--paths fused,native] [--context 256 [--hold-context]] [--profile] \
        [--settings 'team:VLLM_CPU_DECODE_TEAM=1;no team:VLLM_CPU_DECODE_TEAM=0']"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import types


# torch's CPU allocations on huge pages, as in the engine's own processes (vllm/huge_pages.py)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floors import step_floor_ms  # noqa: E402
from benchmarks.model_shapes import write_shape_dir  # noqa: E402
from benchmarks.plot_args import add_plot_args, plot_run  # noqa: E402
from benchmarks.timing import copy_bandwidth_gbps, provenance, write_json  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402
from vllm.core.request import Request  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.engine.tokenizer import get_tokenizer  # noqa: E402
from vllm.model_executor import cpu_decode  # noqa: E402
from vllm.model_executor.model_loader.loader import resolve_config  # noqa: E402
from vllm.spec_decode.draft_worker import DraftModelProposer  # noqa: E402
from vllm.worker import cpu_threads  # noqa: E402


def make_draft(args, model: str, dtype: str) -> DraftModelProposer:
    """The draft worker exactly as the engine builds it (on the CPU), for a target that is the
    draft itself; its thread count is set per row here (the start-up pick is measured apart)."""
    engine_args = EngineArgs(model=model, device="cpu", dtype=dtype,
                             load_format=args.load_format,
                             max_model_len=(args.context + 16 + args.num_forwards * args.steps
                                            * len(parse_settings(args.settings))),
                             max_num_seqs=sum(args.batch_sizes),  # all live at once
                             speculative_model=model, num_speculative_tokens=1,
                             cpu_draft_worker=True, speculative_draft_dtype=dtype,
                             speculative_draft_threads=1)
    config = resolve_config(engine_args.create_engine_config())
    return DraftModelProposer(config, get_tokenizer(config.model_config))


def shape_draft(shape: str, threads: int, context: int, steps: int) -> DraftModelProposer:
    """A draft worker of a benchmarks/model_shapes.py shape (dummy bf16 weights, in a temporary
    folder) for the labs' held batches of 1 and 8 sequences, at `threads` threads."""
    model = os.path.join(tempfile.mkdtemp(), shape)
    write_shape_dir(shape, model)
    args = types.SimpleNamespace(load_format="dummy", context=context, num_forwards=64,
                                 steps=steps, settings="default", batch_sizes=[1, 8])
    draft = make_draft(args, model, "bfloat16")
    torch.set_num_threads(threads)  # after the draft's own start-up pick
    return draft


def parse_settings(text: str) -> list[tuple[str, dict]]:
    """--settings: ';'-separated settings, each an optional "LABEL:" and ','-joined VAR=value
    pairs ("" or "default": none), e.g. "team:VLLM_CPU_DECODE_TEAM=1;VLLM_CPU_DECODE_TEAM=0";
    (label, {VAR: value}) each, the label the pairs themselves where none is given."""
    settings = []
    for item in text.split(";"):
        label, colon, pairs = item.partition(":")
        if not colon:
            label, pairs = "", item
        setting = {}
        for pair in pairs.split(","):
            pair = pair.strip()
            if not pair or pair == "default":
                continue
            name, sep, value = pair.partition("=")
            if not sep or not name:
                raise ValueError(f"--settings: expected VAR=value, got {pair!r}")
            setting[name] = value
        settings.append((label.strip() or
                         ",".join(f"{k}={v}" for k, v in setting.items()) or "default", setting))
    return settings


def restore_environ(saved: dict) -> None:
    """Each variable of saved ({VAR: value or None}) back to its value (None: unset)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def mean_context(args) -> int:
    """The timed forwards' mean context: args.context, and the tokens the calls before each
    timed one drafted into its batch's sequences (every setting's, the untimed ones', args.steps
    a call; schedule_of), averaged over the timed calls."""
    if args.hold_context:
        return args.context + args.steps // 2  # each call's forwards read context + 0..steps-1
    settings = len(parse_settings(args.settings))
    sizes = len(getattr(args, "batch_sizes", None) or [1])
    schedule = schedule_of(sizes * settings, args.warmup, args.num_forwards,
                           getattr(args, "turn_block", 0))
    done = [0] * sizes  # calls each batch's sequences have had
    reads = []
    for which, timed in schedule:
        batch = which // settings
        if timed:
            reads.append(done[batch])
        done[batch] += 1
    return args.context + args.steps * sum(reads) // max(len(reads), 1)


def hold_context(draft: DraftModelProposer, reqs: list, context: int) -> None:
    """--hold-context: each sequence back to its context and the token drawn after it, the KV of
    the context kept, so that the next call's forwards run where this call's did (their KV
    slots written again) and every timed forward reads the same context."""
    for req in reqs:
        seq = draft.seqs[req.req_id]
        del seq.token_ids[context + 1:]
        seq.num_computed_tokens = context


def turns_of(batch_sizes: list[int], settings: list) -> list[tuple[int, tuple]]:
    """time_forwards' turns, batch-major: (batch size, setting) for each size, each setting."""
    return [(bs, setting) for bs in batch_sizes for setting in settings]


def turn_of(i: int, turns: int) -> int:
    """The turn forward i runs: cycles of the turns in order, every other one reversed."""
    cycle, pos = divmod(i, turns)
    return pos if cycle % 2 == 0 else turns - 1 - pos


def schedule_of(turns: int, warmup: int, num_forwards: int, block: int) -> list[tuple[int, bool]]:
    """time_forwards' forwards, (turn, timed) each: warmup untimed forwards a turn, turn by
    turn, then num_forwards - warmup timed ones a turn, in blocks of block forwards of one turn,
    each block after one untimed forward of its turn, the blocks in turn_of's order (the
    cycles counted on from the warm-up's). block 0: the timed forwards one by one, turn by
    turn, no untimed ones between."""
    out = [(turn_of(i, turns), False) for i in range(warmup * turns)]
    timed = max(num_forwards - warmup, 0)
    if block <= 0:
        return out + [(turn_of(warmup * turns + i, turns), True) for i in range(timed * turns)]
    for b in range(-(-timed // block) * turns):
        which = turn_of(warmup * turns + b, turns)
        out += [(which, False)] + [(which, True)] * min(block, timed - (b // turns) * block)
    return out


def time_forwards(draft: DraftModelProposer, args, batch_sizes,
                  settings: tuple = (("", {}),), stage_ms: tuple = (None,),
                  outside: tuple = (None,)) -> list[list[float]]:
    """ms of each of num_forwards one-token forwards after a context of args.context tokens (a
    draft call of args.steps forwards, its time over args.steps: a draft step of k = steps), per
    turn: a batch size (batch_sizes, an int or a sequence: each its own sequences) and a setting
    ((label, {VAR: value}), parse_settings: environment variables the kernels read at each
    call), the turns batch-major (turn j = batch_sizes[j // len(settings)] under settings[j %
    len(settings)]), in blocks of args.turn_block timed forwards, each block after one untimed
    forward of its turn (schedule_of), the blocks in cycles of the turns, every other cycle in
    reverse order (turn_of). Each timed forward's decode_layers stages go into its turn's
    stage_ms and the ms of its input building and its LM head (linear_argmax: the greedy
    tokens) into its turn's outside (a dict {"inputs": ms, "lm_head": ms}, or None). So the
    batch sizes and the settings share the host's drift, and each timed forward follows one of
    its own turn, as a draft's steps follow each other. (Forward by forward, on the H100
    machine's 16-core host: a setting that changes nothing at batch 1 (VLLM_CPU_NORM_TAIL=0)
    read 0.74-0.97x the time of the turn before it, which followed batch 8's, in three rounds
    in one order (run 67); with every other cycle reversed, 1.02-1.20x (run 68).)"""
    if isinstance(batch_sizes, int):
        batch_sizes = [batch_sizes]
    turns = turns_of(batch_sizes, settings)
    schedule = schedule_of(len(turns), args.warmup, args.num_forwards, args.turn_block)
    vocab = draft.config.hf_config.vocab_size
    batches = {}
    for bs in batch_sizes:
        reqs = []
        for i in range(bs):
            ids = torch.randint(0, vocab, (args.context,),
                                generator=torch.Generator().manual_seed(i))
            reqs.append(Request(f"b{bs}-{i}", None, ids.tolist(),
                                SamplingParams(temperature=0.0), None))
        draft.propose(reqs, [1] * len(reqs)).result()  # the context's forward (a prefill)
        # this batch's calls, each writing args.steps more slots; held, each call writes the
        # first call's slots again
        calls = 1 if args.hold_context else sum(1 for which, _ in schedule
                                                if turns[which][0] == bs)
        for req in reqs:
            if not draft.block_manager.grow(draft.seqs[req.req_id].block_ids,
                                            args.context + args.steps * calls + 2):
                raise ValueError("the draft's KV cache is too small: raise "
                                 "VLLM_CPU_KVCACHE_SPACE")
        batches[bs] = reqs
    times = [[] for _ in turns]
    saved = {name: os.environ.get(name) for _, setting in settings for name in setting}
    clock = {"which": 0, "on": False}

    def timed(key, method):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            result = method(*a, **kw)
            sink = outside[clock["which"]] if clock["which"] < len(outside) else None
            if clock["on"] and sink is not None:
                sink[key] = sink.get(key, 0.0) + (time.perf_counter() - start) * 1e3
            return result
        return wrapper
    # an instance attribute and the module's function replaced for this call only (put back
    # below)
    draft.runner.prepare_inputs = timed("inputs", draft.runner.prepare_inputs)
    linear_argmax = ops.linear_argmax
    ops.linear_argmax = timed("lm_head", linear_argmax)
    for stages in stage_ms:
        if stages is not None:
            stages.zero_()
    with torch.inference_mode():
        for which, timed_forward in schedule:
            bs, (_, setting) = turns[which]
            # the environment as found, then this setting's variables: a variable that another
            # setting names and this one does not is put back, not left at the other's value
            restore_environ(saved)
            os.environ.update(setting)
            counted = timed_forward and which < len(stage_ms)
            cpu_decode.stage_ms = stage_ms[which] if counted else None
            clock["which"] = which
            clock["on"] = timed_forward  # the clocks count the timed forwards alone
            reqs = batches[bs]
            start = time.perf_counter()
            draft._draft(reqs, [args.steps] * len(reqs))
            if timed_forward:
                times[which].append((time.perf_counter() - start) * 1e3 / args.steps)
            if args.hold_context:
                hold_context(draft, reqs, args.context)
    cpu_decode.stage_ms = None
    del draft.runner.prepare_inputs
    ops.linear_argmax = linear_argmax
    restore_environ(saved)
    for reqs in batches.values():
        for req in reqs:
            draft.free(req.req_id)
    return times


def gemm_ms(model: torch.nn.Module, rows: int, path: str, repeats: int = 9) -> float:
    """The step's matmuls alone (every linear weight and the logits' once, `rows` rows), back to
    back, through the path's GEMM (fused: linear_small, which picks its GEMV, its register tiles
    or torch's GEMM, with the weights' packed copies from cpu_decode.PACKED_MIN_ROWS rows as the
    fused forward has them): the part of a forward that is the weight bytes."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # the logits' weight: the LM head (its own module, not an nn.Linear) or the tied embedding
    weights.append(model.output_head().weight.detach())
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    outs = {id(w): torch.empty(rows, w.shape[0], dtype=w.dtype) for w in weights}
    fused = path == "fused" and rows <= cpu_decode.MAX_ROWS
    packed = {id(w): (cpu_decode.packed_copy(w) if rows >= cpu_decode.PACKED_MIN_ROWS
                      else w.new_empty(0)) for w in weights} if fused else {}

    def run():
        for w in weights:
            if fused:
                ops.linear_packed(outs[id(w)], xs[w.shape[1]], w, packed[id(w)], None)
            else:
                F.linear(xs[w.shape[1]], w)
    run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def forward_row(name: str, dtype: str, threads: int, bs: int, path: str, times: list[float],
                stages: list[float], outside: dict, floor: float, gemm: float,
                bandwidth: float) -> dict:
    """One row of the result (printed as it is made): the forwards' median against the floor,
    the GEMMs' share and, for the fused path, decode_layers' time by stage and of the rest of
    the forward the input building and the LM head (means: greedy_steps' own stages, or the
    model path's calls timed from Python); what is left is the Python around the calls."""
    median = statistics.median(times)
    row = {"model": name, "dtype": dtype, "threads": threads, "batch_size": bs, "path": path,
           "ms_per_forward": median, "min": min(times), "max": max(times), "floor_ms": floor,
           "gemm_ms": gemm, "outside_gemm_share": max(0.0, 1 - gemm / median),
           "bandwidth_gbps": bandwidth}
    if any(stages):
        row["stage_ms"] = dict(zip(ops.DECODE_STAGES, stages))
        for key, ms in outside.items():  # the model path's, where greedy_steps' own are 0
            row["stage_ms"][key] = row["stage_ms"].get(key, 0.0) + ms
        # the stages are means over the forwards: the rest is taken from the mean as well
        row["stage_ms"]["outside_decode_layers"] = (statistics.fmean(times) - sum(stages)
                                                    - sum(outside.values()))
    print(f"{name:<14} {dtype:<9} {threads:>3} thr  batch {bs:>2}  {path:<6} "
          f"{median:7.3f} ms (min {min(times):.3f})  floor {floor:.3f} ms "
          f"= {median / floor:4.2f}x floor  gemms {gemm:.3f} ms, "
          f"{100 * row['outside_gemm_share']:3.0f}% outside  ({bandwidth:.0f} GB/s)", flush=True)
    if "stage_ms" in row:
        print("    by stage (ms): " + ", ".join(
            f"{k} {v:.3f}" for k, v in row["stage_ms"].items()), flush=True)
    return row


def main(args) -> dict:
    threads = [int(t) for t in args.threads.split(",")] if args.threads else \
        cpu_threads.candidate_counts()
    settings = parse_settings(args.settings)
    rows, picks = [], {}
    for model_path in args.model.split(","):
        name = os.path.basename(model_path.rstrip("/"))
        for dtype in args.dtypes.split(","):
            draft = make_draft(args, model_path, dtype)
            model = draft.runner.model
            os.environ["VLLM_CPU_DECODE_PATH"] = "fused"
            pick, _ = cpu_threads.pick_num_threads(draft._probe_forward,
                                                   cpu_threads.candidate_counts())
            picks[(name, dtype)] = pick
            print(f"{name} {dtype}: the draft's start-up measurement picks {pick} threads",
                  flush=True)
            for n in threads:
                torch.set_num_threads(n)
                bandwidth = copy_bandwidth_gbps("cpu", 256 << 20)
                floors = {bs: step_floor_ms(model, draft.config, mean_context(args) * bs,
                                            bandwidth) for bs in args.batch_sizes}
                for path in args.paths.split(","):
                    os.environ["VLLM_CPU_DECODE_PATH"] = path
                    turns = turns_of(args.batch_sizes, settings)
                    clocks = tuple(torch.zeros(len(ops.DECODE_STAGES), dtype=torch.float64)
                                   for _ in turns)
                    outside = tuple({} for _ in turns)
                    per_turn = time_forwards(draft, args, args.batch_sizes, settings, clocks,
                                             outside)
                    gemms = {bs: gemm_ms(model, bs, path) for bs in args.batch_sizes}
                    for (bs, (setting, _)), clock, out, times in zip(turns, clocks, outside,
                                                                     per_turn):
                        label = path if len(settings) == 1 else f"{path} {setting}"
                        count = max(1, len(times)) * args.steps
                        rows.append(forward_row(
                            name, dtype, n, bs, label, times, (clock / count).tolist(),
                            {k: v / count for k, v in out.items()}, floors[bs], gemms[bs],
                            bandwidth))
            if args.profile:
                from torch.profiler import ProfilerActivity, profile
                os.environ["VLLM_CPU_DECODE_PATH"] = args.paths.split(",")[0]
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    time_forwards(draft, args, args.batch_sizes[0])
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
            del draft
    os.environ.pop("VLLM_CPU_DECODE_PATH", None)
    print_summary(rows, picks)
    result = {"provenance": provenance(), "model": args.model, "context": args.context,
              "hold_context": args.hold_context, "mean_context": mean_context(args),
              "steps": args.steps,
              "max_rows_of_fused_path": cpu_decode.MAX_ROWS,
              "start_up_threads": {f"{m}/{d}": n for (m, d), n in picks.items()}, "rows": rows}
    write_json(args.output_json, result, args)
    plot_run("draft", result, args)
    return result


def print_summary(rows: list[dict], picks: dict) -> None:
    """Per model, dtype and path: the best thread count's batch-1 ms over its floor, and batch
    b's ms over batch 1's at the same count, beside the ratio of their floors (what the weight
    and KV bytes alone allow: batch b reads b sequences' KV) and batch b's own ms over its
    floor (where batch 1 runs below its floor, part of a small model's weights still in the
    CPU's caches, batch b can sit at its floor and still be more than the floors' ratio over
    batch 1)."""
    print("\n== summary: x floor at batch 1 (best threads; start-up pick), batch b / batch 1 "
          "(of their floors; batch b x its floor)")
    keys = sorted({(r["model"], r["dtype"], r["path"]) for r in rows})
    for model, dtype, path in keys:
        mine = [r for r in rows if (r["model"], r["dtype"], r["path"]) == (model, dtype, path)]
        low = min(r["batch_size"] for r in mine)  # 1, unless no batch-1 row was run
        ones = [r for r in mine if r["batch_size"] == low]
        best = min(ones, key=lambda r: r["ms_per_forward"])
        at_pick = [r for r in ones if r["threads"] == picks.get((model, dtype))]
        pick_txt = (f"{at_pick[0]['ms_per_forward'] / at_pick[0]['floor_ms']:.2f}x at "
                    f"{at_pick[0]['threads']}" if at_pick else "pick not run")
        ratios = []
        for r in mine:
            if r["batch_size"] != low and r["threads"] == best["threads"]:
                ratios.append(f"b{r['batch_size']}/b{low} "
                              f"{r['ms_per_forward'] / best['ms_per_forward']:.2f} (floors "
                              f"{r['floor_ms'] / best['floor_ms']:.2f}; "
                              f"{r['ms_per_forward'] / r['floor_ms']:.2f}x its floor)")
        print(f"{model:<14} {dtype:<9} {path:<6} {best['ms_per_forward']:6.3f} ms = "
              f"{best['ms_per_forward'] / best['floor_ms']:.2f}x floor at {best['threads']} thr "
              f"{'' if low == 1 else f'(batch {low}) '}({pick_txt}); {', '.join(ratios) or '-'}")
    print_pooled(rows)


def print_pooled(rows: list[dict]) -> None:
    """Where settings were timed in turns (rows labelled "path setting"): at each thread count,
    batch b's ms of each setting over the median batch-1 ms of all of them. For settings that
    cannot touch batch 1 (the AMX tiles run from 8 rows) the batch-1 rows differ only by
    the host's noise, and the median of them is a steadier baseline than a setting's own."""
    groups: dict = {}
    for r in rows:
        path, _, setting = r["path"].partition(" ")
        if setting:
            groups.setdefault((r["model"], r["dtype"], path, r["threads"]), []).append(r)
    if groups:
        print("\n== pooled: batch b / the median batch 1 of all settings, by setting")
    for (model, dtype, path, threads), mine in sorted(groups.items()):
        low = min(r["batch_size"] for r in mine)
        pooled = statistics.median(r["ms_per_forward"] for r in mine if r["batch_size"] == low)
        ratios = [f"{r['path'].partition(' ')[2]} b{r['batch_size']}/b{low} "
                  f"{r['ms_per_forward'] / pooled:.2f}" for r in mine if r["batch_size"] != low]
        print(f"{model:<14} {dtype:<9} {path:<6} {threads:>3} thr: b{low} {pooled:.3f} ms; "
              f"{', '.join(ratios) or '-'}")


def batch_sizes_arg(text: str) -> list[int]:
    """--batch-sizes: distinct positive sizes (each takes turns with its own sequences)."""
    sizes = [int(b) for b in text.split(",")]
    if len(set(sizes)) != len(sizes) or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected distinct positive sizes, got {text!r}")
    return sizes


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="one or more checkpoints, comma-separated")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", default=None, help="comma list (default 1, 2, 4, ... all)")
    parser.add_argument("--batch-sizes", type=batch_sizes_arg, default=[1],
                        help="comma list of distinct sizes, timed in turns")
    parser.add_argument("--paths", default="fused,native",
                        help="CPU decode paths to time: fused and/or native")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--hold-context", action="store_true",
                        help="every timed call at --context (each sequence set back after "
                             "it), instead of the context growing by the forwards before it")
    parser.add_argument("--num-forwards", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--turn-block", type=int, default=8,
                        help="timed forwards of a turn in a row, after one untimed forward of "
                             "it (0: forward by forward, none untimed)")
    parser.add_argument("--steps", type=int, default=1,
                        help="forwards per draft call (a draft step of k = steps: from the "
                             "second on, a plain-greedy draft's forwards run in one native "
                             "call); each forward's time is the call's over steps")
    parser.add_argument("--settings", default="default",
                        help="';'-separated settings of environment variables the kernels read "
                             "at each call, each an optional LABEL: and ','-joined VAR=value "
                             "pairs, timed in turns forward by forward (a row each, its path "
                             "labelled), e.g. 'team:VLLM_CPU_DECODE_TEAM=1;"
                             "no team:VLLM_CPU_DECODE_TEAM=0'")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output-json", default=None)
    add_plot_args(parser)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
