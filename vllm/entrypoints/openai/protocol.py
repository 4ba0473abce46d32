"""The OpenAI API's request and response bodies (pydantic), with vLLM's extra sampling fields,
and their translation into SamplingParams."""
import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from vllm.sampling_params import SamplingParams


# most choices one request may ask for (n): each is a sequence of its own in the engine
MAX_N = 128


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIModel(BaseModel):
    # unknown fields (other servers' extensions) are ignored, as OpenAI's own server does
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


# errors


class ErrorInfo(OpenAIModel):
    message: str
    type: str
    param: Optional[str] = None
    code: int


class ErrorResponse(OpenAIModel):
    error: ErrorInfo


# requests


class StreamOptions(OpenAIModel):
    include_usage: Optional[bool] = False


class SamplingFields(OpenAIModel):
    """Fields both endpoints share; None means the SamplingParams default."""
    model: Optional[str] = None
    n: int = 1
    best_of: Optional[int] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    min_tokens: int = 0
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    logit_bias: Optional[dict[str, float]] = None

    def _sampling_kwargs(self, default_max_tokens: Optional[int]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "n": self.n, "best_of": self.best_of, "seed": self.seed, "stop": self.stop,
            "stop_token_ids": self.stop_token_ids, "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "max_tokens": self.max_tokens if self.max_tokens is not None else default_max_tokens,
        }
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        return kwargs

    def check_unsupported(self) -> None:
        if self.n > MAX_N:
            raise ValueError(f"n must be <= {MAX_N}, got {self.n}")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    prompt_logprobs: Optional[int] = None

    def to_sampling_params(self) -> SamplingParams:
        self.check_unsupported()
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.echo:
            raise ValueError("echo is not supported")
        return SamplingParams(logprobs=self.logprobs, prompt_logprobs=self.prompt_logprobs,
                              **self._sampling_kwargs(16))

    def prompts(self) -> list[Union[str, list[int]]]:
        """The prompts as strings or token id lists; a batch of one or more."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class ChatMessage(OpenAIModel):
    role: str
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None

    def text(self) -> str:
        """The content as one string; list content keeps its text parts."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ValueError(f"messages: content part type {part.get('type')!r} is not "
                                 "supported (text only)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    add_generation_prompt: bool = True
    chat_template: Optional[str] = None

    def to_sampling_params(self) -> SamplingParams:
        self.check_unsupported()
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise ValueError("top_logprobs needs logprobs=true")
            # the upper bound is the server's --max-logprobs, checked by the engine
            if self.top_logprobs < 0:
                raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")
        kwargs = self._sampling_kwargs(None)
        if self.max_completion_tokens is not None:
            kwargs["max_tokens"] = self.max_completion_tokens
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return SamplingParams(logprobs=logprobs, **kwargs)

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


class TokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    tokens: list[int]


# responses


class UsageInfo(OpenAIModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(OpenAIModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class CompletionResponse(OpenAIModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: Optional[UsageInfo] = None


class ChatTopLogprob(OpenAIModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatLogprobToken(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogProbs(OpenAIModel):
    content: Optional[list[ChatLogprobToken]] = None


class ChatResponseMessage(OpenAIModel):
    role: str = "assistant"
    content: Optional[str] = None


class ChatCompletionResponseChoice(OpenAIModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionResponse(OpenAIModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class DeltaMessage(OpenAIModel):
    role: Optional[str] = None
    content: Optional[str] = None


class ChatCompletionStreamChoice(OpenAIModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionStreamResponse(OpenAIModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(OpenAIModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(OpenAIModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
