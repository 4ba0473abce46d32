"""The CPU KV cache holds host memory for the tokens written, not for VLLM_CPU_KVCACHE_SPACE."""
from types import SimpleNamespace

import torch

from vllm.config import CacheConfig, ParallelConfig
from vllm.worker import kv_cache


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_cpu_kv_cache_is_held_as_written():
    hf_config = SimpleNamespace(num_hidden_layers=2, num_attention_heads=16,
                                num_key_value_heads=16, hidden_size=1024)
    config = SimpleNamespace(hf_config=hf_config, cache_config=CacheConfig(block_size=16),
                             parallel_config=ParallelConfig(),
                             torch_dtype=torch.float32, device=torch.device("cpu"))
    num_blocks = 2048  # 2 layers x K/V x 2048 blocks x 16 tokens x 1024 floats: 128 MiB each
    before = resident_bytes()
    caches = kv_cache.allocate_kv_caches(config, num_blocks)
    nominal = sum(k.numel() * 4 + v.numel() * 4 for k, v in caches)
    assert nominal == 4 * (128 << 20)
    assert resident_bytes() - before < nominal // 8
    for k, v in caches:  # a few blocks written: they read back
        k[:4] = 1.0
        v[:4] = 2.0
    assert all(k[:4].eq(1).all() and v[:4].eq(2).all() for k, v in caches)
    assert resident_bytes() - before < nominal // 2
