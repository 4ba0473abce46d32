"""Model registry: the `architectures` entry of config.json -> the model class."""
from typing import Any

from torch import nn

from vllm.model_executor.models.llama import LlamaForCausalLM, MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
}


# configs without `architectures` (those built from GGUF metadata) name their model_type
_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM"}


def resolve_model_class(hf_config: Any) -> type[nn.Module]:
    architectures = getattr(hf_config, "architectures", None) or []
    if not architectures and getattr(hf_config, "model_type", None) in _BY_MODEL_TYPE:
        architectures = [_BY_MODEL_TYPE[hf_config.model_type]]
    for arch in architectures:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(f"model architecture(s) {architectures} not supported; supported: "
                     f"{sorted(MODEL_REGISTRY)}")
