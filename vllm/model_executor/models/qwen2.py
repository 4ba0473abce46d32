"""The Qwen2 family (Qwen2, Qwen2.5): the Llama architecture with biases on q, k and v."""
from vllm.model_executor.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
