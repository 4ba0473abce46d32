"""Serving sweep: for each server configuration (plain, CPU draft) and process layout (the engine
core in its own process, or on a thread of the API server: --disable-frontend-multiprocessing),
start `vllm serve`, run benchmarks/benchmark_serving.py at each concurrency (clients), and record
per process of the server's tree (API server, engine core, drafter) the CPU seconds it used
during each run and the cores it may run on. Prints one table last; writes one JSON per run
(OUT_DIR/serving_<layout>_<config>_c<N>.json) and OUT_DIR/serve_sweep.json.

    python benchmarks/serve_sweep.py --out-dir out -- MODEL --speculative-model DRAFT \
        --num-speculative-tokens 3 --cpu-draft-worker [engine flags]

The draft flags apply to the `draft` configuration only; `plain` drops them."""
import argparse
import json
import os
import subprocess
import sys
import time

import httpx
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import benchmark_serving  # noqa: E402
from tests.entrypoints.utils import free_port  # noqa: E402

DRAFT_FLAGS_WITH_VALUE = {"--speculative-model", "--num-speculative-tokens",
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
                 "num_spec_steps")


def spec_counters(port: int) -> dict[str, float]:
    """The server's spec-decode counters from /metrics (empty without speculation)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key in SPEC_COUNTERS:
                if sample.name == f"vllm:spec_decode_{key}_total":
                    out[key] = sample.value
    return out


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


def run_config(args, layout: str, config: str, flags: list[str]) -> list[dict]:
    port = free_port()
    proc = start_server(flags, port, layout, os.path.join(args.out_dir,
                                                          f"server_{layout}_{config}.log"))
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
                                              f"serving_{layout}_{config}_c{conc}.json")])
            before, spec_before = tree_cpu(proc.pid), spec_counters(port)
            summary = benchmark_serving.main(bench)
            after, spec_after = tree_cpu(proc.pid), spec_counters(port)
            spec = {k: spec_after[k] - spec_before.get(k, 0) for k in spec_after}
            cpu = {name: {"cpu_s": after[name]["cpu_s"] - before.get(name, {"cpu_s": 0})[
                "cpu_s"], "cores": after[name]["cores"]} for name in after}
            rows.append({"layout": layout, "config": config, "concurrency": conc,
                         "output_throughput": summary["output_throughput"],
                         "tpot_ms_median": summary["tpot_ms"]["50"],
                         "duration_s": summary["duration_s"], "failed": summary["failed"],
                         "cpu": cpu, "spec_decode": spec,
                         # tokens per sequence-step that verified drafts (tau)
                         "tau": (spec["num_emitted_tokens"] / spec["num_spec_steps"]
                                 if spec.get("num_spec_steps") else None)})
    finally:
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
    parser.add_argument("--configs", default="plain,draft")
    parser.add_argument("--prompts-per-client", type=int, default=4)
    parser.add_argument("--min-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dataset", choices=["random", "humaneval"], default="humaneval")
    args = parser.parse_args(argv[:split])
    server_flags = argv[split + 1:]
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for layout in args.layouts.split(","):
        for config in args.configs.split(","):
            flags = server_flags if config == "draft" else plain_flags(server_flags)
            rows += run_config(args, layout, config, flags)
    with open(os.path.join(args.out_dir, "serve_sweep.json"), "w") as f:
        json.dump({"command": sys.argv, "rows": rows}, f, indent=1)
    plain = {(r["layout"], r["concurrency"]): r["output_throughput"] for r in rows
             if r["config"] == "plain"}
    print(f"{'layout':<8}{'config':<8}{'clients':>8}{'tok/s':>10}{'vs plain':>10}"
          f"{'TPOT ms':>9}{'tau':>6}  cpu s per process (cores)")
    for r in rows:
        base = plain.get((r["layout"], r["concurrency"]))
        ratio = f"{r['output_throughput'] / base:.2f}x" if base else "-"
        cpu = "; ".join(f"{name.split(' (')[0]} {v['cpu_s']:.1f} ({_cores(v['cores'])})"
                        for name, v in r["cpu"].items())
        print(f"{r['layout']:<8}{r['config']:<8}{r['concurrency']:>8}"
              f"{r['output_throughput']:>10.1f}{ratio:>10}{r['tpot_ms_median'] or 0:>9.2f}"
              f"{r['tau'] or 0:>6.2f}  {cpu}")


def _cores(cores: list[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])


if __name__ == "__main__":
    main()
