"""The CPU draft's forward, alone: milliseconds per one-token draft forward (the loop the draft
worker runs k times per step) against its floor (the draft's weights plus its KV over the host
memory bandwidth measured with the same thread count), per model shape, dtype, thread count,
batch size and CPU decode path (fused: one decode_layers call per step; native: one op per layer
piece), with the share of the time spent outside the GEMMs (1 - the time of the step's matmuls
alone, run back to back, over the forward's), the fused path's time by stage of its
decode_layers call (the norms, each linear, rotary and cache write, attention, the activation;
what is left of the forward is the logits, the sampling and the Python around them), the thread
count the draft picks at start-up, and the top ops from torch's profiler on request. A summary
table comes last.

    python benchmarks/benchmark_draft.py --model DRAFT[,DRAFT2] [--load-format dummy] \
        [--dtypes float32,bfloat16] [--threads 1,4,16] [--batch-sizes 1,8] \
        [--paths fused,native] [--context 256] [--profile]"""
import argparse
import os
import statistics
import sys
import time


# torch's CPU allocations on huge pages, as in the engine's own processes (vllm/huge_pages.py)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floors import step_floor_ms  # noqa: E402
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
                             max_model_len=args.context + args.num_forwards + 16,
                             max_num_seqs=max(args.batch_sizes),
                             speculative_model=model, num_speculative_tokens=1,
                             cpu_draft_worker=True, speculative_draft_dtype=dtype,
                             speculative_draft_threads=1)
    config = resolve_config(engine_args.create_engine_config())
    return DraftModelProposer(config, get_tokenizer(config.model_config))


def time_forwards(draft: DraftModelProposer, args, batch_size: int) -> list[float]:
    """ms of each of num_forwards one-token forwards after a context of args.context tokens."""
    vocab = draft.config.hf_config.vocab_size
    reqs = []
    for i in range(batch_size):
        ids = torch.randint(0, vocab, (args.context,), generator=torch.Generator().manual_seed(i))
        reqs.append(Request(str(i), None, ids.tolist(), SamplingParams(temperature=0.0), None))
    draft.propose(reqs, [1] * len(reqs)).result()  # the context's forward (a prefill)
    for req in reqs:
        if not draft.block_manager.grow(draft.seqs[req.req_id].block_ids,
                                        args.context + args.num_forwards + 2):
            raise ValueError("the draft's KV cache is too small: raise VLLM_CPU_KVCACHE_SPACE")
    times = []
    with torch.inference_mode():
        for i in range(args.num_forwards):
            if i == args.warmup and cpu_decode.stage_ms is not None:
                cpu_decode.stage_ms.zero_()  # the stage clock counts the timed forwards alone
            start = time.perf_counter()
            draft._draft(reqs, [1] * len(reqs))
            times.append((time.perf_counter() - start) * 1e3)
    for req in reqs:
        draft.free(req.req_id)
    return times


def gemm_ms(model: torch.nn.Module, rows: int, path: str, repeats: int = 9) -> float:
    """The step's matmuls alone (every linear weight and the logits' once, `rows` rows), back to
    back, through the path's GEMM (fused: linear_small, which picks its GEMV, its register tiles
    or torch's GEMM, with the weights' packed copies from cpu_decode.PACKED_MIN_ROWS rows as the
    fused forward has them): the part of a forward that is the weight bytes."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if getattr(model, "tie_word_embeddings", False):
        weights.append(model.model.embed_tokens.weight.detach())
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


def main(args) -> dict:
    threads = [int(t) for t in args.threads.split(",")] if args.threads else \
        cpu_threads.candidate_counts()
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
                for bs in args.batch_sizes:
                    floor = step_floor_ms(model, draft.config, args.context * bs, bandwidth)
                    for path in args.paths.split(","):
                        os.environ["VLLM_CPU_DECODE_PATH"] = path
                        cpu_decode.stage_ms = torch.zeros(len(ops.DECODE_STAGES),
                                                          dtype=torch.float64)
                        times = time_forwards(draft, args, bs)[args.warmup:]
                        stages = (cpu_decode.stage_ms / max(1, len(times))).tolist()
                        cpu_decode.stage_ms = None
                        median = statistics.median(times)
                        gemm = gemm_ms(model, bs, path)
                        row = {"model": name, "dtype": dtype, "threads": n, "batch_size": bs,
                               "path": path, "ms_per_forward": median, "min": min(times),
                               "max": max(times), "floor_ms": floor, "gemm_ms": gemm,
                               "outside_gemm_share": max(0.0, 1 - gemm / median),
                               "bandwidth_gbps": bandwidth}
                        if any(stages):  # the fused path's decode_layers, by stage (means)
                            row["stage_ms"] = dict(zip(ops.DECODE_STAGES, stages))
                            row["stage_ms"]["outside_decode_layers"] = median - sum(stages)
                        rows.append(row)
                        print(f"{name:<14} {dtype:<9} {n:>3} thr  batch {bs:>2}  {path:<6} "
                              f"{median:7.3f} ms (min {min(times):.3f})  floor {floor:.3f} ms "
                              f"= {median / floor:4.2f}x floor  gemms {gemm:.3f} ms, "
                              f"{100 * row['outside_gemm_share']:3.0f}% outside  "
                              f"({bandwidth:.0f} GB/s)", flush=True)
                        if "stage_ms" in row:
                            print("    by stage (ms): " + ", ".join(
                                f"{k} {v:.3f}" for k, v in row["stage_ms"].items()), flush=True)
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
              "max_rows_of_fused_path": cpu_decode.MAX_ROWS,
              "start_up_threads": {f"{m}/{d}": n for (m, d), n in picks.items()}, "rows": rows}
    write_json(args.output_json, result, args)
    plot_run("draft", result, args)
    return result


def print_summary(rows: list[dict], picks: dict) -> None:
    """Per model, dtype and path: the best thread count's batch-1 ms over its floor, and batch
    b's ms over batch 1's at the same count."""
    print("\n== summary: x floor at batch 1 (best threads; start-up pick), batch b / batch 1")
    keys = sorted({(r["model"], r["dtype"], r["path"]) for r in rows})
    for model, dtype, path in keys:
        mine = [r for r in rows if (r["model"], r["dtype"], r["path"]) == (model, dtype, path)]
        ones = [r for r in mine if r["batch_size"] == 1] or mine
        best = min(ones, key=lambda r: r["ms_per_forward"])
        at_pick = [r for r in ones if r["threads"] == picks.get((model, dtype))]
        pick_txt = (f"{at_pick[0]['ms_per_forward'] / at_pick[0]['floor_ms']:.2f}x at "
                    f"{at_pick[0]['threads']}" if at_pick else "pick not run")
        ratios = []
        for r in mine:
            if r["batch_size"] != 1 and r["threads"] == best["threads"]:
                ratios.append(f"b{r['batch_size']}/b1 "
                              f"{r['ms_per_forward'] / best['ms_per_forward']:.2f}")
        print(f"{model:<14} {dtype:<9} {path:<6} {best['ms_per_forward']:6.3f} ms = "
              f"{best['ms_per_forward'] / best['floor_ms']:.2f}x floor at {best['threads']} thr "
              f"({pick_txt}); {', '.join(ratios) or '-'}")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="one or more checkpoints, comma-separated")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", default=None, help="comma list (default 1, 2, 4, ... all)")
    parser.add_argument("--batch-sizes", type=lambda s: [int(b) for b in s.split(",")],
                        default=[1])
    parser.add_argument("--paths", default="fused,native",
                        help="CPU decode paths to time: fused and/or native")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--num-forwards", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output-json", default=None)
    add_plot_args(parser)
    return parser


if __name__ == "__main__":
    main(make_parser().parse_args())
