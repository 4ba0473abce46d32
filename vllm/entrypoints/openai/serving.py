"""Completions and chat completions: OpenAI requests -> engine requests -> OpenAI responses,
whole or streamed as server-sent events (one `data: {json}` per chunk, then `data: [DONE]`).

A completion request with several prompts becomes one engine request per prompt; choice i of
prompt p has index p * n + i. A streamed choice's text is held back while it ends in the start
of a stop string (the engine cuts a matched stop string out of text already produced)."""
import asyncio
import concurrent.futures
import json
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from vllm.engine.engine_client import EngineClient
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest, ChatCompletionResponse, ChatCompletionResponseChoice,
    ChatCompletionStreamChoice, ChatCompletionStreamResponse, ChatLogProbs, ChatLogprobToken,
    ChatResponseMessage, ChatTopLogprob, CompletionLogProbs, CompletionRequest,
    CompletionResponse, CompletionResponseChoice, DeltaMessage, ErrorInfo, ErrorResponse,
    UsageInfo, random_id)
from vllm.sampling_params import SamplingParams

PromptInput = Union[str, dict]


def error_body(status: int, message: str, err_type: str) -> dict:
    return ErrorResponse(error=ErrorInfo(message=message, type=err_type,
                                         code=status)).model_dump()


def sse(payload: Union[str, dict]) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


@dataclass
class _ChoiceState:
    """What a streamed choice has sent so far."""
    num_chars: int = 0
    num_tokens: int = 0
    text_offset: int = 0  # completions logprobs: characters of the tokens sent
    finished: bool = False
    role_sent: bool = False


def sendable_text_len(text: str, stops: list[str], finished: bool) -> int:
    """len(text) less the longest tail that could still grow into a stop string."""
    if finished or not stops:
        return len(text)
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:k]):
                held = k
                break
    return len(text) - held


async def merge_streams(streams: list[AsyncIterator[RequestOutput]]
                        ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, item) from several streams as they come; closing this closes them all."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as stream:
            async for item in stream:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    queue.put_nowait((i, item))
            queue.put_nowait((i, end))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _abort_on_disconnect(raw: Request, engine: EngineClient,
                               request_ids: list[str]) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass
    for rid in request_ids:
        engine.abort(rid)


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token's text can have (its vocabulary string, byte-level or
    SentencePiece, is at least as long as the text it decodes to)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1


class OpenAIServing:
    """Tokenizing and chat template rendering run on one worker thread, not on the event loop
    (a long prompt or a slow template would freeze every endpoint)."""

    def __init__(self, engine: EngineClient, model_name: str,
                 chat_template: Optional[str], max_model_len: int = 0,
                 trust_request_chat_template: bool = False) -> None:
        self.engine = engine
        self.model_name = model_name
        self.chat_template = chat_template
        self.tokenizer = engine.get_tokenizer()
        self.max_model_len = max_model_len
        self.trust_request_chat_template = trust_request_chat_template
        # a text longer than this cannot fit in max_model_len tokens: rejected untokenized
        self.max_prompt_chars = max_model_len * longest_token_chars(self.tokenizer)
        self._tokenize_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tokenize")

    # requests -> engine

    async def off_loop(self, fn: Any, *args: Any) -> Any:
        """fn(*args) on the tokenizing thread."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn, *args)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The prompt's token ids; ValueError for a text too long to fit or one the tokenizer
        rejects (whatever it raises)."""
        if self.max_prompt_chars and len(text) > self.max_prompt_chars:
            raise ValueError(f"prompt: {len(text)} characters cannot fit in max_model_len="
                             f"{self.max_model_len} tokens")
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - pyo3's PanicException is a BaseException
            raise ValueError(f"prompt: the tokenizer rejected it: {type(e).__name__}: {e}") from e

    def check_length(self, num_prompt_tokens: int, max_tokens: Optional[int]) -> None:
        """400 when prompt + max_tokens exceeds max_model_len (rather than cutting it short)."""
        if max_tokens is not None and num_prompt_tokens + max_tokens > self.max_model_len > 0:
            raise ValueError(
                f"max_model_len is {self.max_model_len} tokens, but the request asks for "
                f"{num_prompt_tokens + max_tokens} ({num_prompt_tokens} in the prompt, "
                f"max_tokens={max_tokens} to generate); shorten the prompt or max_tokens")

    def chat_prompt_ids(self, messages: list[dict], add_generation_prompt: bool = True,
                        chat_template: Optional[str] = None) -> list[int]:
        """Token ids of the conversation under the chat template; ValueError if none or bad."""
        if chat_template is not None and not self.trust_request_chat_template:
            raise ValueError("chat_template: a per-request chat template needs the server to "
                             "run with --trust-request-chat-template")
        template = chat_template or self.chat_template
        if template is None and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("the model's tokenizer has no chat template; start the server "
                             "with --chat-template")
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, chat_template=template, add_generation_prompt=add_generation_prompt,
                tokenize=True)
        except Exception as e:  # jinja2 errors: the template rejected these messages
            raise ValueError(f"messages: the chat template failed: {e}") from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def _streams(self, base_id: str, prompts: list[PromptInput], params: SamplingParams
                 ) -> tuple[list[str], list[AsyncIterator[RequestOutput]]]:
        ids = [base_id if len(prompts) == 1 else f"{base_id}-{i}" for i in range(len(prompts))]
        return ids, [self.engine.generate(p, params, rid) for p, rid in zip(prompts, ids)]

    async def _first_outputs(self, merged: AsyncIterator[tuple[int, RequestOutput]]
                             ) -> Optional[tuple[int, RequestOutput]]:
        """Waits for the first output so that errors (bad prompt, overload) become a status
        code before a stream starts; None if the streams ended without one."""
        try:
            return await merged.__anext__()
        except StopAsyncIteration:
            return None

    async def completions(self, req: CompletionRequest, raw: Request) -> Any:
        params = req.to_sampling_params()
        prompts: list[PromptInput] = []
        for p in req.prompts():
            ids = await self.off_loop(self.encode, p) if isinstance(p, str) else p
            self.check_length(len(ids), params.max_tokens)
            prompts.append({"prompt": p, "prompt_token_ids": ids} if isinstance(p, str)
                           else {"prompt_token_ids": ids})
        request_id = random_id("cmpl")
        return await self._serve(raw, request_id, prompts, params, req.stream,
                                 _CompletionFormatter(self, req, request_id, len(prompts)))

    async def chat(self, req: ChatCompletionRequest, raw: Request) -> Any:
        params = req.to_sampling_params()
        ids = await self.off_loop(self.chat_prompt_ids, req.conversation(),
                                  req.add_generation_prompt, req.chat_template)
        self.check_length(len(ids), params.max_tokens)
        request_id = random_id("chatcmpl")
        return await self._serve(raw, request_id, [{"prompt_token_ids": ids}], params,
                                 req.stream, _ChatFormatter(self, req, request_id))

    async def _serve(self, raw: Request, request_id: str, prompts: list[PromptInput],
                     params: SamplingParams, stream: bool, fmt: "_Formatter") -> Any:
        rids, streams = self._streams(request_id, prompts, params)
        merged = merge_streams(streams)
        watcher = asyncio.ensure_future(_abort_on_disconnect(raw, self.engine, rids))
        try:
            first = await self._first_outputs(merged)
        except BaseException:
            watcher.cancel()
            await merged.aclose()
            raise
        if stream:
            return StreamingResponse(self._sse(merged, first, fmt, watcher),
                                     media_type="text/event-stream")
        finals: list[Optional[RequestOutput]] = [None] * len(prompts)
        try:
            if first is not None:
                finals[first[0]] = first[1]
            async with aclosing(merged):
                async for i, output in merged:
                    finals[i] = output
        finally:
            watcher.cancel()
        if any(f is None or not f.finished for f in finals):
            return JSONResponse(error_body(499, "the request was aborted", "RequestAborted"),
                                status_code=499)
        return fmt.full_response(finals)

    async def _sse(self, merged: AsyncIterator[tuple[int, RequestOutput]],
                   first: Optional[tuple[int, RequestOutput]], fmt: "_Formatter",
                   watcher: asyncio.Future) -> AsyncIterator[str]:
        try:
            async with aclosing(merged):
                if first is not None:
                    for chunk in fmt.chunks(*first):
                        yield sse(chunk)
                async for i, output in merged:
                    for chunk in fmt.chunks(i, output):
                        yield sse(chunk)
            usage = fmt.usage_chunk()
            if usage is not None:
                yield sse(usage)
        except Exception as e:  # noqa: BLE001 - the status line is sent; report in-band
            yield sse(error_body(500, str(e), type(e).__name__))
        finally:
            watcher.cancel()
        yield sse("[DONE]")


class _Formatter:
    """Builds one endpoint's response bodies from RequestOutputs."""

    def __init__(self, serving: OpenAIServing, req: Any, request_id: str,
                 num_prompts: int = 1) -> None:
        self.serving = serving
        self.tokenizer = serving.tokenizer
        self.req = req
        self.request_id = request_id
        self.n = req.n
        self.stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        self.states = [_ChoiceState() for _ in range(num_prompts * req.n)]
        self.prompt_tokens = [0] * num_prompts
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunks(self, prompt_idx: int, output: RequestOutput) -> list[dict]:
        self.prompt_tokens[prompt_idx] = len(output.prompt_token_ids)
        chunks = []
        for o in output.outputs:
            index = prompt_idx * self.n + o.index
            state = self.states[index]
            if state.finished:
                continue
            finished = o.finish_reason is not None
            end = sendable_text_len(o.text, self.stops, finished)
            delta = o.text[state.num_chars:end]
            new_tokens = range(state.num_tokens, len(o.token_ids))
            if delta or finished or new_tokens or not state.role_sent:
                chunks.append(self.chunk(index, state, o, delta, new_tokens))
            state.num_chars = max(state.num_chars, end)
            state.num_tokens = len(o.token_ids)
            state.finished = finished
        return chunks

    def usage(self, finals: Optional[list[RequestOutput]] = None) -> UsageInfo:
        if finals is not None:
            prompt = sum(len(f.prompt_token_ids) for f in finals)
            completion = sum(len(o.token_ids) for f in finals for o in f.outputs)
        else:
            prompt = sum(self.prompt_tokens)
            completion = sum(s.num_tokens for s in self.states)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                         total_tokens=prompt + completion)

    def usage_chunk(self) -> Optional[dict]:
        return None

    def chunk(self, index: int, state: _ChoiceState, o: CompletionOutput, delta: str,
              new_tokens: range) -> dict:
        raise NotImplementedError

    def full_response(self, finals: list[RequestOutput]) -> dict:
        raise NotImplementedError

    def _token_text(self, token_id: int, entry: dict) -> str:
        lp = entry.get(token_id)
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        return self.tokenizer.decode([token_id])


class _CompletionFormatter(_Formatter):

    def _logprobs(self, o: CompletionOutput, positions: range,
                  state: _ChoiceState) -> Optional[CompletionLogProbs]:
        if self.req.logprobs is None or o.logprobs is None:
            return None
        out = CompletionLogProbs()
        for j in positions:
            if j >= len(o.logprobs):
                break
            entry, token_id = o.logprobs[j], o.token_ids[j]
            token = self._token_text(token_id, entry)
            out.tokens.append(token)
            out.token_logprobs.append(entry[token_id].logprob if token_id in entry else None)
            out.top_logprobs.append({self._token_text(t, entry): lp.logprob
                                     for t, lp in entry.items()})
            out.text_offset.append(state.text_offset)
            state.text_offset += len(token)
        return out

    def chunk(self, index, state, o, delta, new_tokens) -> dict:
        state.role_sent = True
        finished = o.finish_reason is not None
        choice = CompletionResponseChoice(
            index=index, text=delta, logprobs=self._logprobs(o, new_tokens, state),
            finish_reason=o.finish_reason if finished else None,
            stop_reason=o.stop_reason if finished else None)
        return CompletionResponse(id=self.request_id, model=self.serving.model_name,
                                  choices=[choice]).model_dump(exclude={"usage"})

    def usage_chunk(self) -> Optional[dict]:
        if not self.include_usage:
            return None
        return CompletionResponse(id=self.request_id, model=self.serving.model_name,
                                  choices=[], usage=self.usage()).model_dump()

    def full_response(self, finals: list[RequestOutput]) -> dict:
        choices = []
        for p, final in enumerate(finals):
            for o in final.outputs:
                choices.append(CompletionResponseChoice(
                    index=p * self.n + o.index, text=o.text,
                    logprobs=self._logprobs(o, range(len(o.token_ids)), _ChoiceState()),
                    finish_reason=o.finish_reason, stop_reason=o.stop_reason))
        return CompletionResponse(id=self.request_id, model=self.serving.model_name,
                                  choices=choices, usage=self.usage(finals)).model_dump()


class _ChatFormatter(_Formatter):

    def _logprobs(self, o: CompletionOutput, positions: range) -> Optional[ChatLogProbs]:
        if not self.req.logprobs or o.logprobs is None:
            return None
        num_top = self.req.top_logprobs or 0
        content = []
        for j in positions:
            if j >= len(o.logprobs):
                break
            entry, token_id = o.logprobs[j], o.token_ids[j]
            token = self._token_text(token_id, entry)
            top = sorted((lp.rank, t, lp.logprob) for t, lp in entry.items()
                         if lp.rank is not None and 1 <= lp.rank <= num_top)
            chosen = entry.get(token_id)
            content.append(ChatLogprobToken(
                token=token, logprob=chosen.logprob if chosen else float("-inf"),
                bytes=list(token.encode()),
                top_logprobs=[ChatTopLogprob(token=self._token_text(t, entry), logprob=lp,
                                             bytes=list(self._token_text(t, entry).encode()))
                              for _, t, lp in top]))
        return ChatLogProbs(content=content)

    def chunk(self, index, state, o, delta, new_tokens) -> dict:
        finished = o.finish_reason is not None
        message = DeltaMessage(content=delta)
        if not state.role_sent:
            message.role = "assistant"
            state.role_sent = True
        choice = ChatCompletionStreamChoice(
            index=index, delta=message, logprobs=self._logprobs(o, new_tokens),
            finish_reason=o.finish_reason if finished else None,
            stop_reason=o.stop_reason if finished else None)
        return ChatCompletionStreamResponse(
            id=self.request_id, model=self.serving.model_name,
            choices=[choice]).model_dump(exclude={"usage"}, exclude_none=False)

    def usage_chunk(self) -> Optional[dict]:
        if not self.include_usage:
            return None
        return ChatCompletionStreamResponse(id=self.request_id, model=self.serving.model_name,
                                            choices=[], usage=self.usage()).model_dump()

    def full_response(self, finals: list[RequestOutput]) -> dict:
        final = finals[0]
        choices = [ChatCompletionResponseChoice(
            index=o.index, message=ChatResponseMessage(content=o.text),
            logprobs=self._logprobs(o, range(len(o.token_ids))),
            finish_reason=o.finish_reason, stop_reason=o.stop_reason)
            for o in final.outputs]
        return ChatCompletionResponse(id=self.request_id, model=self.serving.model_name,
                                      choices=choices, usage=self.usage(finals)).model_dump()
