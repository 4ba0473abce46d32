"""How far a verification's drafts are accepted, as the goodput controller estimates it.

Acceptance: the engine's decayed verdict counts, read as one rate a (each judged draft
accepted with probability a until the first rejection, the geometric model).

AcceptedRuns: the engine's (or a request's) run of accepted drafts counted from a
verification's first draft, as a hazard per position m (the chance that draft m is rejected
when drafts 1..m-1 were accepted).
Drafts agree with the target in runs (a boilerplate stretch is accepted draft after draft, a
turn of phrase rejected at once), so long runs are more frequent than a^m says: the chance that
a proposal of k drafts is accepted whole and that the target's bonus token is the draft's next
guess (when drafting ahead pays) is the run reaching k + 1, and the geometric model prices it
low at large k. (Measured on the H200, trained 7B pair, batch 1: drafting ahead added 20% at
k = 8 as at k = 4, where the geometric model has its use fall as a^(k+1).)

A verification of k drafts that accepted n tells positions 1..n survived and, if n < k, that
n + 1 failed (beyond: censored, as in a Kaplan-Meier estimate); drafting ahead tells position
k + 1 of a verification accepted whole. The engine's hazards have the geometric one, 1 - a, as
their prior (a position seldom reached reads as the geometric model); each request keeps its
own, with the engine's as their prior, so a request's own verdicts take over as they come.
(Scaling the engine's hazards by a request's geometric acceptance instead, proportional
hazards, was measured on the H200 to fail: where the engine's runs were either rejected at once
or accepted whole, a request below the engine's rate had its first hazard scaled past 1, was
modelled to accept nothing, and decoded plainly or with one draft for hundreds of steps.)"""
from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class Acceptance:
    """Decayed counts of a request's (or the engine's) verdicts: drafts accepted, and
    verifications that rejected one (each judged draft is a Bernoulli(a) trial up to the first
    rejection, so a = accepted / (accepted + rejections))."""
    accepted: float = 0.0
    rejections: float = 0.0

    def record(self, num_drafts: int, num_accepted: int, decay: float) -> None:
        self.accepted = decay * self.accepted + num_accepted
        self.rejections = decay * self.rejections + (num_accepted < num_drafts)

    def estimate(self, prior: float, weight: float) -> float:
        return (self.accepted + weight * prior) / (self.accepted + self.rejections + weight)


def expected_tokens(a: float, k: int) -> float:
    """Tokens one verification of k drafts emits at acceptance a: 1 + a + ... + a^k."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


# a hazard's prior (the geometric model's) weighs as much as this many latest observations
HAZARD_PRIOR_WEIGHT = 4.0
# rescale the counts when the weight of the next observation passes this (decay by growth)
_RESCALE_AT = 1e100


class AcceptedRuns:
    """Decayed counts, per position m = 1..max_len, of verifications that reached draft m (all
    before it accepted) and of those that rejected it. Decay as Acceptance's, per verdict: each
    new observation weighs 1 / decay times the one before (the counts are rescaled now and then
    instead of decayed one by one)."""

    def __init__(self, max_len: int, decay: float) -> None:
        self.max_len = max_len
        self.decay = decay
        self.reached = [0.0] * (max_len + 1)  # index m; 0 unused
        self.rejected = [0.0] * (max_len + 1)
        self._weight = 1.0  # of the next observation

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """A verification of num_drafts drafts accepted num_accepted of them."""
        w = self._next_weight()
        for m in range(1, min(num_accepted + 1, num_drafts, self.max_len) + 1):
            self.reached[m] += w
        if num_accepted < num_drafts and num_accepted + 1 <= self.max_len:
            self.rejected[num_accepted + 1] += w

    def record_position(self, m: int, accepted: bool) -> None:
        """Position m was reached (drafts 1..m-1 accepted) and the draft there was (not)
        what the target chose: a guess made ahead turned out right or wrong."""
        if not 1 <= m <= self.max_len:
            return
        w = self._next_weight()
        self.reached[m] += w
        if not accepted:
            self.rejected[m] += w

    def _next_weight(self) -> float:
        self._weight /= self.decay
        if self._weight > _RESCALE_AT:
            scale = 1.0 / self._weight
            self.reached = [x * scale for x in self.reached]
            self.rejected = [x * scale for x in self.rejected]
            self._weight = 1.0
        return self._weight

    @property
    def prior_weight(self) -> float:
        """A hazard's prior's weight in the counts' units (HAZARD_PRIOR_WEIGHT latest
        observations)."""
        return self._weight * HAZARD_PRIOR_WEIGHT

    def hazards(self, prior: list[float]) -> list[float]:
        """Per position m = 1..max_len: the chance that draft m is rejected when the ones
        before were accepted; prior: per position, what an unobserved one reads (the engine's
        hazards for a request's; the geometric 1 - a for the engine's), weighing as much as
        HAZARD_PRIOR_WEIGHT observations."""
        w = self.prior_weight
        return [(self.rejected[m] + w * p) / (self.reached[m] + w)
                for m, p in enumerate(prior, start=1)]


def hazards_of(runs: list[Optional[AcceptedRuns]], prior: list[float]) -> np.ndarray:
    """[len(runs), len(prior)]: each one's hazards (AcceptedRuns.hazards) in one array, prior
    itself for a None; for many requests at once (a decision over 64 requests took 0.14 ms with
    one list per request, against 0.035 ms before per-request runs)."""
    n, width = len(runs), len(prior)
    zeros = [0.0] * width
    reached, rejected, weight = [], [], []
    for r in runs:  # flat lists, one array each (a row at a time costs 10x)
        reached += zeros if r is None else r.reached[1:width + 1]
        rejected += zeros if r is None else r.rejected[1:width + 1]
        weight.append(1.0 if r is None else r.prior_weight)
    w = np.array(weight)[:, None]
    p = np.asarray(prior, dtype=np.float64)[None, :]
    return ((np.array(rejected).reshape(n, width) + w * p)
            / (np.array(reached).reshape(n, width) + w))


def tokens_and_hits(hazards, max_k: int,
                    can_hit: Optional[list[bool]] = None) -> "RunOdds":
    """From each request's hazards (rows of positions 1..max_k + 1 at least: lists, or an array
    from hazards_of), for k = 0..max_k: the
    tokens one verification of k drafts per request emits and the chances that drafts made
    ahead are used (a request's run of accepted drafts reaches k + 1: its k drafts accepted and
    its bonus token the draft's next guess), see RunOdds. can_hit: per request, whether drafts
    are made ahead for it at all (greedy requests only; default all)."""
    n = len(hazards)
    mask = [True] * n if can_hit is None else can_hit
    if n > 4:  # numpy's calls cost more than the arithmetic of a few requests
        h = np.asarray(hazards, dtype=np.float64)[:, :max_k + 1]
        reach = np.cumprod(1.0 - np.clip(h, 0.0, 1.0), axis=1)  # the run reaches 1..max_k + 1
        tokens = n + np.cumsum(reach[:, :max_k].sum(axis=0))
        reach *= np.asarray(mask, dtype=np.float64)[:, None]
        return RunOdds([float(n)] + tokens.tolist(), reach.prod(axis=0).tolist(),
                       reach.sum(axis=0).tolist())
    tokens = [float(n)] + [0.0] * max_k
    all_hit, hits = [1.0] * (max_k + 1), [0.0] * (max_k + 1)
    for row, hit_able in zip(hazards, mask):
        reach = 1.0
        for m, hazard in enumerate(row[:max_k + 1], start=1):  # reach: the run reaches m
            reach *= 1.0 - min(1.0, max(0.0, hazard))
            if m <= max_k:
                tokens[m] += reach
            all_hit[m - 1] *= reach if hit_able else 0.0
            hits[m - 1] += reach if hit_able else 0.0
    for k in range(1, max_k + 1):
        tokens[k] += tokens[k - 1]
    return RunOdds(tokens, all_hit, hits)


@dataclass
class RunOdds:
    """By k = 0..max_k, over a step's requests: the tokens a verification of k drafts each
    emits (summed), the chance that the drafts made ahead are used for every request, and the
    number of requests for which they are expected to be."""
    tokens: list[float]
    all_hit: list[float]
    hits: list[float]
