"""Tensor parallelism over processes: this process is the driver (rank 0: the scheduler, the
draft, and rank 0's worker, the only one that samples); every other rank runs `run_rank`, a
worker that repeats whatever call the driver broadcasts. Each step the driver broadcasts the
step's inputs (the SchedulerOutput, its requests reduced to what a batch is built from, drafts
included), so the other ranks keep no request state and need no sampled ids back; the forward's
collectives keep the ranks in step. Subclasses start the other ranks (multiprocessing, Ray)."""
import threading
from abc import abstractmethod
from typing import Any, Callable, Optional

import torch

from vllm.config import VllmConfig
from vllm.core.scheduler import SchedulerOutput
from vllm.distributed.parallel_state import TPGroup, destroy_distributed, init_distributed
from vllm.executor.executor_base import Executor
from vllm.logger import init_logger
from vllm.worker.model_runner import RunnerOutput
from vllm.worker.worker import Worker

logger = init_logger(__name__)


class _PromptLogprobs:
    """A request's prompt_logprobs setting, all a rank reads of its sampling params."""

    def __init__(self, prompt_logprobs: Optional[int]) -> None:
        self.prompt_logprobs = prompt_logprobs


class RequestView:
    """What a rank other than the driver needs of a Request to build the step's batch (quacks
    like a Request for ModelRunner.prepare_inputs): the tokens from its first uncomputed one."""

    def __init__(self, req: Any) -> None:
        self.req_id = req.req_id
        self.num_computed_tokens = req.num_computed_tokens
        self.num_tokens = req.num_tokens
        self.num_prompt_tokens = req.num_prompt_tokens
        self.block_ids = list(req.block_ids)
        self.sampling_params = _PromptLogprobs(req.sampling_params.prompt_logprobs)
        self.prompt_logprobs = None if req.prompt_logprobs is None else True
        self._tokens = req.token_slice(req.num_computed_tokens, req.num_tokens)

    def token_slice(self, start: int, end: int) -> list[int]:
        base = self.num_computed_tokens
        return self._tokens[start - base:end - base]


def step_for_ranks(out: SchedulerOutput) -> SchedulerOutput:
    return SchedulerOutput([RequestView(r) for r in out.requests], list(out.num_scheduled_tokens),
                           [], list(out.num_lookahead), [list(d) for d in out.draft_token_ids])


def run_rank(config: VllmConfig, rank: int, init_method: str, backend: str,
             device_index: int) -> None:
    """A rank's life: join the group, then serve the driver's calls until it says stop."""
    group = init_distributed(rank, config.parallel_config.tensor_parallel_size, init_method,
                             backend)
    if config.device.type == "cuda":
        config.device = torch.device("cuda", device_index)
    try:
        worker = Worker(config)
        while True:
            message = group.broadcast_object()
            if message is None:
                break
            method, args = message
            getattr(worker, method)(*args)
    finally:
        destroy_distributed()


class DistributedExecutor(Executor):

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.size = config.parallel_config.tensor_parallel_size
        self.backend = "nccl" if config.device.type == "cuda" else "gloo"
        self.group: Optional[TPGroup] = None
        self._closed = False
        try:
            init_method = self._start_ranks()
            self.group = self._join(init_method)
            self.driver_worker = Worker(config)
        except BaseException:
            self.shutdown()
            raise
        logger.info("tensor parallel: %d ranks (%s), %s", self.size, type(self).__name__,
                    self.backend)

    @abstractmethod
    def _start_ranks(self) -> str:
        """Starts ranks 1..size-1 (each runs run_rank); returns the rendezvous address."""

    @abstractmethod
    def _check_ranks(self) -> None:
        """Raises if a rank has died."""

    @abstractmethod
    def _stop_ranks(self) -> None:
        """Waits a bounded time for the ranks to exit, then ends those left."""

    def _join(self, init_method: str) -> TPGroup:
        """Joins the group as rank 0, failing fast if a rank dies before joining."""
        result: dict[str, Any] = {}

        def join() -> None:
            try:
                result["group"] = init_distributed(0, self.size, init_method, self.backend)
            except BaseException as e:  # reported by the waiting thread
                result["error"] = e

        thread = threading.Thread(target=join, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
            if thread.is_alive():
                self._check_ranks()
        if "error" in result:
            raise result["error"]
        return result["group"]

    def _call(self, method: str, *args: Any) -> Any:
        """Runs the worker method on every rank; the driver's result."""
        try:
            self.group.broadcast_object((method, args))
            return getattr(self.driver_worker, method)(*args)
        except BaseException:
            # the ranks may be out of step now: stop them rather than leave them waiting
            self.shutdown()
            raise

    def load_model(self) -> None:
        self._call("load_model")

    def initialize_cache(self) -> int:
        return self._call("initialize_cache")

    def execute_model(self, out: SchedulerOutput,
                      before_sync: Optional[Callable[[], None]] = None) -> RunnerOutput:
        try:
            self.group.broadcast_object(("execute_model", (step_for_ranks(out),)))
            return self.driver_worker.execute_model(out, before_sync)
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.group is not None:
            try:
                self.group.broadcast_object(None)
            except Exception as e:  # a rank already gone
                logger.warning("tensor parallel shutdown: %s", e)
        try:
            self._stop_ranks()
        finally:
            destroy_distributed()
