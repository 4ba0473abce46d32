"""`vllm`: the console command. `vllm serve MODEL [flags]` starts the OpenAI-compatible server
with the flags of `python -m vllm.entrypoints.openai.api_server`."""
import argparse
from typing import Optional

import vllm
from vllm import huge_pages


def _serve(args: argparse.Namespace) -> None:
    from vllm.entrypoints.openai.api_server import run_server

    if args.model_tag is not None:
        args.model = args.model_tag
    run_server(args)


def make_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.openai.api_server import make_arg_parser

    parser = argparse.ArgumentParser(prog="vllm", description="vLLM-compatible inference engine")
    parser.add_argument("-v", "--version", action="version", version=vllm.__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible API server",
                           usage="vllm serve MODEL [flags]")
    serve.add_argument("model_tag", nargs="?", default=None,
                       help="HF checkpoint directory or .gguf file (or use --model)")
    make_arg_parser(serve)
    serve.set_defaults(func=_serve)
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    huge_pages.request()  # before torch loads (vllm.huge_pages)
    args = make_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
