"""The project's logger: `init_logger(__name__)` gives a child of the `vllm` logger."""
import logging
import os
import sys

_FORMAT = "%(levelname)s %(asctime)s {process}%(filename)s:%(lineno)d] %(message)s"
_configured = False


def _configure_root() -> None:
    global _configured
    if _configured:
        return
    from vllm import envs

    root = logging.getLogger("vllm")
    handler = logging.StreamHandler(sys.stdout)
    # processes the engine starts name themselves (VLLM_PROCESS_NAME): one stream, each line
    # says which process wrote it
    name = os.environ.get("VLLM_PROCESS_NAME")
    fmt = _FORMAT.format(process=f"({name} pid=%(process)d) " if name else "")
    handler.setFormatter(logging.Formatter(fmt, datefmt="%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(envs.VLLM_LOGGING_LEVEL)
    root.propagate = False
    _configured = True


def init_logger(name: str) -> logging.Logger:
    _configure_root()
    return logging.getLogger(name)
