"""The engine core process: an LLMEngine (scheduler, target worker, the SpecDecoder's proposer,
which may start its own draft process) driven by messages from the API server's MPEngineClient.

    client -> core (ZMQ PUSH/PULL)   ("add", request_id, prompt, params) | ("abort", [ids])
                                     | ("shutdown",)
    core -> client (ZMQ PUSH/PULL)   ("outputs", [RequestOutput], EngineStats) after each step
                                       (token ids; text only for requests with stop strings:
                                       the client detokenizes the rest)
                                     | ("error", request_id, status, message): the request
                                       failed alone (400: bad input, 500: our bug)
                                     | ("stats", EngineStats) after adds/aborts with no step

The loop blocks on the input socket only while the engine has nothing to run; otherwise it drains
what has arrived and steps. A step that raises (an engine bug) fails the requests it held and the
core goes on; if even that fails, the process exits non-zero and the client's supervisor notices.
SIGTERM (or the parent's death) stops the engine and its draft process; SIGINT is the parent's."""
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Any

import torch
import zmq

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.logger import init_logger
from vllm.process_utils import child_connection, die_with_parent

logger = init_logger(__name__)

IDLE_POLL_MS = 1000


class EngineCore:

    def __init__(self, engine: LLMEngine, ctx: zmq.Context, input_addr: str,
                 output_addr: str) -> None:
        self.engine = engine
        self.input = ctx.socket(zmq.PULL)
        self.input.connect(input_addr)
        self.output = ctx.socket(zmq.PUSH)
        self.output.connect(output_addr)

    def _send(self, msg: tuple) -> None:
        self.output.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL), copy=False)

    def run(self) -> None:
        while True:
            busy = self.engine.has_unfinished_requests()
            if self.input.poll(0 if busy else IDLE_POLL_MS):
                start = time.perf_counter()
                while True:
                    try:
                        msg = pickle.loads(self.input.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if msg[0] == "shutdown":
                        return
                    self._handle(msg)
                if not self.engine.has_unfinished_requests():
                    self._send(("stats", self.engine.stats()))
                self.engine.step_timer.add("core_io", time.perf_counter() - start)
            if self.engine.has_unfinished_requests():
                self._step()

    def _handle(self, msg: tuple) -> None:
        kind, *args = msg
        if kind == "add":
            request_id, prompt, params = args
            try:
                self.engine.add_request(request_id, prompt, params)
            except ValueError as e:
                self._send(("error", request_id, 400, str(e)))
            except Exception as e:  # noqa: BLE001 - this request fails, the engine goes on
                logger.exception("adding request %s failed", request_id)
                self._send(("error", request_id, 500, f"{type(e).__name__}: {e}"))
        elif kind == "abort":
            self.engine.abort_request([rid for rid in args[0] if rid in self.engine.groups])

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # noqa: BLE001 - fail what the step held, keep serving
            logger.exception("engine step failed; failing the requests it held")
            held = list(self.engine.groups)
            self.engine.abort_request(held)
            for request_id in held:
                self._send(("error", request_id, 500, f"{type(e).__name__}: {e}"))
            return
        start = time.perf_counter()
        self._send(("outputs", outputs, self.engine.stats()))
        self.engine.step_timer.add("core_io", time.perf_counter() - start)


def _pin_beside_gpu(engine: LLMEngine) -> None:
    """With the target on a GPU the core only launches work: it keeps the first two cores (the
    draft process, if any, has the others) and one torch thread, so neither spins on the
    drafter's cores."""
    cpus = sorted(os.sched_getaffinity(0))
    if engine.config.device.type == "cuda" and len(cpus) >= 4:
        os.sched_setaffinity(0, cpus[:2])
        torch.set_num_threads(1)


def _core_main() -> None:
    die_with_parent(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us

    def on_sigterm(*_: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    conn, (engine_kwargs, input_addr, output_addr) = child_connection()
    try:
        engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs))
    except Exception as e:  # noqa: BLE001 - the server reports it and exits
        kind = "invalid" if isinstance(e, ValueError) else "error"
        conn.send((kind, f"{type(e).__name__}: {e}" if kind == "error" else str(e),
                   traceback.format_exc()))
        return
    engine.detokenize_all = False  # the API server makes the text (StreamDetokenizer)
    _pin_beside_gpu(engine)
    ctx = zmq.Context()
    try:
        core = EngineCore(engine, ctx, input_addr, output_addr)
        conn.send(("ready", None, None))
        core.run()
    finally:
        engine.shutdown()
        ctx.destroy(linger=0)


if __name__ == "__main__":
    try:
        _core_main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - exit non-zero, loudly
        logger.exception("the engine core failed")
        sys.exit(1)
