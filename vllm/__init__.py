"""A vLLM-compatible inference engine whose headline feature is heterogeneous speculative
decoding: the target model on the GPU, the draft model (or a model-free proposer) on the CPU.

Public names load lazily so that `import vllm` stays free of side effects."""
from vllm.lazy_exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "entrypoints.llm",
    "SamplingParams": "sampling_params",
    "RequestOutput": "outputs",
    "CompletionOutput": "outputs",
    "EngineArgs": "engine.arg_utils",
    "LLMEngine": "engine.llm_engine",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
