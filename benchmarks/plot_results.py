"""Redraws every picture from the result JSON in a directory (default benchmarks/results/), so
the figures in RESULTS.md are never edited by hand:

    python benchmarks/plot_results.py [--results-dir DIR] [--out-dir DIR]

A speculative-decoding sweep or draft-forward run gives one picture named after its JSON
(NAME.json -> NAME.png); latency runs are grouped by the file name's machine prefix (the part
before the first '_', e.g. h200_...) into PREFIX_latency.png; serving runs by their first two
name parts, one picture per sweep (h200_serving3_mp_plain_c1.json -> h200_serving3.png);
profile_step runs by run and shape, a bar per setting (h100_run25_profile_llama-2-7b_pdl.json ->
h100_run25_profile_llama-2-7b.png). Other JSON (kernels, trained pairs) are skipped."""
import argparse
import glob
import os
import sys
from collections import defaultdict
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import plots  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def kind_of(result: dict) -> Optional[str]:
    """Which benchmark wrote the result: spec, draft, latency, serving, or None."""
    if "engine" in result and "decode_step_ms" in result["engine"]:
        return "latency"
    if "output_throughput" in result:
        return "serving"
    rows = result.get("rows")
    if rows and isinstance(rows, list) and isinstance(rows[0], dict):
        if "threads" in rows[0] and "ms_per_forward" in rows[0]:
            return "draft"
        if "k" in rows[0] and "tokens_per_s" in rows[0]:
            return "spec"
        if "graph_ms" in rows[0] and "tokens_per_seq" in rows[0]:
            return "profile"
    return None


def redraw(results_dir: str = RESULTS_DIR, out_dir: Optional[str] = None) -> list[str]:
    """Every picture the JSON in results_dir give, written to out_dir (default: results_dir);
    the paths written."""
    out_dir = out_dir or results_dir
    os.makedirs(out_dir, exist_ok=True)
    grouped = defaultdict(list)  # (kind, picture name) -> results
    written = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        stem = os.path.splitext(os.path.basename(path))[0]
        result = plots.load([path])[0]
        kind = kind_of(result)
        if kind == "spec":
            written.append(plots.plot_spec_decode(result, os.path.join(out_dir, stem + ".png")))
        elif kind == "draft":
            written.append(plots.plot_draft(result, os.path.join(out_dir, stem + ".png")))
        elif kind == "latency":
            grouped[(kind, stem.split("_")[0] + "_latency")].append(result)
        elif kind == "serving":  # one picture per sweep: machine_run
            grouped[(kind, "_".join(stem.split("_")[:2]))].append(result)
        elif kind == "profile":  # one picture per run and shape, a bar per setting
            name, label = plots.profile_group(path, result)
            grouped[(kind, name)].append((label, result))
        else:
            print(f"skipped {os.path.basename(path)} (no picture for it)")
    for (kind, name), results in sorted(grouped.items()):
        out = os.path.join(out_dir, f"{name}.png")
        if kind == "latency":
            batches = defaultdict(set)
            for r in results:
                batches[plots.latency_config(r)].add(r.get("args", {}).get("batch_size", 1))
            if max(len(b) for b in batches.values()) < 2:
                print(f"skipped {name}.png: no configuration ran more than one batch "
                      "size")
                continue
            written.append(plots.plot_latency(results, out))
        elif kind == "profile":
            written.append(plots.plot_profile([r for _, r in results],
                                              [label for label, _ in results], out))
        else:
            written.append(plots.plot_serving(results, out))
    return written


def main(argv: Optional[list[str]] = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    parser.add_argument("--out-dir", default=None, help="default: the results directory")
    args = parser.parse_args(argv)
    written = redraw(args.results_dir, args.out_dir)
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
