"""EngineClient: what the API server sees of an engine, wherever the engine runs (a thread of
this process: AsyncLLMEngine; its own process: MPEngineClient).

    generate(prompt, params, id)   -> the request's growing RequestOutput after each step that
                                      advanced it (the last one finished); closing it aborts
    abort(id)                      the request's stream ends; the engine frees its KV blocks
    stats()                        EngineStats for /metrics; counters: totals since start
    dead_error                     set once the engine cannot serve any more

Both implementations feed each request's asyncio.Queue with RequestOutputs, exceptions (that
request failed) or _ABORTED; this class turns a queue into the stream and keeps the counters."""
import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Protocol

from vllm.outputs import RequestOutput

# without --max-waiting-requests: this many times max_num_seqs may wait for a slot
DEFAULT_WAITING_FACTOR = 4


class EngineOverloadedError(RuntimeError):
    """Too many requests wait already; the caller should retry later (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine failed as a whole and takes no more requests."""


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
class EngineStats:
    """A snapshot of the engine for /metrics."""
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    spec_decode: Optional[dict] = None  # SpecDecodeMetrics.as_dict() and drafter counters
    step_times: Optional[dict] = None  # StepTimer.as_dict(): where the engine's steps went


class EngineClient:

    def __init__(self, max_model_len: int, max_num_seqs: int,
                 max_waiting_requests: Optional[int]) -> None:
        self.max_model_len = max_model_len
        self.max_waiting_requests = (max_waiting_requests if max_waiting_requests is not None
                                     else DEFAULT_WAITING_FACTOR * max_num_seqs)
        self.counters = ServingCounters()
        self.stats_sink: Optional[StatsSink] = None
        self.dead_error: Optional[BaseException] = None
        self.on_dead: Optional[Callable[[], None]] = None  # the server exits
        self._queues: dict[str, asyncio.Queue] = {}
        self._num_seen: dict[str, int] = {}  # request id -> output tokens already counted

    # what each implementation provides

    def get_tokenizer(self) -> Any:
        raise NotImplementedError

    @property
    def num_waiting(self) -> int:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError

    async def _submit(self, request_id: str, prompt: Any, params: Any) -> bool:
        """Hands the request to the engine; False if it was aborted before it got there.
        Raises what makes the request invalid (ValueError) when known here."""
        raise NotImplementedError

    def _send_abort(self, request_id: str) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """Called by the server once its event loop runs (background tasks start here)."""

    async def shutdown(self) -> None:
        raise NotImplementedError

    # requests

    async def generate(self, prompt: Any, params: Any,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Yields the request's RequestOutput (cumulative) after each step that advanced it,
        the last with finished=True. Closing the iterator early aborts the request."""
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
        start = time.monotonic()
        first_token_seen = finished = False
        try:
            if not await self._submit(request_id, prompt, params):
                finished = True  # aborted before it was added
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
                    finished = True
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
        self._send_abort(request_id)

    # outputs

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

    def _count_aborted(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._num_seen.pop(request_id, None)
            self.counters.finished["abort"] += 1

    def _fail_request(self, request_id: str, error: BaseException) -> None:
        self._num_seen.pop(request_id, None)
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(error)

    def _fail_all(self, error: BaseException) -> None:
        """The engine is gone: every waiter hears of it, and the server is told."""
        self.dead_error = error
        dead = EngineDeadError(f"the engine failed: {error!r}")
        for queue in self._queues.values():
            queue.put_nowait(dead)
        if self.on_dead is not None:
            self.on_dead()
