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
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional, Protocol

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine, PromptType
from vllm.logger import init_logger
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams

logger = init_logger(__name__)

# without --max-waiting-requests: this many times max_num_seqs may wait for a slot
DEFAULT_WAITING_FACTOR = 4


class EngineOverloadedError(RuntimeError):
    """Too many requests wait already; the caller should retry later (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """A step failed; the engine's state is unknown and it takes no more requests."""


class RequestFailedError(RuntimeError):
    """The engine failed this request alone (our fault, not the caller's: HTTP 500); the
    message names the request id."""


_ABORTED = object()  # queued to a request's stream by abort(): the stream ends there


class StatsSink(Protocol):
    def observe_first_token(self, seconds: float) -> None: ...

    def observe_finished(self, e2e_seconds: float, finish_reason: Optional[str]) -> None: ...


@dataclass
class ServingCounters:
    """Cumulative totals since start, read by /metrics."""
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: Counter = field(default_factory=Counter)  # finish reason -> requests


@dataclass
class _PendingAdd:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    verdict: asyncio.Future  # True once added, False if aborted first, or add_request's error


class AsyncLLMEngine:

    def __init__(self, engine: LLMEngine, max_waiting_requests: Optional[int] = None) -> None:
        self.engine = engine
        max_num_seqs = engine.config.scheduler_config.max_num_seqs
        self.max_waiting_requests = (max_waiting_requests if max_waiting_requests is not None
                                     else DEFAULT_WAITING_FACTOR * max_num_seqs)
        self.counters = ServingCounters()
        self.stats_sink: Optional[StatsSink] = None
        self.dead_error: Optional[BaseException] = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._num_seen: dict[str, int] = {}  # request id -> output tokens already counted
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

    @property
    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    # requests

    async def generate(self, prompt: PromptType, params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Yields the request's RequestOutput (cumulative) after each step that advanced it,
        the last with finished=True. Closing the iterator early aborts the request."""
        self._ensure_started()
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine failed and takes no requests: "
                                  f"{self.dead_error!r}")
        if self.num_waiting >= self.max_waiting_requests:
            raise EngineOverloadedError(f"{self.num_waiting} requests are waiting already "
                                        f"(limit {self.max_waiting_requests}); retry later")
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        pending = _PendingAdd(request_id, prompt, params,
                              asyncio.get_running_loop().create_future())
        self._pending_adds.append(pending)
        self._wake.set()
        start = time.monotonic()
        first_token_seen = finished = False
        try:
            if not await pending.verdict:  # aborted before it was added
                finished = True
                return
            while not finished:
                output = await queue.get()
                # outputs are cumulative: the newest says it all (but a finished one is kept)
                while not queue.empty() and not getattr(output, "finished", False):
                    output = queue.get_nowait()
                if output is _ABORTED:
                    finished = True  # the engine has forgotten it already
                    return
                if isinstance(output, BaseException):
                    raise output
                finished = output.finished
                if output.error is not None:
                    raise RequestFailedError(f"request {request_id} failed: {output.error}")
                if self.stats_sink is not None:
                    if not first_token_seen and any(o.token_ids for o in output.outputs):
                        first_token_seen = True
                        self.stats_sink.observe_first_token(time.monotonic() - start)
                    if finished:
                        self.stats_sink.observe_finished(
                            time.monotonic() - start, output.outputs[0].finish_reason)
                yield output
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Aborts a request (no-op if unknown or finished); its KV blocks are freed before the
        next step, and its stream ends."""
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(_ABORTED)
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
            for request_id in live:
                self._num_seen.pop(request_id, None)
                self.counters.finished["abort"] += 1

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            rid = output.request_id
            seen = self._num_seen.get(rid)
            if seen is None:
                self.counters.prompt_tokens += len(output.prompt_token_ids)
                seen = 0
            total = sum(len(o.token_ids) for o in output.outputs)
            self.counters.generation_tokens += total - seen
            if output.finished:
                self._num_seen.pop(rid, None)
                self.counters.finished[output.outputs[0].finish_reason or "stop"] += 1
            else:
                self._num_seen[rid] = total
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(output)

    def _fail_all(self, error: Exception) -> None:
        self.dead_error = error
        dead = EngineDeadError(f"the engine failed: {error!r}")
        for pending in self._pending_adds:
            if not pending.verdict.done():
                pending.verdict.set_exception(dead)
        self._pending_adds.clear()
        for queue in self._queues.values():
            queue.put_nowait(dead)
