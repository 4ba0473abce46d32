"""AsyncLLMEngine: LLMEngine for asyncio servers.

One background task owns the engine. Between steps, on the event loop, it applies the queued
adds and aborts; each step() runs on a dedicated worker thread so the loop keeps serving HTTP
meanwhile. The engine is therefore only touched by one thread at a time: the loop while no step
runs, the worker during a step.

    generate(prompt, params, id)   queue an add -> wait for its verdict (ValueError raised here)
                                   -> yield the request's growing RequestOutput after each step
    abort(id) / generator closed   queue an abort; the scheduler frees the request's KV blocks
"""
import asyncio
import concurrent.futures
from dataclasses import dataclass
from typing import Any, Optional

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.engine_client import (_ABORTED, DEFAULT_WAITING_FACTOR,  # noqa: F401
                                       EngineClient, EngineDeadError, EngineOverloadedError,
                                       EngineStats, RequestFailedError, ServingCounters)
from vllm.engine.llm_engine import LLMEngine, PromptType
from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams

logger = init_logger(__name__)


@dataclass
class _PendingAdd:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    verdict: asyncio.Future  # True once added, False if aborted first, or add_request's error


class AsyncLLMEngine(EngineClient):

    def __init__(self, engine: LLMEngine, max_waiting_requests: Optional[int] = None) -> None:
        super().__init__(engine.max_model_len, engine.config.scheduler_config.max_num_seqs,
                         max_waiting_requests)
        self.engine = engine
        self._pending_adds: list[_PendingAdd] = []
        self._pending_aborts: set[str] = set()
        self._wake: Optional[asyncio.Event] = None
        self._loop_task: Optional[asyncio.Task] = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="engine-step")

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs,
                         max_waiting_requests: Optional[int] = None) -> "AsyncLLMEngine":
        return cls(LLMEngine.from_engine_args(engine_args), max_waiting_requests)

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + len(self._pending_adds)

    def stats(self) -> EngineStats:
        stats = self.engine.stats()
        stats.num_waiting += len(self._pending_adds)
        return stats

    @property
    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    # requests

    async def _submit(self, request_id: str, prompt: Any, params: Any) -> bool:
        self._ensure_started()
        pending = _PendingAdd(request_id, prompt, params,
                              asyncio.get_running_loop().create_future())
        self._pending_adds.append(pending)
        self._wake.set()
        return await pending.verdict

    def _send_abort(self, request_id: str) -> None:
        for pending in self._pending_adds:
            if pending.request_id == request_id:
                self._pending_adds.remove(pending)
                if not pending.verdict.done():
                    pending.verdict.set_result(False)
                return
        self._pending_aborts.add(request_id)
        if self._wake is not None:
            self._wake.set()

    # the background loop

    def _ensure_started(self) -> None:
        if self.is_running or self.dead_error is not None:
            return
        self._wake = asyncio.Event()
        self._loop_task = asyncio.get_running_loop().create_task(self._run_loop())

    async def shutdown(self) -> None:
        """Stops the loop (after its current step) and aborts every request it still held."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except (asyncio.CancelledError, Exception):
                pass
        self._executor.shutdown(wait=True)
        for request_id in list(self._queues):
            self.abort(request_id)
        self._apply_pending_aborts()

    def _has_work(self) -> bool:
        return bool(self._pending_adds or self._pending_aborts
                    or self.engine.has_unfinished_requests())

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._has_work():
                self._wake.clear()
                await self._wake.wait()
            self._apply_pending()
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as e:  # noqa: BLE001 - every waiter must hear of it
                logger.exception("engine step failed; failing all requests")
                self._fail_all(e)
                return
            self._dispatch(outputs)
            # let handlers read their outputs and queue new requests before the next step
            await asyncio.sleep(0)

    def _apply_pending(self) -> None:
        self._apply_pending_aborts()
        adds, self._pending_adds = self._pending_adds, []
        for pending in adds:
            if pending.verdict.done():  # cancelled: its caller left before it was added
                continue
            try:
                self.engine.add_request(pending.request_id, pending.prompt, pending.params)
            except ValueError as e:
                pending.verdict.set_exception(e)
            except Exception as e:  # noqa: BLE001 - this request fails, the loop goes on
                logger.exception("adding request %s failed", pending.request_id)
                pending.verdict.set_exception(RequestFailedError(
                    f"request {pending.request_id} failed: {type(e).__name__}: {e}"))
            else:
                pending.verdict.set_result(True)

    def _apply_pending_aborts(self) -> None:
        aborts, self._pending_aborts = self._pending_aborts, set()
        if aborts:
            live = [rid for rid in aborts if rid in self.engine.groups]
            self.engine.abort_request(live)
            self._count_aborted(live)

    def _fail_all(self, error: BaseException) -> None:
        super()._fail_all(error)
        dead = EngineDeadError(f"the engine failed: {error!r}")
        for pending in self._pending_adds:
            if not pending.verdict.done():
                pending.verdict.set_exception(dead)
        self._pending_adds.clear()
