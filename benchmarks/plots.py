"""The benchmarks' pictures, drawn from their result JSON (one function per picture; missing
optional fields are left out of the picture, so JSON from older runs still draws):

    plot_spec_decode  tokens/s and tau against k, one line per proposer (benchmark_spec_decode)
    plot_serving      output tokens/s and TPOT against concurrency, one line per configuration,
                      from several runs (benchmark_serving)
    plot_draft        ms per draft forward against threads, per dtype, with its floor
                      (benchmark_draft)
    plot_latency      decode step against batch size with its floor, from several runs
                      (benchmark_latency)
    plot_profile      the target step (CUDA graph replay) over its floor per batch x tokens,
                      a bar per setting, from several runs of one shape (profile_step)

    python benchmarks/plots.py {spec,serving,draft,latency,profile} OUT.png RESULT.json [...]

Headless (the Agg backend); a picture is 900 x 550 pixels."""
import argparse
import io
import json
import os
from collections import defaultdict
from typing import Iterable, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402

SIZE_IN, DPI = (9.0, 5.5), 100
MARKERS = "osD^v"
PROPOSER_NAMES = {"none": "no speculation", "draft-cpu": "draft on CPU",
                  "draft-cpu+ahead": "draft on CPU, drafting ahead", "draft-cuda": "draft on GPU",
                  "ngram": "n-gram", "draft": "draft"}


def load(paths: Iterable[str]) -> list[dict]:
    out = []
    for path in paths:
        with open(path) as f:
            out.append(json.load(f))
    return out


def value(v):
    """A figure given as a number or as {"median": ..., "min": ..., "max": ...}."""
    return v.get("median") if isinstance(v, dict) else v


def machine(result: dict, host: bool = False) -> str:
    """'NVIDIA H200' for a GPU run, 'NVIDIA H200 host CPU' for a CPU-only benchmark (host) on
    that machine, else 'CPU, N threads'."""
    prov = result.get("provenance", {})
    if prov.get("gpu") and (host or result.get("device", "cuda") != "cpu"):
        return prov["gpu"] + (" host CPU" if host else "")
    threads = prov.get("cpu_threads")
    return "CPU" + (f", {threads} threads" if threads and not host else "")


def commit(result: dict) -> str:
    prov = result.get("provenance", {})
    c = prov.get("commit", "unknown")
    if c == "unknown" and prov.get("source_sha256"):
        return f"source {prov['source_sha256']}"
    return f"commit {c}"


def title_of(what: str, results: list[dict], host: bool = False) -> str:
    """what, then the machines and commits of the runs drawn."""
    machines = sorted({machine(r, host) for r in results})
    commits = sorted({commit(r) for r in results})
    if len(commits) > 3:
        commits = commits[:3] + ["..."]
    return f"{what}\n{' / '.join(machines)}; {', '.join(commits)}"


def model_name(path: Optional[str]) -> str:
    """The last path component a model was given by (a directory or a file)."""
    if not path:
        return "?"
    base = os.path.basename(str(path).rstrip("/"))
    return base[:-5] if base.endswith(".gguf") else base


def figure(ncols: int = 1):
    fig, axes = plt.subplots(1, ncols, figsize=SIZE_IN, dpi=DPI)
    return fig, ([axes] if ncols == 1 else list(axes))


def shared_legend(fig, axes, ncol: int = 3) -> float:
    """One legend for all panels, under them (the lines' labels, each once); the fraction of
    the figure's height it takes."""
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    if not labels:
        return 0.0
    rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8.5, frameon=False)
    return 0.02 + 0.042 * rows


def save(fig, title: str, path: str, bottom: float = 0.0) -> str:
    """Title, layout (leaving bottom of the height to a shared legend), and a palette PNG
    (a few tens of KB)."""
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    plt.close(fig)
    buf.seek(0)
    from PIL import Image
    Image.open(buf).convert("RGB").quantize(colors=128).save(path, optimize=True)
    return path


def _proposer(row: dict, result: dict) -> str:
    """The row's proposer; older runs named none (their one draft came from the command)."""
    if row.get("proposer"):
        return row["proposer"]
    if row.get("k", 0) == 0:
        return "none"
    return "draft-cpu" if "--cpu-draft-worker" in result.get("provenance", {}).get(
        "command", "") else "draft"


def plot_spec_decode(result: dict, path: str) -> str:
    """Left: end-to-end tokens/s against k per proposer (solid), the rate drafting for free would
    give (dotted, same colour: tau x the plain step / the verification step), the plain rate and
    the transformers baselines (horizontal). Right: tau against k per proposer, under its bound
    k + 1 (every drafted token accepted)."""
    rows = result.get("rows", [])
    plain = next((r for r in rows if r.get("k", 0) == 0), None)
    by_proposer = defaultdict(list)
    for r in rows:
        if r.get("k", 0) > 0:
            by_proposer[_proposer(r, result)].append(r)
    fig, (ax_rate, ax_tau) = figure(2)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    all_k = sorted({r["k"] for rs in by_proposer.values() for r in rs})
    for i, (name, rs) in enumerate(by_proposer.items()):
        rs = sorted(rs, key=lambda r: r["k"])
        ks, color = [r["k"] for r in rs], colors[i % len(colors)]
        label = PROPOSER_NAMES.get(name, name)
        style = dict(color=color, label=label, marker=MARKERS[i % len(MARKERS)],
                     markersize=max(8 - 1.5 * i, 4))  # equal points stay visible
        ax_rate.plot(ks, [r["tokens_per_s"] for r in rs], "-", **style)
        if plain and all("bound_free_draft" in r for r in rs):
            ax_rate.plot(ks, [r["bound_free_draft"] * plain["tokens_per_s"] for r in rs], ":",
                         color=color, alpha=0.8)
        if all("tau" in r for r in rs):
            ax_tau.plot(ks, [r["tau"] for r in rs], "-", **style)
    if plain:
        ax_rate.axhline(plain["tokens_per_s"], color="black", ls="--", lw=1,
                        label=f"no speculation ({plain['tokens_per_s']:.0f})")
    for r, ls in zip(result.get("hf_transformers", []), ("-.", (0, (1, 3)))):
        ax_rate.axhline(r["tokens_per_s"], color="gray", ls=ls, lw=1,
                        label=f"HF transformers {r['mode']} ({r['tokens_per_s']:.0f})")
    if any(r.get("bound_free_draft") for rs in by_proposer.values() for r in rs):
        ax_rate.plot([], [], ":", color="gray", label="dotted: if drafting were free")
    if all_k:
        ax_tau.plot(all_k, [k + 1 for k in all_k], "--", color="black", lw=1,
                    label="bound: k + 1 (all accepted)")
    for ax in (ax_rate, ax_tau):
        ax.set_xlabel("k (drafted tokens per step)")
        ax.set_xticks(all_k or [0])
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_rate.set_ylabel("output tokens/s (end to end)")
    ax_tau.set_ylabel("tau (tokens per target forward)")
    bottom = shared_legend(fig, (ax_rate, ax_tau))
    what = (f"Speculative decoding: {result.get('prompts', '?')} prompts x "
            f"{result.get('num_prompts', '?')}, batch {result.get('batch_size', 'all')}, "
            f"{result.get('max_tokens', '?')} tokens, greedy")
    return save(fig, title_of(what, [result]), path, bottom)


def serving_point(result: dict) -> Optional[tuple[str, int]]:
    """(configuration label, concurrency) of a serving run: requests in flight at once is
    max_concurrency where given, else all prompts when they were sent at once."""
    args = result.get("args", {})
    label = result.get("label") or args.get("label") or model_name(args.get("model"))
    conc = result.get("max_concurrency") or args.get("max_concurrency")
    if conc is None and str(args.get("request_rate", "inf")) == "inf":
        conc = args.get("num_prompts") or result.get("completed")
    return (label, int(conc)) if conc else None


def plot_serving(results: list[dict], path: str) -> str:
    """Left: output tokens/s against concurrency. Right: TPOT median (solid) and p90 (dotted)
    against concurrency. One line per configuration (the run's label)."""
    lines = defaultdict(list)
    for r in results:
        point = serving_point(r)
        if point is None:
            print(f"plot_serving: skipping a run without a concurrency ({r.get('args', {})})")
            continue
        lines[point[0]].append((point[1], r))
    fig, (ax_rate, ax_tpot) = figure(2)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    concs, any_p90 = set(), False
    for i, (label, pts) in enumerate(sorted(lines.items())):
        pts.sort(key=lambda p: p[0])
        xs, color = [p[0] for p in pts], colors[i % len(colors)]
        concs.update(xs)
        ax_rate.plot(xs, [p[1]["output_throughput"] for p in pts], "o-", color=color, label=label)
        tpot = [(x, p["tpot_ms"]) for x, p in pts if p.get("tpot_ms", {}).get("50") is not None]
        if tpot:
            ax_tpot.plot([x for x, _ in tpot], [t["50"] for _, t in tpot], "o-", color=color,
                         label=label)
            p90 = [(x, t["90"]) for x, t in tpot if t.get("90") is not None]
            ax_tpot.plot([x for x, _ in p90], [v for _, v in p90], ":", color=color)
            any_p90 = any_p90 or bool(p90)
    if any_p90:
        ax_tpot.plot([], [], ":", color="gray", label="dotted: p90")
    for ax in (ax_rate, ax_tpot):
        ax.set_xlabel("concurrency (requests in flight)")
        if concs and max(concs) / min(concs) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(concs) or [1])
        ax.set_xticklabels([str(c) for c in sorted(concs)] or ["1"])
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_rate.set_ylabel("output tokens/s (all requests)")
    ax_tpot.set_ylabel("TPOT (ms per output token after the first)")
    args = next((r.get("args", {}) for r in results), {})
    prompts = ("HumanEval prompts" if args.get("dataset") == "humaneval"
               else f"input {args.get('input_len', '?')}")
    what = (f"Serving: {prompts}, output {args.get('output_len', '?')} "
            f"tokens, temperature {args.get('temperature', '?')}")
    return save(fig, title_of(what, results), path, shared_legend(fig, (ax_rate, ax_tpot)))


def plot_draft(result: dict, path: str) -> str:
    """Per model a panel of ms per one-token draft forward against threads (median, min-max
    bars), a line per batch size, dtype and path, its floor dashed in the same colour; where the
    rows carry decode_layers' stage times, one more panel: each model's batch sizes at its most
    threads as stacked stages (ms)."""
    rows = result.get("rows", [])
    models = list(dict.fromkeys(r.get("model", "?") for r in rows)) or ["?"]
    staged = [r for r in rows if r.get("stage_ms")]
    fig, axes = figure(len(models) + (1 if staged else 0))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    one_count = all(len({r["threads"] for r in rows if r.get("model", "?") == m}) == 1
                    for m in models)
    for ax, name in zip(axes, models):
        if one_count and rows:  # one thread count: the settings side by side
            plot_draft_settings(ax, [r for r in rows if r.get("model", "?") == name], colors)
            continue
        lines = defaultdict(list)
        for r in rows:
            if r.get("model", "?") == name:
                lines[(r.get("batch_size", 1), r.get("dtype", "?"), r.get("path", ""))].append(r)
        threads = set()
        for i, ((bs, dtype, path_), rs) in enumerate(sorted(lines.items(), key=str)):
            rs.sort(key=lambda r: r["threads"])
            xs, color = [r["threads"] for r in rs], colors[i % len(colors)]
            threads.update(xs)
            ms = [value(r["ms_per_forward"]) for r in rs]
            err = None
            if all("min" in r and "max" in r for r in rs):
                err = [[m - r["min"] for m, r in zip(ms, rs)],
                       [r["max"] - m for m, r in zip(ms, rs)]]
            label = f"batch {bs}, {dtype}" + (f", {path_}" if path_ else "")
            ax.errorbar(xs, ms, yerr=err, fmt="o-", color=color, capsize=3, label=label)
            if all("floor_ms" in r for r in rs):
                ax.plot(xs, [value(r["floor_ms"]) for r in rs], "--", marker="_",
                        markersize=14, color=color, label=f"{label}: floor")
        if threads and max(threads) > 2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(threads) or [1])
        ax.set_xticklabels([str(t) for t in sorted(threads)] or ["1"])
        ax.set_xlabel("CPU threads")
        ax.set_ylabel("ms per one-token forward")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(model_name(name), fontsize=10)
    # one legend under the models' panels (the same lines in each): inside the first panel it
    # covered that model's points
    bottom = shared_legend(fig, axes[:len(models)])
    if staged:
        plot_draft_stages(axes[-1], staged, [plt.get_cmap("tab20")(i) for i in range(20)])
    what = (f"CPU draft forward (dashed: weights + KV over the host's copy rate), context "
            f"{result.get('mean_context', result.get('context', '?'))}")
    return save(fig, title_of(what, [result], host=True), path, bottom)


def plot_draft_settings(ax, rows: list[dict], colors: list) -> None:
    """One model's rows at one thread count as bars: a group per path (a setting of an A/B), a
    bar per batch size and dtype (its median; a tick at its minimum; its floor a dashed step in
    the bar's colour). The maxima are left out: a host's occasional 10x forward would set the
    scale."""
    paths = list(dict.fromkeys(r.get("path", "") for r in rows))
    series = sorted({(r.get("batch_size", 1), r.get("dtype", "?")) for r in rows}, key=str)
    width = 0.8 / max(1, len(series))
    for i, (bs, dtype) in enumerate(series):
        color = colors[i % len(colors)]
        for j, path_ in enumerate(paths):
            r = next((r for r in rows if r.get("path", "") == path_
                      and (r.get("batch_size", 1), r.get("dtype", "?")) == (bs, dtype)), None)
            if r is None:
                continue
            x = j - 0.4 + width * (i + 0.5)
            ax.bar(x, value(r["ms_per_forward"]), width * 0.9, color=color,
                   label=f"batch {bs}, {dtype}" if j == 0 else None)
            if "min" in r:
                ax.plot([x - width * 0.3, x + width * 0.3], [r["min"]] * 2, color="black", lw=1)
            if "floor_ms" in r:
                ax.plot([x - width * 0.45, x + width * 0.45], [value(r["floor_ms"])] * 2, "--",
                        color=color, lw=1.2,
                        label=f"batch {bs}, {dtype}: floor" if j == 0 else None)
    ax.set_xticks(range(len(paths)))
    ax.set_xticklabels([p or "default" for p in paths], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(f"ms a forward at {rows[0]['threads']} threads (median; tick: min)",
                  fontsize=8)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(model_name(rows[0].get("model")), fontsize=10)


def stage_bars(rows: list[dict]) -> dict:
    """The rows plot_draft_stages draws, by (model, batch size, path): each at its most threads
    (the first dtype); a path per setting of an A/B (benchmark_draft.py --settings)."""
    picked = {}
    for r in rows:
        key = (r.get("model", "?"), r.get("batch_size", 1), r.get("path", ""))
        if key not in picked or r["threads"] > picked[key]["threads"]:
            picked[key] = r
    return picked


def plot_draft_stages(ax, rows: list[dict], colors: list) -> None:
    """Stacked stage times (decode_layers' stages and what the forward spends outside it) of
    each model's batch sizes and paths (stage_bars)."""
    picked = stage_bars(rows)
    stages = list(dict.fromkeys(k for r in picked.values() for k in r["stage_ms"]))
    labels = [f"{model_name(m)[:12]} b{bs}, {picked[(m, bs, p)]['threads']} thr"
              + (f", {p}" if p else "") for m, bs, p in picked]
    bottoms = [0.0] * len(picked)
    for i, stage in enumerate(stages):
        heights = [max(0.0, r["stage_ms"].get(stage, 0.0)) for r in picked.values()]
        ax.bar(range(len(picked)), heights, bottom=bottoms, color=colors[i % len(colors)],
               label={"outside_decode_layers": "rest",
                      "lm_head": "LM head (argmax)"}.get(stage, stage))
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(picked)))
    ax.set_xticklabels(labels, fontsize=6, rotation=60, ha="right")
    ax.set_ylabel("ms per forward, by stage")
    ax.set_title("where a step goes", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], fontsize=6, loc="upper left")
    ax.set_ylim(0, max(bottoms) * 1.9 if bottoms else 1)  # room for the legend above the bars


def profile_group(path: str, result: dict) -> tuple[str, str]:
    """A profile_step JSON's picture (its runs of one shape: MACHINE_RUN_profile_SHAPE) and
    its bar's label (what its file name says past the shape: the setting, e.g. pdl; else
    default)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    prefix, _, rest = stem.partition("_profile_")
    model = model_name(result.get("args", {}).get("model"))
    label = rest.replace(model, "").strip("_").replace("_", ", ") or "default"
    return f"{prefix}_profile_{model}", label


def plot_profile(results: list[dict], labels: list[str], path: str) -> str:
    """Grouped bars: per batch x tokens a bar per run (its label: the setting it ran with) of
    the graph-replayed step over its floor, the ms written on the bar; the floor at 1."""
    shapes = list(dict.fromkeys((r["batch"], r["tokens_per_seq"]) for res in results
                                for r in res.get("rows", [])))
    fig, axes = figure()
    ax = axes[0]
    width = 0.8 / max(1, len(results))
    for i, (res, label) in enumerate(zip(results, labels)):
        by_shape = {(r["batch"], r["tokens_per_seq"]): r for r in res.get("rows", [])}
        xs, ys, ms = [], [], []
        for j, shape in enumerate(shapes):
            r = by_shape.get(shape)
            if r and r.get("floor_ms"):
                xs.append(j + (i - (len(results) - 1) / 2) * width)
                ys.append(r["graph_ms"] / r["floor_ms"])
                ms.append(r["graph_ms"])
        bars = ax.bar(xs, ys, width, label=label)
        for bar, m in zip(bars, ms):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{m:.2f}",
                    ha="center", va="bottom", fontsize=6, rotation=90)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="floor")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"batch {b} x {q}" for b, q in shapes])
    ax.set_ylabel("step time / floor (ms on the bars)")
    ax.set_ylim(0.9, max([1.2] + [r["graph_ms"] / r["floor_ms"] for res in results
                                  for r in res.get("rows", []) if r.get("floor_ms")]) * 1.12)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left")
    model = model_name(results[0].get("args", {}).get("model")) if results else "?"
    what = (f"{model} target step, CUDA graph replay (floor: weights + KV over the copy rate "
            "of the same run)")
    return save(fig, title_of(what, results), path)


def batch_of(result: dict) -> int:
    return result.get("args", {}).get("batch_size", 1)


def latency_config(result: dict) -> str:
    """The label of a latency run's configuration: model, dtype, speculation, lengths."""
    args = result.get("args", {})
    parts = [model_name(args.get("model")), args.get("dtype") or ""]
    if args.get("load_format") == "dummy":
        parts[0] += " (random weights)"
    if args.get("speculative_model"):
        where = "CPU" if args.get("cpu_draft_worker") else "same device"
        parts.append(f"+ draft {model_name(args['speculative_model'])} on {where}, "
                     f"k={args.get('num_speculative_tokens', '?')}")
    parts.append(f"in {args.get('input_len', '?')} / out {args.get('output_len', '?')}")
    return ", ".join(p for p in parts if p)


def _by_batch(pairs: list[tuple[int, float]]) -> tuple[list[int], list[float], list, list]:
    """(batch, figure) pairs of several runs -> batches, the median per batch, and the distance
    from it down to the smallest and up to the largest (error bars)."""
    per = defaultdict(list)
    for x, y in pairs:
        per[x].append(y)
    xs = sorted(per)
    mids = [float(np.median(per[x])) for x in xs]
    return (xs, mids, [m - min(per[x]) for x, m in zip(xs, mids)],
            [max(per[x]) - m for x, m in zip(xs, mids)])


def plot_latency(results: list[dict], path: str) -> str:
    """Decode step (ms; a token for every sequence) against batch size, one line per
    configuration (engine solid, transformers baseline dash-dot) through the median of its runs
    at each batch size, bars from the fastest to the slowest run; the floor dashed in the
    configuration's colour. The y axis is logarithmic when the figures span more than 10x."""
    groups = defaultdict(list)
    for r in results:
        if "engine" in r:
            groups[latency_config(r)].append(r)
    fig, (ax,) = figure(1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    batches, values = set(), []
    for i, (label, rs) in enumerate(sorted(groups.items())):
        color = colors[i % len(colors)]
        runs = f" ({len(rs)} runs)" if len(rs) > len({batch_of(r) for r in rs}) else ""
        for key, style, name in (("engine", "o-", "engine"),
                                 ("hf_transformers", "s-.", "HF transformers")):
            pairs = [(batch_of(r), value(r[key]["decode_step_ms"])) for r in rs if key in r]
            if not pairs:
                continue
            xs, ys, lo, hi = _by_batch(pairs)
            batches.update(xs)
            values += [y for _, y in pairs]
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, color=color, capsize=3,
                        label=f"{name}: {label}{runs}")
        floors = [(batch_of(r), value(r["decode_floor_ms"])) for r in rs
                  if "decode_floor_ms" in r]
        if floors:
            xs, ys, _, _ = _by_batch(floors)
            ax.plot(xs, ys, "--", color=color, alpha=0.7,
                    label="floor (weights + KV / bandwidth)" if i == 0 else None)
            values += ys
    if batches and max(batches) > 2:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches) or [1])
    ax.set_xticklabels([str(b) for b in sorted(batches)] or ["1"])
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else ""))
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("decode step (ms; a token for every sequence)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="best")
    return save(fig, title_of("Decode step against batch size (dashed: floor)", results), path)


PLOTS = {"spec": lambda rs, out: plot_spec_decode(rs[0], out),
         "serving": plot_serving,
         "draft": lambda rs, out: plot_draft(rs[0], out),
         "latency": plot_latency}


def main(argv: Optional[list[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=sorted([*PLOTS, "profile"]))  # profile: labels from
    # the file names (profile_group)
    parser.add_argument("output", help="the PNG to write")
    parser.add_argument("results", nargs="+", help="result JSON (spec and draft: the first)")
    args = parser.parse_args(argv)
    if args.kind == "profile":
        results = load(args.results)
        labels = [profile_group(p, r)[1] for p, r in zip(args.results, results)]
        return plot_profile(results, labels, args.output)
    return PLOTS[args.kind](load(args.results), args.output)


if __name__ == "__main__":
    print(main())
