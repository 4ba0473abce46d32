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


def resolve_model_class(hf_config: Any) -> type[nn.Module]:
    architectures = getattr(hf_config, "architectures", None) or []
    for arch in architectures:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(f"model architecture(s) {architectures} not supported; supported: "
                     f"{sorted(MODEL_REGISTRY)}")
