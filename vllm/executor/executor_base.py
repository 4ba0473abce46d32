"""The one interface the engine drives the model through: load the weights, size and allocate the
KV cache, run a step. Which executor runs it follows the parallel config: the worker in this
process for tensor_parallel_size 1 (no indirection beyond a call), else one process per rank
(multiprocessing on one host, or Ray)."""
from abc import ABC, abstractmethod
from typing import Callable, Optional

from vllm.config import VllmConfig
from vllm.core.scheduler import SchedulerOutput
from vllm.worker.model_runner import RunnerOutput
from vllm.worker.worker import Worker


class Executor(ABC):
    driver_worker: Worker  # rank 0's worker, in this process: its model runner, for inspection

    @abstractmethod
    def load_model(self) -> None:
        ...

    @abstractmethod
    def initialize_cache(self) -> int:
        """Allocates the KV cache on every rank; returns its number of blocks (the same on
        all ranks)."""

    @abstractmethod
    def execute_model(self, out: SchedulerOutput,
                      before_sync: Optional[Callable[[], None]] = None) -> RunnerOutput:
        """One step on every rank; the driver's sampled tokens."""

    def shutdown(self) -> None:
        """Stops the other ranks' processes (nothing to stop with one rank)."""


class UniProcExecutor(Executor):
    """tensor_parallel_size 1: the worker in this process, called directly."""

    def __init__(self, config: VllmConfig) -> None:
        self.driver_worker = Worker(config)

    def load_model(self) -> None:
        self.driver_worker.load_model()

    def initialize_cache(self) -> int:
        return self.driver_worker.initialize_cache()

    def execute_model(self, out: SchedulerOutput,
                      before_sync: Optional[Callable[[], None]] = None) -> RunnerOutput:
        return self.driver_worker.execute_model(out, before_sync)


def create_executor(config: VllmConfig) -> Executor:
    pc = config.parallel_config
    if pc.tensor_parallel_size == 1:
        return UniProcExecutor(config)
    if pc.distributed_executor_backend == "ray":
        from vllm.executor.ray_executor import RayExecutor
        return RayExecutor(config)
    from vllm.executor.multiproc_executor import MultiprocExecutor
    return MultiprocExecutor(config)
