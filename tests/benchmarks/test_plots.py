"""benchmarks/plots.py and plot_results.py: each plot command writes a valid 900 x 550 PNG with
something drawn on it from small result JSON, new and old (optional fields missing); the
redraw names its pictures after the runs; a benchmark script's --plot draws its own run."""
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import plot_results, plots
from benchmarks.plot_args import plot_run

ROOT = Path(__file__).resolve().parents[2]
PROV = {"command": "benchmarks/x.py --cpu-draft-worker", "commit": "abc1234",
        "cpu_threads": "16", "gpu": "NVIDIA H200"}


def spec_result(old: bool = False) -> dict:
    rows = [{"proposer": "none", "k": 0, "tokens_per_s": 180.0, "speedup": 1.0, "seconds": 4.0,
             "step_ms": 5.5}]
    for name, tau0 in (("draft-cpu", 1.9), ("draft-cuda", 1.9), ("ngram", 1.4)):
        for k in (1, 2, 4):
            rows.append({"proposer": name, "k": k, "tokens_per_s": 200.0 + 20 * k * tau0,
                         "speedup": 1.1, "tau": tau0 + 0.8 * (k - 1), "acceptance_rate": 0.8,
                         "verify_ms_per_step": 5.7, "bound_free_draft": 1.5 * k})
    result = {"provenance": PROV, "prompts": "humaneval", "num_prompts": 6, "batch_size": 1,
              "max_tokens": 128, "rows": rows,
              "hf_transformers": [{"mode": "plain", "tokens_per_s": 24.0},
                                  {"mode": "assisted, CPU draft, k=4", "tokens_per_s": 45.0}]}
    if old:  # the first sweeps: no proposer names, bounds, batch size or baselines
        rows = [{k: v for k, v in r.items() if k not in ("proposer", "bound_free_draft")}
                for r in rows if r.get("proposer") in ("none", "draft-cpu")]
        result = {"provenance": {**PROV, "gpu": None}, "prompts": "chat", "num_prompts": 4,
                  "max_tokens": 64, "rows": rows}
    return result


def serving_result(label: str, concurrency: int, old: bool = False) -> dict:
    scale = 1.5 if label == "plain" else 1.0
    tpot = {"50": scale * (3.0 + concurrency / 8), "90": scale * (4.0 + concurrency / 6),
            "99": 9.0, "mean": 5.5}
    result = {"provenance": PROV, "duration_s": 2.0, "completed": concurrency, "failed": 0,
              "request_throughput": concurrency / 2.0,
              "output_throughput": 120.0 / scale * concurrency ** 0.7,
              "ttft_ms": dict(tpot), "tpot_ms": tpot, "itl_ms": dict(tpot),
              "args": {"model": "/models/" + label, "label": label, "num_prompts": concurrency,
                       "request_rate": float("inf"), "input_len": 128, "output_len": 64,
                       "temperature": 0.0}}
    if old:  # no label (the model names the line) and no p90
        del result["args"]["label"]
        result["tpot_ms"] = {"50": tpot["50"]}
    return result


def draft_result(old: bool = False) -> dict:
    rows = []
    for dtype, base in (("float32", 2.0), ("bfloat16", 2.4)):
        for threads in (1, 2, 4, 8, 16):
            rows.append({"dtype": dtype, "threads": threads, "ms_per_forward": base / threads ** .5,
                         "min": base / threads ** .5 * 0.9, "max": base / threads ** .5 * 1.2,
                         "floor_ms": 1.6 / threads ** .3, "bandwidth_gbps": 30.0 * threads ** .3})
    if old:
        rows = [{k: r[k] for k in ("dtype", "threads", "ms_per_forward")} for r in rows]
    return {"provenance": {**PROV, "gpu": None}, "model": "/models/draft-20m", "context": 256,
            "batch_size": 1, "rows": rows}


def latency_result(batch: int, spec: bool = False, hf: bool = True) -> dict:
    args = {"model": "/tmp/llama-2-7b", "load_format": "dummy", "dtype": "bfloat16",
            "batch_size": batch, "input_len": 128, "output_len": 128}
    if spec:
        args.update(speculative_model="/tmp/llama-68m", cpu_draft_worker=True,
                    num_speculative_tokens=4)
    result = {"provenance": PROV, "device": "cuda",
              "engine": {"avg_latency": 0.6, "tokens_per_s": 190.0 * batch,
                         "decode_step_ms": (15.0 if spec else 5.0) + 0.1 * batch},
              "copy_bandwidth_gbps": 4200.0, "decode_floor_ms": 3.1 + 0.02 * batch, "args": args}
    if hf:
        result["hf_transformers"] = {"decode_step_ms": 37.0 - 0.3 * batch}
    return result


def check_png(path: Path) -> None:
    """A PNG of the pictures' size with lines drawn on it (not one flat colour)."""
    assert path.stat().st_size > 5000
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (900, 550)
        pixels = np.asarray(img.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 8
    assert (pixels < 100).all(axis=2).mean() > 0.002  # dark pixels: text and lines


def profile_result(old: bool = False, slower: float = 1.0) -> dict:
    rows = [{"batch": b, "tokens_per_seq": q, "graph_ms": slower * (5.0 + b / 10 + q / 5),
             "floor_ms": 4.5 + b / 20} for b, q in ((1, 1), (1, 5), (32, 1))]
    result = {"provenance": PROV, "copy_bandwidth_gbps": 2990.0, "rows": rows,
              "args": {"model": "/tmp/llama-2-7b"}}
    if old:  # a first profile: no floor on some rows
        del rows[1]["floor_ms"]
    return result


def write(tmp_path: Path, name: str, result: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return str(path)


CASES = {
    "spec": lambda old: [spec_result(old)],
    "serving": lambda old: [serving_result(label, c, old) for label in ("plain", "cpu-draft")
                            for c in (1, 4, 16)],
    "draft": lambda old: [draft_result(old)],
    "latency": lambda old: [latency_result(b, spec, hf=not old) for spec in (False, True)
                            for b in (1, 8, 32)],
    "profile": lambda old: [profile_result(old), profile_result(old, slower=1.05)],
}


@pytest.mark.parametrize("old", [False, True], ids=["new", "old"])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_plot_command_writes_png(tmp_path, kind, old):
    inputs = [write(tmp_path, f"{kind}{i}.json", r) for i, r in enumerate(CASES[kind](old))]
    out = tmp_path / f"{kind}.png"
    if kind == "spec" and not old:  # the command line itself, once (a fresh interpreter)
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plots.py"), kind, str(out),
                        *inputs], check=True, cwd=ROOT, timeout=120, capture_output=True)
    else:
        assert plots.main([kind, str(out), *inputs]) == str(out)
    check_png(out)


def test_plot_results_redraws_each_picture(tmp_path):
    """Sweeps and draft runs: a picture each; latency and serving: one per machine prefix;
    other JSON skipped."""
    src = tmp_path / "results"
    src.mkdir()
    write(src, "h200_spec_pair.json", spec_result())
    write(src, "cpu2_spec_old.json", spec_result(old=True))
    write(src, "h200_draft_20m.json", draft_result())
    for i, r in enumerate(CASES["latency"](False)):
        write(src, f"h200_latency_{i}.json", r)
    for i, r in enumerate(CASES["serving"](False)):
        write(src, f"h200_serving_{i}.json", r)
    write(src, "h100_run25_profile_llama-2-7b_default.json", profile_result())
    write(src, "h100_run25_profile_llama-2-7b_pdl_combine-cluster.json", profile_result())
    write(src, "cpu2_latency_one.json", latency_result(1))  # one batch size: nothing to draw
    write(src, "h200_kernels.json", {"provenance": PROV, "runs": []})
    written = plot_results.main(["--results-dir", str(src), "--out-dir", str(tmp_path / "png")])
    assert sorted(Path(p).name for p in written) == [
        "cpu2_spec_old.png", "h100_run25_profile_llama-2-7b.png", "h200_draft_20m.png",
        "h200_latency.png", "h200_serving.png", "h200_spec_pair.png"]
    for p in written:
        check_png(Path(p))


def test_committed_results_are_classified():
    kinds = {p.name: plot_results.kind_of(json.loads(p.read_text()))
             for p in (ROOT / "benchmarks" / "results").glob("*.json")}
    assert kinds["h200_spec_pair7b.json"] == kinds["cpu2_spec_qwen_chat.json"] == "spec"
    assert kinds["h200_latency_7b_spec_b8.json"] == "latency"
    assert kinds["h200_kernels_bf16.json"] is None
    assert kinds["h100_run25_profile_llama-2-7b_pdl.json"] == "profile"
    assert kinds["h200_run13_profile_prefill_per_prompt.json"] is None  # no graph replay rows


def test_profile_runs_group_by_run_and_shape():
    result = profile_result()
    assert plots.profile_group("r/h100_run25_profile_llama-2-7b_pdl_combine-cluster.json",
                               result) == ("h100_run25_profile_llama-2-7b", "pdl, combine-cluster")
    assert plots.profile_group("h200_profile_run5_llama-2-7b.json", result) == (
        "h200_profile_llama-2-7b", "run5")
    assert plots.profile_group("h200_run23_profile_llama-2-7b.json", result)[1] == "default"


def test_labels_tell_configurations_apart():
    assert plots.latency_config(latency_result(1)) != plots.latency_config(
        latency_result(1, spec=True))
    assert plots.latency_config(latency_result(1)) == plots.latency_config(latency_result(8))
    assert plots.serving_point(serving_result("plain", 16)) == ("plain", 16)
    assert plots.serving_point(serving_result("x", 4, old=True)) == ("x", 4)
    rate_limited = serving_result("plain", 16)
    rate_limited["args"]["request_rate"] = 4.0  # in flight at once: unknown
    assert plots.serving_point(rate_limited) is None


def test_script_plot_flag_draws_its_run_with_earlier_ones(tmp_path):
    """What a benchmark script's --plot does after writing its JSON: this run (its arguments
    attached, as in the JSON) with the runs of --plot-with."""
    run = serving_result("cpu-draft", 8)
    args = Namespace(**run.pop("args"), plot=str(tmp_path / "s.png"),
                     plot_with=[write(tmp_path, "a.json", serving_result("plain", 2)),
                                write(tmp_path, "b.json", serving_result("plain", 8))])
    plot_run("serving", run, args)
    check_png(tmp_path / "s.png")
    plot_run("serving", run, Namespace(plot=None))  # no --plot: nothing drawn, no error


def test_benchmark_draft_plot(tmp_path, tiny_llama):
    """benchmark_draft.py end to end on a tiny model with --plot."""
    out = tmp_path / "d.png"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "benchmark_draft.py"), "--model",
                    tiny_llama, "--dtypes", "float32", "--threads", "1", "--context", "8",
                    "--num-forwards", "4", "--warmup", "1", "--output-json",
                    str(tmp_path / "d.json"), "--plot", str(out)],
                   check=True, cwd=ROOT, timeout=300, capture_output=True)
    check_png(out)


def test_draft_stage_bars_keep_each_setting():
    """An A/B's rows (benchmark_draft.py --settings: a path per setting) get a stage bar each,
    at the most threads of each (model, batch, path)."""
    rows = [{"model": "m", "batch_size": b, "path": p, "threads": t, "stage_ms": {"qkv": 1.0}}
            for b in (1, 8) for p in ("fused fold", "fused no fold") for t in (2, 16)]
    picked = plots.stage_bars(rows)
    assert sorted(picked) == [("m", b, p) for b in (1, 8) for p in ("fused fold", "fused no fold")]
    assert all(r["threads"] == 16 for r in picked.values())


def test_draft_settings_at_one_thread_count_are_bars(tmp_path):
    """A run at one thread count (an A/B of settings: a path each) draws each model's rows as
    bars, a group per setting and a bar per batch size at its median, and writes the picture."""
    import matplotlib.pyplot as plt
    rows = [{"model": m, "batch_size": b, "dtype": "bfloat16", "path": p, "threads": 16,
             "ms_per_forward": 0.2 * b ** .2 + i * 0.01, "min": 0.15, "max": 9.0,
             "floor_ms": 0.25, "stage_ms": {"qkv": 0.05}}
            for m in ("/m/draft-20m", "/m/llama-68m") for b in (1, 8)
            for i, p in enumerate(("fused default", "fused pf"))]
    fig, ax = plt.subplots()
    plots.plot_draft_settings(ax, [r for r in rows if r["model"] == "/m/draft-20m"],
                              ["C0", "C1"])
    heights = sorted(round(bar.get_height(), 6) for bar in ax.patches)
    assert heights == sorted(round(r["ms_per_forward"], 6) for r in rows
                             if r["model"] == "/m/draft-20m")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fused default", "fused pf"]
    plt.close(fig)
    out = tmp_path / "settings.png"
    plots.plot_draft({"provenance": PROV, "context": 16, "rows": rows}, str(out))
    check_png(out)
