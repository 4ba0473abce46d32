"""The --plot flags the benchmark scripts share: after writing its JSON a script draws its
picture of the run (matplotlib is imported only then)."""
import argparse
from typing import Any


def add_plot_args(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """--plot FILE.png; with several (a picture drawn from many runs) also --plot-with."""
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="draw this run's picture (benchmarks/plots.py) to FILE.png")
    if several:
        parser.add_argument("--plot-with", nargs="*", default=[], metavar="RESULT.json",
                            help="earlier runs' JSON drawn with this run in --plot")


def plot_run(kind: str, result: dict, args: Any) -> None:
    """kind's picture of result (with the runs of --plot-with) at args.plot, if given."""
    if not getattr(args, "plot", None):
        return
    from benchmarks import plots

    runs = [{**result, "args": vars(args)}] + plots.load(getattr(args, "plot_with", None) or [])
    print(f"wrote {plots.PLOTS[kind](runs, args.plot)}")
