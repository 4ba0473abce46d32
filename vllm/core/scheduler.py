"""Scheduler: continuous batching. Each step gives every running request its next tokens (one
for decode, a chunk for a prompt) and admits waiting requests while the token budget, the
sequence limit and the KV blocks allow. When blocks run out it preempts the newest running
request (its blocks are freed; it is recomputed from its tokens later), so nothing is lost.
After the step it appends what each request sampled, token by token, up to the first token
that ends it (eos, a stop token id, max_tokens, max_model_len)."""
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Optional

from vllm.config import SchedulerConfig
from vllm.core.block_manager import BlockManager
from vllm.core.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    requests: list[Request] = field(default_factory=list)  # in batch order
    num_scheduled_tokens: list[int] = field(default_factory=list)  # aligned with requests
    preempted: list[Request] = field(default_factory=list)
    # speculative decoding, aligned with requests: KV slots reserved past the last token (k for
    # a decoding request when speculating, else 0), and the drafts the engine put in them
    num_lookahead: list[int] = field(default_factory=list)
    draft_token_ids: list[list[int]] = field(default_factory=list)
    # request index -> draft probs [num_drafts, vocab] (absent: a deterministic proposal)
    draft_probs: dict = field(default_factory=dict)

    @property
    def total_num_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    def samples(self, i: int) -> bool:
        """Whether request i reaches its last known token this step (and so samples)."""
        req = self.requests[i]
        num_real = self.num_scheduled_tokens[i] - len(self.draft_token_ids[i])
        return req.num_computed_tokens + num_real == req.num_tokens

    def is_empty(self) -> bool:
        return not self.requests


@dataclass
class Appended:
    """What Scheduler.update kept of a request's new tokens: the first num_kept (a speculative
    step's tokens after a stop are dropped), and the status the request ends with (None: it
    goes on). The caller finishes it (finish_request) after checking its stop strings, which
    need its text and take precedence over this status."""
    num_kept: int
    status: Optional[RequestStatus] = None


def length_left(req: Request, num_out: int, max_model_len: int) -> int:
    """The output tokens req may still generate after num_out of them: up to its max_tokens
    and to the model's length, whichever comes first (0 or less: capped)."""
    left = max_model_len - req.num_prompt_tokens - num_out
    if req.sampling_params.max_tokens is not None:
        left = min(left, req.sampling_params.max_tokens - num_out)
    return left


def check_token_stop(req: Request, token_id: int, num_out: int, max_model_len: int
                     ) -> Optional[RequestStatus]:
    """Whether req ends at its num_out-th output token, token_id (eos, a stop token id, or a
    length limit); sets req.stop_reason for a stop token id."""
    params = req.sampling_params
    if num_out >= params.min_tokens:
        if not params.ignore_eos and token_id == req.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids:
            req.stop_reason = token_id
            return RequestStatus.FINISHED_STOPPED
    if length_left(req, num_out, max_model_len) <= 0:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None


class Scheduler:

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 max_model_len: int) -> None:
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        # --scheduler-delay-factor: the last step that admitted prompts, from its schedule()
        # to the next one (seconds), and when that step was scheduled (None: not the last)
        self.prompt_step_s = 0.0
        self._prompt_step_start: Optional[float] = None

    def add_request(self, req: Request) -> None:
        if req.req_id in self.requests:
            raise ValueError(f"request id {req.req_id!r} is already in use")
        max_blocks = self.block_manager.num_blocks
        need = self.block_manager.num_blocks_for(req.num_tokens + 1)
        if need > max_blocks:
            raise ValueError(f"request {req.req_id} needs {need} KV blocks but the cache has "
                             f"only {max_blocks}")
        if (req.sampling_params.prompt_logprobs is not None
                and req.num_tokens > self.config.max_num_batched_tokens):
            raise ValueError(f"prompt_logprobs needs the whole prompt ({req.num_tokens} tokens) "
                             f"in one step; max_num_batched_tokens is "
                             f"{self.config.max_num_batched_tokens}")
        self.requests[req.req_id] = req
        self.waiting.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self, num_lookahead: int = 0, resting: Iterable[str] = (),
                 now: Optional[float] = None) -> SchedulerOutput:
        """num_lookahead: KV slots (and token budget) to reserve past the last token of each
        decoding request, for the k drafts of speculative decoding. resting: ids of running
        requests left out of this step (batched overlap: their drafts are being made while
        the others are verified); they keep their KV blocks. now: time.time() (tests set
        it)."""
        now = time.time() if now is None else now
        if self._prompt_step_start is not None:
            self.prompt_step_s = now - self._prompt_step_start
            self._prompt_step_start = None
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        resting = set(resting)
        # 1. running requests first, oldest first; preempt the newest when blocks run out
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.req_id in resting:
                i += 1
                continue
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            decoding = req.num_computed_tokens == req.num_tokens - 1
            lookahead = min(num_lookahead, self.max_model_len - req.num_tokens,
                            budget - num_new) if decoding else 0
            lookahead = max(lookahead, 0)
            while not self.block_manager.grow(req.block_ids,
                                              req.num_computed_tokens + num_new + lookahead):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                break
            out.requests.append(req)
            out.num_scheduled_tokens.append(num_new)
            out.num_lookahead.append(lookahead)
            out.draft_token_ids.append([])
            budget -= num_new + lookahead
            i += 1
        # 2. admit waiting requests (not in a step that had to preempt)
        admitted = 0
        due = bool(self.waiting) and self._admission_due(now)
        while (due and self.waiting and not out.preempted and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if (req.sampling_params.prompt_logprobs is not None
                    and num_new < req.num_tokens - req.num_computed_tokens):
                break  # prompt logprobs are computed over the whole prompt in one step
            if not self.block_manager.grow(req.block_ids, req.num_computed_tokens + num_new):
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.requests.append(req)
            out.num_scheduled_tokens.append(num_new)
            out.num_lookahead.append(0)
            out.draft_token_ids.append([])
            budget -= num_new
            admitted += 1
        if admitted:
            self._prompt_step_start = now
        return out

    def _admission_due(self, now: float) -> bool:
        """Whether waiting prompts may join this step. With --scheduler-delay-factor f > 0 and
        requests running, once the oldest waiting one has waited f times the last prompt
        step's duration: prompts that arrive close together (as the requests of a batch
        finish one by one, which speculative decoding makes common) then share one prefill
        step instead of each stalling the running requests for one. Without running requests,
        or with f = 0, at once."""
        f = self.config.scheduler_delay_factor
        if f <= 0 or not self.running:
            return True
        return now - self.waiting[0].arrival_time >= f * self.prompt_step_s

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.block_manager.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def update(self, out: SchedulerOutput, sampled: list[Optional[list[int]]]
               ) -> list[Optional[Appended]]:
        """Advances each scheduled request by its scheduled tokens and appends what it sampled
        (None for a request still in the middle of its prompt; with drafts, the accepted drafts
        and one target token) up to the first token that ends it. Returns, aligned with
        out.requests, what each kept and its stop status (None: nothing was appended)."""
        appended: list[Optional[Appended]] = []
        for req, num_new, drafts, new_ids in zip(out.requests, out.num_scheduled_tokens,
                                                 out.draft_token_ids, sampled):
            if req.status != RequestStatus.RUNNING:
                appended.append(None)
                continue
            # with drafts, the KV of the last token and of the accepted drafts is kept
            req.num_computed_tokens += len(new_ids) if drafts else num_new
            appended.append(self._append(req, new_ids) if new_ids else None)
        return appended

    def _append(self, req: Request, new_ids: list[int]) -> Appended:
        """Appends new_ids to req one by one (a speculative step brings several) until one ends
        it; the tokens after that one are dropped."""
        for j, token_id in enumerate(new_ids):
            req.output_token_ids.append(token_id)
            status = check_token_stop(req, token_id, len(req.output_token_ids),
                                      self.max_model_len)
            if status is not None:
                return Appended(j + 1, status)
        return Appended(len(new_ids))

    def finish_request(self, req: Request, status: RequestStatus) -> None:
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.block_ids:
            self.block_manager.free(req.block_ids)
            req.block_ids = []
        req.status = status
        self.requests.pop(req.req_id, None)

    def abort_requests(self, req_ids: Iterable[str]) -> list[Request]:
        aborted = []
        for req_id in req_ids:
            req = self.requests.get(req_id)
            if req is not None:
                self.finish_request(req, RequestStatus.FINISHED_ABORTED)
                aborted.append(req)
        return aborted
