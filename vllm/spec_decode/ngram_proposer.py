"""N-gram prompt lookup (Saxena 2023, "Prompt Lookup Decoding"): find the latest earlier place
where the sequence's last n tokens occurred (n from max down to min) and propose the tokens that
followed it there. No model, no probabilities: a deterministic proposal."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from vllm.core.request import Request
from vllm.spec_decode.proposer import Proposal, ProposalHandle, Proposer


def lookup(token_ids: list[int], max_n: int, min_n: int, num_drafts: int) -> list[int]:
    tokens = np.asarray(token_ids, dtype=np.int64)
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        # windows start at 0 .. length - n - 1: every occurrence before the suffix itself
        windows = sliding_window_view(tokens[:length - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if len(starts):
            follow = int(starts[-1]) + n
            return tokens[follow:follow + num_drafts].tolist()
    return []


class NgramProposer(Proposer):

    def __init__(self, max_n: int, min_n: int) -> None:
        self.max_n = max_n
        self.min_n = min_n

    def propose(self, requests: list[Request], max_num_drafts: list[int]) -> ProposalHandle:
        def compute() -> Proposal:
            drafts = [lookup(r.all_token_ids, self.max_n, self.min_n, k) if k > 0 else []
                      for r, k in zip(requests, max_num_drafts)]
            return Proposal(drafts, [None] * len(drafts))
        return ProposalHandle(compute)
