"""The proposer interface: propose k draft tokens per request, hear back how many were
accepted, forget finished requests. `propose` hands back a handle that the engine waits on only
when it needs the drafts, so a proposer can later run beside the target instead of before it
(the implementations here fill the handle synchronously); `propose_ahead` lets a drafter on
another device work while the target verifies."""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from vllm.core.request import Request


@dataclass
class Proposal:
    # per request: up to k draft token ids (empty: no speculation for it this step)
    draft_token_ids: list[list[int]] = field(default_factory=list)
    # per request: the draft distribution p [num_drafts, vocab_size] each token was drawn from,
    # or None when the proposal is deterministic (greedy drafts, n-gram lookup)
    draft_probs: list[Optional[torch.Tensor]] = field(default_factory=list)
    # seconds the proposer computed for, where it knows (a draft process measures its own
    # drafting, which the engine's wait does not show when it overlaps the verification), and
    # of those its first forward's (the catch-up on the tokens it had not seen)
    seconds: Optional[float] = None
    first_forward_seconds: Optional[float] = None
    # the indices of the requests whose drafts were made ahead, during the last verification:
    # no forward ran for them now, so the proposal's time does not measure their drafting
    from_ahead: list[int] = field(default_factory=list)
    # the indices of the requests whose target tokens turned out as drafting ahead guessed them
    # (all the last drafts accepted, the bonus token the draft's next one), their drafts made
    # ahead served or not
    ahead_guessed: list[int] = field(default_factory=list)
    # seconds the proposal waited for the drafter to finish drafting ahead past the last one (a
    # draft process reads the next step only then): the engine's wait less this is the
    # proposal's own
    queued_seconds: float = 0.0

    @property
    def num_from_ahead(self) -> int:
        return len(self.from_ahead)


class ProposalHandle:
    """A proposal that may still be computing; result() waits for it."""

    def __init__(self, compute: Callable[[], Proposal]) -> None:
        self._compute = compute
        self._result: Optional[Proposal] = None

    def result(self) -> Proposal:
        if self._result is None:
            self._result = self._compute()
        return self._result


class Proposer(ABC):
    # set by the engine before each step's proposals: this step drafts ahead (a draft process
    # does so after answering; an in-process proposer is called at propose_ahead)
    draft_ahead: bool = False
    runs_in_own_process: bool = False

    @abstractmethod
    def propose(self, requests: list[Request], max_num_drafts: list[int]) -> ProposalHandle:
        """Drafts up to max_num_drafts[i] tokens to follow requests[i]'s current tokens."""

    def propose_ahead(self) -> None:
        """Called while the target verifies the last proposal: a proposer may draft on past it,
        guessing that every draft is accepted, and use that at the next propose() if the guess
        was right."""

    def observe(self, requests: list[Request]) -> bool:
        """A plain step is about to run for requests: a proposer with time to spare (its own
        process and cores) may catch up on their tokens meanwhile, never making the engine
        wait. True if it took them (their tokens are then as good as seen by a proposal)."""
        return False

    def accept(self, req: Request, num_accepted: int) -> None:
        """requests[i] kept num_accepted of its drafts (plus one target token)."""

    def free(self, req_id: str) -> None:
        """The request finished or was aborted."""

    def shutdown(self) -> None:
        """Releases what the proposer started (a process)."""
