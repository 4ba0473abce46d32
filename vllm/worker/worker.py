"""Worker: one device's share of the engine: its model runner, its KV cache, its threads."""
import os
from typing import Callable, Optional

import torch

from vllm import envs
from vllm.config import VllmConfig
from vllm.core.scheduler import SchedulerOutput
from vllm.distributed.parallel_state import get_world
from vllm.logger import init_logger
from vllm.worker import kv_cache
from vllm.worker.model_runner import ModelRunner, RunnerOutput

logger = init_logger(__name__)


class Worker:

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        tp = config.parallel_config.tensor_parallel_size
        if config.device.type == "cpu" and envs.VLLM_CPU_NUM_THREADS > 0:
            torch.set_num_threads(envs.VLLM_CPU_NUM_THREADS)
        elif config.device.type == "cpu" and tp > 1:  # the ranks share this host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
        if config.device.type == "cuda":
            torch.cuda.set_device(config.device)
        self.model_runner = ModelRunner(config)

    def load_model(self) -> None:
        self.model_runner.load_model()

    def initialize_cache(self) -> int:
        """Sizes the KV cache from the memory left after weights and activations; allocates it."""
        peak = self.model_runner.profile_peak_memory()
        # every tensor-parallel rank holds the same blocks: the smallest count fits them all
        num_blocks = get_world().min_int(kv_cache.num_blocks_for_memory(self.config, peak))
        self.model_runner.initialize_cache(num_blocks)
        logger.info("KV cache on %s: %d blocks of %d tokens (%.2f GB)", self.config.device,
                    num_blocks, self.config.cache_config.block_size,
                    num_blocks * kv_cache.block_bytes(self.config) / 1e9)
        return num_blocks

    def execute_model(self, out: SchedulerOutput,
                      before_sync: Optional[Callable[[], None]] = None) -> RunnerOutput:
        return self.model_runner.execute_model(out, before_sync)
