"""Request: one sequence being generated, as the scheduler, the runner and the detokenizer see it.
Lives on the CPU; holds token ids, KV block ids, progress and outputs."""
import enum
import time
from typing import Any, Optional

import torch

from vllm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()  # handling it failed (ours): RequestOutput.error says why

    @property
    def is_finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> Optional[str]:
        return {RequestStatus.FINISHED_STOPPED: "stop",
                RequestStatus.FINISHED_LENGTH_CAPPED: "length",
                RequestStatus.FINISHED_ABORTED: "abort",
                RequestStatus.FINISHED_ERROR: "error"}.get(self)


class Request:

    def __init__(self, req_id: str, prompt: Optional[str], prompt_token_ids: list[int],
                 sampling_params: SamplingParams, eos_token_id: Optional[int],
                 arrival_time: Optional[float] = None,
                 generator: Optional[torch.Generator] = None) -> None:
        self.req_id = req_id
        self.group_id = req_id  # the caller's request id (differs for the children of n > 1)
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.generator = generator
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.block_ids: list[int] = []
        self.stop_reason: Optional[Any] = None  # the stop string or token id that ended it
        self.num_preemptions = 0
        # filled by the engine
        self.output_text = ""
        self.logprobs: Optional[list[dict]] = [] if sampling_params.logprobs is not None else None
        self.prompt_logprobs: Optional[list] = None
        self.first_token_time: Optional[float] = None
        self.metrics: dict[str, Any] = {}
        self.error: Optional[str] = None  # why it finished with FINISHED_ERROR

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        return self.all_token_ids[start:end]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def __repr__(self) -> str:
        return (f"Request({self.req_id}, status={self.status.name}, prompt={self.num_prompt_tokens}"
                f", out={len(self.output_token_ids)}, computed={self.num_computed_tokens})")
