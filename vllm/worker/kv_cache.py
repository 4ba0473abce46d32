"""KV cache allocation: per layer a key and a value cache of [num_blocks, num_kv_heads,
block_size, head_size], on the model's device. The number of blocks comes from free GPU memory
(gpu_memory_utilization) on the GPU and from VLLM_CPU_KVCACHE_SPACE on the CPU, never more than
max_num_seqs sequences at max_model_len can use.

On the CPU the space is a bound, not a cost: a large cache is allocated untouched (the OS maps
zeroed pages on first write), and the block pool hands out the most recently freed blocks first,
so the host memory held follows the tokens actually cached, not VLLM_CPU_KVCACHE_SPACE."""
from typing import Any

import torch

from vllm import envs
from vllm.config import VllmConfig


def kv_shape(hf_config: Any, tensor_parallel_size: int = 1) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_size) of a Llama-family config; the KV heads of one rank
    under tensor parallelism (one, replicated, when there are fewer KV heads than ranks)."""
    num_heads = hf_config.num_attention_heads
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    return (hf_config.num_hidden_layers, max(1, num_kv_heads // tensor_parallel_size),
            head_size)


def block_bytes(config: VllmConfig) -> int:
    num_layers, num_kv_heads, head_size = kv_shape(
        config.hf_config, config.parallel_config.tensor_parallel_size)
    elem = torch.tensor([], dtype=config.torch_dtype).element_size()
    return 2 * num_layers * num_kv_heads * config.cache_config.block_size * head_size * elem


def num_blocks_for_memory(config: VllmConfig, peak_activation_bytes: int = 0) -> int:
    """Blocks that fit the device's KV budget (after weights and the measured activation peak)."""
    cc = config.cache_config
    if cc.num_gpu_blocks_override is not None:
        return cc.num_gpu_blocks_override
    if config.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(config.device)
        used = total - free
        budget = int(total * cc.gpu_memory_utilization) - used - peak_activation_bytes
    else:
        budget = int(envs.VLLM_CPU_KVCACHE_SPACE * (1 << 30))
    num_blocks = budget // block_bytes(config)
    # never more than every sequence at full length could use
    max_useful = config.scheduler_config.max_num_seqs * -(-config.model_config.max_model_len //
                                                         cc.block_size)
    num_blocks = min(num_blocks, max_useful)
    if num_blocks < 1:
        raise ValueError("no memory left for the KV cache: raise gpu_memory_utilization (GPU) or "
                         "VLLM_CPU_KVCACHE_SPACE (CPU), or use a smaller max_num_batched_tokens")
    return num_blocks


def allocate_kv_caches(config: VllmConfig,
                       num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    num_layers, num_kv_heads, head_size = kv_shape(
        config.hf_config, config.parallel_config.tensor_parallel_size)
    shape = (num_blocks, num_kv_heads, config.cache_config.block_size, head_size)
    kw = dict(dtype=config.torch_dtype, device=config.device)
    nbytes = torch.Size(shape).numel() * torch.tensor([], dtype=config.torch_dtype).element_size()
    # above malloc's largest heap chunk (32 MiB) an allocation is a fresh mmap: zero pages that
    # cost memory only once written
    alloc = torch.empty if config.device.type == "cpu" and nbytes > (64 << 20) else torch.zeros
    return [(alloc(shape, **kw), alloc(shape, **kw)) for _ in range(num_layers)]
