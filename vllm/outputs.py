"""What the engine hands back, with vLLM's field names."""
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# one dict per position: token id -> Logprob (the sampled token plus the top-N)
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[SampleLogprobs] = None
    # "stop", "length", "abort", "error" (ours: see RequestOutput.error) or None while running
    finish_reason: Optional[str] = None
    stop_reason: Any = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    # ours: set when the engine failed this request (its finish_reason is "error"): a fault
    # while handling it alone (sampling, detokenizing, a stop check) or in the forward of its
    # step; other requests go on
    error: Optional[str] = None
