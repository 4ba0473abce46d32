"""The OpenAI-compatible HTTP server: `python -m vllm.entrypoints.openai.api_server --model M`
or `vllm serve M`.

    POST /v1/completions, /v1/chat/completions   (stream: true -> server-sent events)
    GET  /v1/models, /health, /version, /metrics
    POST /tokenize, /detokenize

Every error, the framework's own included (an unparsable body, an unknown path, a wrong method),
uses OpenAI's body {"error": {"message", "type", "param", "code"}}: 400 for a bad request
(validation, sampling parameters, prompt too long), 401 without the --api-key bearer token on
/v1/*, 404 for an unknown model name or path, 405 for a wrong method, 413 for a body over
--max-request-body-bytes, 503 (with Retry-After) while too many requests wait, 500 naming the
request id when the engine failed a request, or for every request if the engine died.
"""
# python -m vllm.entrypoints.openai.api_server: huge pages are asked for before the imports
# below load torch (vllm/huge_pages.py), as the vllm command does
if __name__ == "__main__":
    from vllm import huge_pages
    huge_pages.request()

import argparse
import os
import secrets
import signal
from contextlib import asynccontextmanager
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import vllm
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.engine_client import (EngineClient, EngineDeadError, EngineOverloadedError,
                                       RequestFailedError)
from vllm.entrypoints.openai.metrics import ServerMetrics
from vllm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                              DetokenizeRequest, ModelCard, ModelList,
                                              TokenizeRequest)
from vllm.entrypoints.openai.serving import OpenAIServing, error_body
from vllm.logger import init_logger

logger = init_logger(__name__)

UVICORN_LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# seconds a 503 tells the client to wait before retrying
RETRY_AFTER_S = 1
# on SIGTERM, seconds open requests get to finish before they are cancelled
GRACEFUL_SHUTDOWN_S = 3

# OpenAI's error type for the framework's HTTP errors
_HTTP_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                     405: "MethodNotAllowedError", 413: "RequestTooLargeError",
                     422: "BadRequestError"}


def _error(status: int, message: str, err_type: str,
           headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, err_type), status_code=status,
                        headers=headers)


class BodyLimitMiddleware:
    """Plain ASGI: a request body over max_bytes gets 413 before anything parses it. By its
    Content-Length; a body without one (chunked) is read here first, up to the limit."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(413, f"the request body is over {self.max_bytes} bytes "
                           "(--max-request-body-bytes)", "RequestTooLargeError")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                await too_large(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # disconnected
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await too_large(scope, receive, send)
                return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


class ApiKeyMiddleware:
    """Plain ASGI (no response wrapping, so streams and disconnects pass straight through):
    /v1/* needs 'Authorization: Bearer <api_key>'."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(auth, self.expected):
                response = _error(401, "invalid or missing API key (Authorization: Bearer ...)",
                                  "AuthenticationError")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def load_chat_template(value: Optional[str]) -> Optional[str]:
    """--chat-template: a file's path, or the Jinja template itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if any(c in value for c in "{}"):
        return value
    raise ValueError(f"--chat-template {value!r}: no such file, and not a Jinja template")


def _model_name(args: argparse.Namespace) -> str:
    return getattr(args, "served_model_name", None) or str(args.model)


def build_app(engine: EngineClient, args: argparse.Namespace) -> FastAPI:
    model_name = _model_name(args)
    api_key = getattr(args, "api_key", None)
    max_model_len = engine.max_model_len
    serving = OpenAIServing(engine, model_name,
                            load_chat_template(getattr(args, "chat_template", None)),
                            max_model_len,
                            bool(getattr(args, "trust_request_chat_template", False)))
    metrics = ServerMetrics(engine, model_name)
    tokenizer = engine.get_tokenizer()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await engine.start()
        yield
        await engine.shutdown()

    app = FastAPI(title="vllm", version=vllm.__version__, lifespan=lifespan)

    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(BodyLimitMiddleware,
                       max_bytes=getattr(args, "max_request_body_bytes", None)
                       or DEFAULT_MAX_BODY_BYTES)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException):
        status = exc.status_code
        err_type = _HTTP_ERROR_TYPES.get(status, "InternalServerError" if status >= 500
                                         else "BadRequestError")
        return _error(status, str(exc.detail), err_type, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError):
        return _error(400, _validation_message(exc), "BadRequestError")

    @app.exception_handler(ValueError)
    async def on_value_error(_: Request, exc: ValueError):
        return _error(400, str(exc), "BadRequestError")

    @app.exception_handler(EngineOverloadedError)
    async def on_overload(_: Request, exc: EngineOverloadedError):
        return _error(503, str(exc), "ServiceUnavailableError",
                      {"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(RequestFailedError)
    async def on_request_failed(_: Request, exc: RequestFailedError):
        return _error(500, str(exc), "InternalServerError")

    @app.exception_handler(EngineDeadError)
    async def on_dead(_: Request, exc: EngineDeadError):
        return _error(500, str(exc), "InternalServerError")

    @app.exception_handler(Exception)
    async def on_error(_: Request, exc: Exception):
        logger.exception("request failed")
        return _error(500, f"{type(exc).__name__}: {exc}", "InternalServerError")

    def check_model(name: Optional[str]) -> Optional[JSONResponse]:
        if name is not None and name != model_name:
            return _error(404, f"the model {name!r} does not exist; this server serves "
                          f"{model_name!r}", "NotFoundError")
        return None

    @app.get("/health")
    async def health() -> Response:
        if engine.dead_error is not None:
            return _error(503, f"the engine failed: {engine.dead_error!r}",
                          "ServiceUnavailableError")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": vllm.__version__}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        card = ModelCard(id=model_name, root=str(args.model), max_model_len=max_model_len)
        return ModelList(data=[card]).model_dump()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Any:
        return check_model(body.model) or await serving.completions(body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Any:
        return check_model(body.model) or await serving.chat(body, raw)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Any:
        if (err := check_model(body.model)) is not None:
            return err
        if (body.prompt is None) == (body.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        if body.messages is not None:
            ids = await serving.off_loop(serving.chat_prompt_ids,
                                         [{"role": m.role, "content": m.text()}
                                          for m in body.messages], body.add_generation_prompt)
        else:
            ids = await serving.off_loop(serving.encode, body.prompt, body.add_special_tokens)
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": list(ids)}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Any:
        if (err := check_model(body.model)) is not None:
            return err
        bad = [t for t in body.tokens if not 0 <= t < len(tokenizer)]
        if bad:
            raise ValueError(f"tokens: ids outside the vocabulary [0, {len(tokenizer)}): "
                             f"{bad[:5]}")
        return {"prompt": await serving.off_loop(tokenizer.decode, body.tokens)}

    return app


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The server's flags plus every engine flag of EngineArgs."""
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default: all)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1/* (default: "
                        "$VLLM_API_KEY)")
    parser.add_argument("--chat-template", default=None,
                        help="chat template file (or inline Jinja); default: the tokenizer's")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="let requests bring their own chat_template (Jinja runs on the "
                        "server); off by default")
    parser.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get 413 (ours; default: 16 MiB)")
    parser.add_argument("--uvicorn-log-level", default="info", choices=UVICORN_LOG_LEVELS)
    parser.add_argument("--max-waiting-requests", type=int, default=None,
                        help="requests that may wait for a slot before new ones get 503 "
                        "(default: 4 * max_num_seqs)")
    parser.add_argument("--disable-frontend-multiprocessing", action="store_true",
                        help="run the engine on a thread of the server's process instead of "
                        "in its own engine core process")
    return EngineArgs.add_cli_args(parser)


def create_engine_client(args: argparse.Namespace) -> EngineClient:
    """The engine core in its own process (default), or on a thread of this one."""
    engine_args = EngineArgs.from_cli_args(args)
    if args.disable_frontend_multiprocessing:
        return AsyncLLMEngine.from_engine_args(engine_args, args.max_waiting_requests)
    from vllm.engine.core_client import MPEngineClient
    return MPEngineClient.from_engine_args(engine_args, args.max_waiting_requests)


def run_server(args: argparse.Namespace) -> None:
    """Serves until SIGTERM / Ctrl-C (exit 0) or until the engine dies (exit 1)."""
    import uvicorn

    if getattr(args, "model", None) is None:
        raise SystemExit("error: a model is required (--model, or `vllm serve MODEL`)")
    if args.max_waiting_requests is not None and args.max_waiting_requests < 1:
        raise SystemExit("error: --max-waiting-requests must be >= 1")
    try:
        load_chat_template(args.chat_template)
        engine = create_engine_client(args)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    app = build_app(engine, args)
    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
        timeout_keep_alive=5, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))

    def on_engine_dead() -> None:
        logger.error("the engine is dead; the server exits")
        server.should_exit = True

    engine.on_dead = on_engine_dead
    logger.info("serving %s on http://%s:%d", _model_name(args), args.host, args.port)
    # uvicorn turns SIGTERM / SIGINT into a graceful shutdown, then raises the signal again
    # under the handlers it found: these make that a clean exit (0) instead of a death by signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if engine.dead_error is not None:
        raise SystemExit(1)


def main(argv: Optional[list[str]] = None) -> None:
    parser = make_arg_parser(argparse.ArgumentParser(
        description="vLLM-compatible OpenAI API server"))
    run_server(parser.parse_args(argv))


if __name__ == "__main__":
    main()
