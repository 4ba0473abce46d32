"""MPEngineClient: the API server's side of an engine core running in its own process
(vllm/engine/core_proc.py). This process keeps HTTP, tokenization (off the event loop),
detokenization (StreamDetokenizer: the core sends token ids) and streaming; the core process
owns the scheduler and the model, so neither the server's Python nor its threads compete with
the GPU's launch thread or the CPU draft.

    generate()  tokenize on a thread -> ("add", ...) to the core -> the request's queue is fed
                by the output task from the core's per-step output batches, their text made
                here
    supervisor  polls the core process; if it exits, every request fails, dead_error is set and
                on_dead() tells the server to exit non-zero
    shutdown()  ("shutdown",) then SIGTERM, then SIGKILL: the core stops its draft process"""
import asyncio
import concurrent.futures
import pickle
import tempfile
from typing import Any, Optional

import zmq
import zmq.asyncio

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.engine_client import EngineClient, EngineStats, RequestFailedError
from vllm.engine.stream_detokenizer import StreamDetokenizer
from vllm.engine.tokenizer import get_tokenizer
from vllm.logger import init_logger
from vllm.model_executor.model_loader.loader import resolve_config
from vllm.process_utils import start_process, stop_process
from vllm.spec_decode.draft_process import keep_off_drafter_cores

logger = init_logger(__name__)

START_TIMEOUT_S = 1800.0
SUPERVISE_INTERVAL_S = 0.5


class MPEngineClient(EngineClient):

    def __init__(self, engine_args: EngineArgs,
                 max_waiting_requests: Optional[int] = None) -> None:
        config = resolve_config(engine_args.create_engine_config())
        super().__init__(config.model_config.max_model_len,
                         config.scheduler_config.max_num_seqs, max_waiting_requests)
        self.tokenizer = get_tokenizer(config.model_config)
        self._detokenizer = StreamDetokenizer(self.tokenizer)
        self._stats = EngineStats()
        self._unstarted: set[str] = set()  # sent, no output yet: waiting in the core
        self._live: set[str] = set()  # sent, not finished
        self._ipc_dir = tempfile.TemporaryDirectory(prefix="vllm-core-")
        self._input_addr = f"ipc://{self._ipc_dir.name}/input"
        self._output_addr = f"ipc://{self._ipc_dir.name}/output"
        self._ctx = zmq.asyncio.Context()
        self._input = self._ctx.socket(zmq.PUSH)
        self._input.bind(self._input_addr)
        self._output = self._ctx.socket(zmq.PULL)
        self._output.bind(self._output_addr)
        self._tasks: list[asyncio.Task] = []
        self._tokenize_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tokenize")
        self.proc, conn = start_process("vllm.engine.core_proc", "EngineCore",
                                        (engine_args.kwargs, self._input_addr,
                                         self._output_addr))
        try:
            self._wait_ready(conn)
        except BaseException:
            self._close()
            raise
        finally:
            conn.close()
        # only now: the core (and through it the drafter) picked its cores from the full set
        kept = keep_off_drafter_cores(config)
        if kept is not None:
            logger.info("API server on cores %s, off the draft process's", kept)

    def _wait_ready(self, conn: Any) -> None:
        if not conn.poll(START_TIMEOUT_S):
            raise RuntimeError(f"the engine core did not start within {START_TIMEOUT_S} s")
        try:
            kind, message, trace = conn.recv()
        except EOFError:
            raise RuntimeError(f"the engine core exited with {self.proc.wait()} while "
                               "starting") from None
        if kind == "invalid":
            raise ValueError(message)
        if kind == "error":
            logger.error("the engine core failed to start:\n%s", trace)
            raise RuntimeError(f"the engine core failed to start: {message}")
        logger.info("engine core process %d ready", self.proc.pid)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs,
                         max_waiting_requests: Optional[int] = None) -> "MPEngineClient":
        return cls(engine_args, max_waiting_requests)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    @property
    def num_waiting(self) -> int:
        return len(self._unstarted)

    def stats(self) -> EngineStats:
        return self._stats

    # requests

    def _ensure_started(self) -> None:
        if not self._tasks and self.dead_error is None:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._read_outputs()),
                           loop.create_task(self._supervise())]

    async def start(self) -> None:
        self._ensure_started()

    async def _submit(self, request_id: str, prompt: Any, params: Any) -> bool:
        self._ensure_started()
        self._unstarted.add(request_id)
        try:
            prompt = await self._tokenized(prompt)
        except BaseException:
            self._unstarted.discard(request_id)
            raise
        if request_id not in self._queues:  # aborted while it was tokenized
            self._unstarted.discard(request_id)
            return False
        self._live.add(request_id)
        self._detokenizer.add(request_id, params)
        await self._send(("add", request_id, prompt, params))
        return True

    async def _tokenized(self, prompt: Any) -> Any:
        """A text prompt becomes {'prompt', 'prompt_token_ids'}, tokenized on a thread so a
        long prompt never stalls the event loop."""
        text = prompt if isinstance(prompt, str) else (
            prompt.get("prompt") if isinstance(prompt, dict)
            and "prompt_token_ids" not in prompt else None)
        if not isinstance(text, str):
            return prompt
        loop = asyncio.get_running_loop()
        try:
            ids = await loop.run_in_executor(self._tokenize_pool, self.tokenizer.encode, text)
        except Exception as e:  # noqa: BLE001 - whatever the tokenizer raises is bad input
            raise ValueError(f"the prompt could not be tokenized: {type(e).__name__}: "
                             f"{e}") from e
        return {"prompt": text, "prompt_token_ids": list(ids)}

    def _send_abort(self, request_id: str) -> None:
        self._unstarted.discard(request_id)
        self._detokenizer.free(request_id)
        if request_id not in self._live:
            return
        self._live.discard(request_id)
        self._count_aborted([request_id])
        if self.dead_error is None and not self._input.closed:
            self._input.send(pickle.dumps(("abort", [request_id])))

    async def _send(self, msg: tuple) -> None:
        await self._input.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    # outputs and supervision

    async def _read_outputs(self) -> None:
        while True:
            kind, *args = pickle.loads(await self._output.recv())
            if kind == "outputs":
                outputs, self._stats = args
                for output in outputs:
                    self._unstarted.discard(output.request_id)
                    if output.finished:
                        self._live.discard(output.request_id)
                    self._detokenizer.process(output)
                self._dispatch(outputs)
            elif kind == "error":
                request_id, status, message = args
                self._unstarted.discard(request_id)
                self._live.discard(request_id)
                self._detokenizer.free(request_id)
                error = (ValueError(message) if status == 400 else
                         RequestFailedError(f"request {request_id} failed: {message}"))
                self._fail_request(request_id, error)
            elif kind == "stats":
                self._stats = args[0]

    async def _supervise(self) -> None:
        while self.proc.poll() is None:
            await asyncio.sleep(SUPERVISE_INTERVAL_S)
        logger.error("the engine core process exited with %s", self.proc.returncode)
        self._fail_all(RuntimeError(f"the engine core process exited with "
                                    f"{self.proc.returncode}"))

    async def shutdown(self) -> None:
        """Stops the core (which stops its draft process) and aborts what it still held."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for request_id in list(self._queues):
            queue = self._queues[request_id]
            queue.put_nowait(RequestFailedError("the server is shutting down"))
        if self.proc.poll() is None and not self._input.closed:
            try:
                self._input.send(pickle.dumps(("shutdown",)), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            await asyncio.get_running_loop().run_in_executor(None, self._wait_exit, 5.0)
        self._close()

    def _wait_exit(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except Exception:  # noqa: BLE001 - escalated by stop_process
            pass
        stop_process(self.proc)

    def _close(self) -> None:
        stop_process(self.proc)
        self._tokenize_pool.shutdown(wait=False)
        self._ctx.destroy(linger=0)
        self._ipc_dir.cleanup()
