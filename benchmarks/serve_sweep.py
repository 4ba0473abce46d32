"""Serving sweep: for each server configuration (plain, CPU draft) and process layout (the engine
core in its own process, or on a thread of the API server: --disable-frontend-multiprocessing),
start `vllm serve`, run benchmarks/benchmark_serving.py at each concurrency (clients), and record
per process of the server's tree (API server, engine core, drafter) the CPU seconds it used
during each run and the cores it may run on. Prints one table last; writes one JSON per run
(OUT_DIR/serving_<layout>_<config>_c<N>.json) and OUT_DIR/serve_sweep.json. With --rounds R
every configuration is served R times, the order of the configurations reversed every other
round (a server's speed drifts between starts: plain serving at 64 clients measured 2884 to
4123 tok/s in four runs on the H200), each round's files suffixed _r<i>; the table adds the
rounds up (tokens over seconds) and lists each round's tokens per second.

    python benchmarks/serve_sweep.py --out-dir out -- MODEL --speculative-model DRAFT \
        --num-speculative-tokens 3 --cpu-draft-worker [engine flags]

The draft flags apply to the `draft` configuration only; `plain` drops them; `goodput` is
`draft` with the goodput controller on; `split` is `draft` with batched overlap forced on."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import httpx
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import benchmark_serving  # noqa: E402
from vllm.engine.step_timer import per_step_ms  # noqa: E402
from vllm.process_utils import parse_cpu_list  # noqa: E402
from tests.entrypoints.utils import free_port  # noqa: E402

DRAFT_FLAGS_WITH_VALUE = {"--speculative-model", "--num-speculative-tokens",
                          "--speculative-batch-split",
                          "--speculative-draft-dtype", "--speculative-draft-ahead",
                          "--speculative-adaptive", "--speculative-draft-process",
                          "--speculative-draft-cpus", "--speculative-config"}
DRAFT_SWITCHES = {"--cpu-draft-worker"}


def plain_flags(flags: list[str]) -> list[str]:
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag in DRAFT_FLAGS_WITH_VALUE:
            skip = True
        elif flag not in DRAFT_SWITCHES:
            out.append(flag)
    return out


def goodput_flags(flags: list[str]) -> list[str]:
    """The draft flags with the goodput controller on (whatever --speculative-adaptive said)."""
    out = list(flags)
    if "--speculative-adaptive" in out:
        del out[out.index("--speculative-adaptive"):out.index("--speculative-adaptive") + 2]
    return out + ["--speculative-adaptive", "on"]


def split_flags(flags: list[str]) -> list[str]:
    """The draft flags with batched overlap forced on (every step with 2+ decoding requests
    is split)."""
    return list(flags) + ["--speculative-batch-split", "on"]


def role(proc: psutil.Process) -> str:
    cmd = " ".join(proc.cmdline())
    for module, name in (("core_proc", "engine core"), ("draft_process", "drafter"),
                         ("api_server", "api server"), ("cli.main", "api server")):
        if module in cmd:
            return name
    return proc.name()


def tree_cpu(root: int) -> dict[str, dict]:
    """CPU seconds (user + system) and allowed cores of each process of the tree."""
    out = {}
    procs = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
    for p in procs:
        try:
            t = p.cpu_times()
            out[f"{role(p)} ({p.pid})"] = {"cpu_s": t.user + t.system,
                                          "cores": p.cpu_affinity()}
        except psutil.NoSuchProcess:
            continue
    return out


SPEC_COUNTERS = ("num_draft_tokens", "num_accepted_tokens", "num_emitted_tokens",
                 "num_spec_steps", "controller_num_probes", "controller_num_split_steps",
                 "controller_num_vetoed", "controller_num_measuring_plain",
                 "controller_num_ahead_used", "controller_num_ahead_missed")


def scrape(port: int) -> tuple[dict[str, float], dict]:
    """The server's spec-decode counters (empty without speculation) and its engine step times
    (StepTimer.as_dict() form) from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    spec: dict[str, float] = {}
    times: dict = {"phase_s": {}, "steps": {}, "step_s": {}, "first_token_s": 0.0,
                   "num_first_tokens": 0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            for key in SPEC_COUNTERS:
                if name == f"vllm:spec_decode_{key}_total":
                    spec[key] = sample.value
            if name == "vllm:spec_decode_controller_steps_total":
                spec[f"controller_k{labels['k']}_steps"] = sample.value
            if name == "vllm:engine_step_phase_seconds_total":
                times["phase_s"][labels["phase"]] = sample.value
            elif name == "vllm:engine_steps_total":
                times["steps"][labels["kind"]] = sample.value
            elif name == "vllm:engine_step_seconds_total":
                times["step_s"][labels["kind"]] = sample.value
            elif name == "vllm:engine_first_token_seconds_total":
                times["first_token_s"] = sample.value
            elif name == "vllm:engine_first_tokens_total":
                times["num_first_tokens"] = sample.value
    return spec, times


def start_server(flags: list[str], port: int, layout: str, log_path: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *flags, "--host",
           "127.0.0.1", "--port", str(port), "--served-model-name", "bench",
           "--uvicorn-log-level", "warning"]
    if layout == "inproc":
        cmd.append("--disable-frontend-multiprocessing")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise TimeoutError("the server did not become healthy")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def run_config(args, layout: str, config: str, flags: list[str], round_: int = 0) -> list[dict]:
    port = free_port()
    all_cpus = os.sched_getaffinity(0)  # the server's processes choose their own cores
    tag = f"_r{round_}" if args.rounds > 1 else ""
    proc = start_server(flags, port, layout, os.path.join(args.out_dir,
                                                          f"server_{layout}_{config}{tag}.log"))
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
    rows = []
    try:
        # warm-up: each batch size once (CUDA graphs are captured on first use)
        for conc in args.concurrency:
            benchmark_serving.main(benchmark_serving.make_parser().parse_args([
                "--base-url", f"http://127.0.0.1:{port}", "--model", "bench",
                "--num-prompts", str(conc), "--output-len", "16", "--dataset", args.dataset]))
        for conc in args.concurrency:
            bench = benchmark_serving.make_parser().parse_args([
                "--base-url", f"http://127.0.0.1:{port}", "--model", "bench",
                "--num-prompts", str(max(args.min_prompts, args.prompts_per_client * conc)),
                "--max-concurrency", str(conc), "--output-len", str(args.output_len),
                "--dataset", args.dataset, "--label", f"{layout} {config}",
                "--output-json", os.path.join(args.out_dir,
                                              f"serving_{layout}_{config}_c{conc}{tag}.json")])
            before, (spec_before, times_before) = tree_cpu(proc.pid), scrape(port)
            summary = benchmark_serving.main(bench)
            after, (spec_after, times_after) = tree_cpu(proc.pid), scrape(port)
            spec = {k: spec_after[k] - spec_before.get(k, 0) for k in spec_after}
            cpu = {name: {"cpu_s": after[name]["cpu_s"] - before.get(name, {"cpu_s": 0})[
                "cpu_s"], "cores": after[name]["cores"]} for name in after}
            rows.append({"layout": layout, "config": config, "concurrency": conc,
                         "round": round_,
                         "output_throughput": summary["output_throughput"],
                         "tpot_ms_median": summary["tpot_ms"]["50"],
                         "duration_s": summary["duration_s"], "failed": summary["failed"],
                         "ttft_ms_mean": summary["ttft_ms"]["mean"],
                         "cpu": cpu, "spec_decode": spec,
                         # the engine's side of each step, per step (StepTimer)
                         "engine_steps": per_step_ms(times_before, times_after),
                         # tokens per sequence-step that verified drafts (tau)
                         "tau": (spec["num_emitted_tokens"] / spec["num_spec_steps"]
                                 if spec.get("num_spec_steps") else None)})
    finally:
        os.sched_setaffinity(0, all_cpus)
        stop_server(proc)
    return rows


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default="out")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 4, 16, 64])
    parser.add_argument("--layouts", default="mp,inproc")
    parser.add_argument("--configs", default="plain,draft",
                        help="plain, draft (the flags as given), goodput (the draft flags with "
                             "--speculative-adaptive on), split (the draft flags with "
                             "--speculative-batch-split on)")
    parser.add_argument("--prompts-per-client", type=int, default=4)
    parser.add_argument("--min-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dataset", choices=["random", "humaneval"], default="humaneval")
    parser.add_argument("--rounds", type=int, default=1,
                        help="serve every configuration this many times, alternating the order")
    parser.add_argument("--client-cpus", default=None,
                        help="cores the benchmark client (this process) runs on, e.g. 2: off "
                             "the draft process's cores (--speculative-draft-cpus) and the "
                             "engine core's, so that it does not slow what it measures")
    args = parser.parse_args(argv[:split])
    args.client_cpus = parse_cpu_list(args.client_cpus)
    server_flags = argv[split + 1:]
    os.makedirs(args.out_dir, exist_ok=True)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    rows = []
    configs = args.configs.split(",")
    for round_ in range(args.rounds):
        for layout in args.layouts.split(","):
            for config in configs if round_ % 2 == 0 else configs[::-1]:
                flags = {"plain": plain_flags, "draft": list, "goodput": goodput_flags,
                         "split": split_flags}[config](server_flags)
                rows += run_config(args, layout, config, flags, round_)
    with open(os.path.join(args.out_dir, "serve_sweep.json"), "w") as f:
        json.dump({"command": sys.argv, "rows": rows}, f, indent=1)
    print_summary(combine_rounds(rows))


def combine_rounds(rows: list[dict]) -> list[dict]:
    """One row per (layout, config, concurrency), in the order first served: its rounds added up
    (throughput = all tokens over all seconds; CPU seconds, spec-decode counts and the engine's
    steps summed or step-weighted), and each round's throughput under "round_throughputs"."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["layout"], r["config"], r["concurrency"]), []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(dict(group[0], round_throughputs=[group[0]["output_throughput"]]))
            continue
        seconds = sum(r["duration_s"] for r in group)
        tokens = sum(r["output_throughput"] * r["duration_s"] for r in group)
        spec = {k: sum(r["spec_decode"].get(k, 0) for r in group) for k in group[0]["spec_decode"]}
        cpu = {name: {"cpu_s": sum(r["cpu"].get(name, {"cpu_s": 0})["cpu_s"] for r in group),
                      "cores": v["cores"]} for name, v in group[0]["cpu"].items()}
        out.append(dict(group[0], output_throughput=tokens / seconds, duration_s=seconds,
                        failed=sum(r["failed"] for r in group), spec_decode=spec, cpu=cpu,
                        engine_steps=_combine_steps([r["engine_steps"] for r in group]),
                        tpot_ms_median=statistics.median(r["tpot_ms_median"] or 0 for r in group),
                        ttft_ms_mean=statistics.mean(r["ttft_ms_mean"] for r in group),
                        tau=(spec["num_emitted_tokens"] / spec["num_spec_steps"]
                             if spec.get("num_spec_steps") else None),
                        round_throughputs=[r["output_throughput"] for r in group]))
    return out


def _combine_steps(steps: list[dict]) -> dict:
    """StepTimer per-step figures of several runs as one: counts summed, ms per step weighted
    by the steps each run took (ms per prefill / decode step by those steps)."""
    total = sum(s["prefill_steps"] + s["decode_steps"] for s in steps) or 1
    out = {}
    for key in steps[0]:
        if key.endswith("_steps"):
            out[key] = sum(s[key] for s in steps)
        elif key in ("prefill_step_ms", "decode_step_ms"):
            kind = key.replace("_step_ms", "_steps")
            n = sum(s[kind] for s in steps if s[key] is not None)
            out[key] = (sum(s[key] * s[kind] for s in steps if s[key] is not None) / n
                        if n else None)
        elif key == "engine_ttft_ms":
            vals = [s[key] for s in steps if s[key] is not None]
            out[key] = statistics.mean(vals) if vals else None
        else:
            out[key] = sum(s[key] * (s["prefill_steps"] + s["decode_steps"]) for s in steps) / total
    return out


def print_summary(rows: list[dict]) -> None:
    """The sweep's tables: throughput against plain, the engine's side of each step, the
    controller's choices."""
    plain = {(r["layout"], r["concurrency"]): r["output_throughput"] for r in rows
             if r["config"] == "plain"}
    print(f"{'layout':<8}{'config':<8}{'clients':>8}{'tok/s':>10}{'vs plain':>10}"
          f"{'TPOT ms':>9}{'tau':>6}  cpu s per process (cores)")
    for r in rows:
        base = plain.get((r["layout"], r["concurrency"]))
        ratio = f"{r['output_throughput'] / base:.2f}x" if base else "-"
        cpu = "; ".join(f"{name.split(' (')[0]} {v['cpu_s']:.1f} ({_cores(v['cores'])})"
                        for name, v in r["cpu"].items())
        rounds = r.get("round_throughputs", [])
        each = f"  rounds {' / '.join(f'{t:.0f}' for t in rounds)};" if len(rounds) > 1 else ""
        print(f"{r['layout']:<8}{r['config']:<8}{r['concurrency']:>8}"
              f"{r['output_throughput']:>10.1f}{ratio:>10}{r['tpot_ms_median'] or 0:>9.2f}"
              f"{r['tau'] or 0:>6.2f} {each} {cpu}")
    print("engine side, ms per step (all steps), per prefill / decode step, and the engine's "
          "share of TTFT (client TTFT beside it)")
    for r in rows:
        e = r["engine_steps"]
        phases = " ".join(f"{p[:-3]} {e[p]:.2f}" for p in e if p.endswith("_ms") and
                          not p.endswith("step_ms") and p != "engine_ttft_ms")
        print(f"{r['layout']:<8}{r['config']:<8}{r['concurrency']:>8}  {phases}; prefill "
              f"{_ms(e['prefill_step_ms'])} x{e['prefill_steps']:.0f}, decode "
              f"{_ms(e['decode_step_ms'])} x{e['decode_steps']:.0f}; TTFT engine "
              f"{_ms(e['engine_ttft_ms'])} client {r['ttft_ms_mean']:.2f}")
    controlled = [r for r in rows if any(k.startswith("controller_k") for k in r["spec_decode"])]
    if controlled:
        print("the goodput controller's steps by k chosen (0: plain), its split steps, probes, "
              "steps its guard vetoed or kept plain to measure; tokens emitted by verifications "
              "of all tokens")
    for r in controlled:
        spec = r["spec_decode"]
        num_k = sum(key.startswith("controller_k") for key in spec)
        by_k = [int(spec[f"controller_k{k}_steps"]) for k in range(num_k)]
        total = r["output_throughput"] * r["duration_s"]
        print(f"{r['layout']:<8}{r['config']:<8}{r['concurrency']:>8}  k steps {by_k}, split "
              f"{spec.get('controller_num_split_steps', 0):.0f}, probes "
              f"{spec.get('controller_num_probes', 0):.0f}, vetoed "
              f"{spec.get('controller_num_vetoed', 0):.0f}, measuring plain "
              f"{spec.get('controller_num_measuring_plain', 0):.0f}, guesses ahead right / wrong "
              f"{spec.get('controller_num_ahead_used', 0):.0f} / "
              f"{spec.get('controller_num_ahead_missed', 0):.0f}; verified "
              f"{spec.get('num_emitted_tokens', 0):.0f} of {total:.0f} tokens")


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cores(cores: list[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])


if __name__ == "__main__":
    main()
