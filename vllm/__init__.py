"""A vLLM-compatible inference engine whose headline feature is heterogeneous speculative
decoding: the target model on the GPU, the draft model (or a model-free proposer) on the CPU.

Public names load lazily so that `import vllm` stays free of side effects."""
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "vllm.entrypoints.llm",
    "SamplingParams": "vllm.sampling_params",
    "RequestOutput": "vllm.outputs",
    "CompletionOutput": "vllm.outputs",
    "EngineArgs": "vllm.engine.arg_utils",
    "LLMEngine": "vllm.engine.llm_engine",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vllm' has no attribute {name!r}")
