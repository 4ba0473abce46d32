"""The goodput controller: each step it picks how many tokens to draft (k in 0..K, 0 = plain
decoding) and whether to draft ahead, maximising the expected tokens emitted per second (after
SmartSpec: Liu et al. 2024, "Optimizing Speculative Decoding for Serving Large Language Models
Using Goodput").

Model of a decode step over B requests drafting k tokens each:
    t(k, B) = t_first(B) + (k - 1) * t_draft(B) + t_verify(B * (k + 1))
    goodput(k) = sum over requests r of E_r(k) / t(k, B)
t_draft (one later draft forward, by the number of drafting requests), t_first (the rest of
the engine's wait for a proposal: its first forward, which also catches up on the last one or
two tokens, and, for a draft process, the messages and its waking up) and t_verify (the rest of
the step, by its token count) are learnt online (CostCurve), t_first and t_draft apart from the
drafter's own timing of its forwards (measured on the H200: a one-draft proposal from the draft
process cost 3.6 ms against 0.7 ms per later forward, so a cost per forward alone priced small
k too cheap and large k too dear). E_r(k), the tokens a verification of request r's k drafts
emits, is 1 + the chance its run of accepted drafts reaches 1, 2, .., k (acceptance.py: r's own
runs, per position, with the engine's as their prior, and the engine's with the geometric model
at the engine's acceptance a as theirs; with few verdicts, 1 + a + .. + a^k). One k for the
whole batch: the verification's CUDA graphs are keyed by (batch, tokens per sequence), so every
decoding request drafts the same k.

Drafting ahead (`draft_ahead_overlaps`: the draft on another device than the target) is weighed
per k: the drafter drafts k + 1 past its proposal while the target verifies, and the next
proposal is the wait for those (t_hit) where every request's run reached k + 1 (its drafts all
accepted, its bonus token the draft's guess), else a proposal as above; the k + 1 forwards cost
what they outlast the verification. Each k is priced with or without it, whichever models more
(measured on the H200, trained 7B pair, batch 1: drafting ahead 2.30 / 2.40 / 2.44x plain at
k = 4 / 6 / 8 against 1.89 / 2.04 / 2.04x synchronous; before, the controller chose k as if
every step were synchronous, and whether to draft ahead only at that k).

When k = 0 wins, a one-token probe (k = 1) is taken now and then to measure acceptance again; the
probes are paid from a budget of `probe_fraction` of the time spent, so a useless draft costs
about that much. Decisions change only how fast tokens come, never which: greedy and
rejection-sampled verification are lossless. A step with a seeded request uses the configured
K, so that a seeded request's draws do not depend on timing.

Costs are low quantiles of the last measurements (CostCurve), and every proposal made while the
drafter is caught up measures the draft forward, probes included; a draft process catches up on
the tokens during plain steps while speculation is near (Proposer.observe, `feeding_pays`), so a
probe costs its drafting only. (Measured on the H200: with an average over measurements and the
draft measured only in runs of speculative steps, one early slow proposal priced every k > 0 out
for good, and each probe after plain steps paid a catch-up on all the tokens since.) In a run of
plain steps over the same requests the full choice is remade every PLAIN_RECHECK_STEPS steps, or
at once when a verdict, a draft cost or a request comes or goes.

Batched overlap (`can_split`, the draft in its own process): a split step verifies half the
batch while the drafter drafts the other half, then the halves swap; it takes
    t_split(k, B) = max(t_first(B/2) + (k - 1) * t_draft(B/2), t_verify(B/2 * (k + 1)))
for half the batch's tokens, and is chosen when that models more goodput than any unsplit k
(by SPLIT_MARGIN): when drafting a whole batch costs about as much as verifying it.

Exploring upward (`explore_upward`, a target on the CPU): an unmeasured verification size is
read from the sizes measured (flat beyond the largest), which on a GPU, memory-bound up to
dozens of tokens, is close; a CPU target's verification is bound by its multiply-adds from a few
rows, each token costing about the same (2-core AVX2 EPYC, Qwen2.5-Coder-1.5B at batch 4: 155
ms a plain step, 850 ms a verification of 4 x 5 tokens), so a first choice of the configured K
priced 5x too cheap paid its 5x twice before its bucket counted. There k climbs one at a time:
a step's k is at most one past the k of the largest verification size measured (its bucket
counting), so every k on the way is measured, not read between two others. (Climbing by
octaves of the sizes, twice the largest at most, never measured k = 2 at batch 4 (1 -> 3 -> 4):
read between 8 and 16 tokens, a verification of 12 was priced half way, where the CPU's
register tiles, a pass per 6 rows, cost it about what 8 rows cost; on a 2-core AVX-512 Xeon
`make demo` took k = 3-4 at 30 tok/s, where k = 2 gave 31.8.)

What the model leaves out (a prefill beside the verification, the engine's work per emitted
token, the extra prefill steps of staggered finishes) the realized-goodput guard weighs
(realized.py): a choice to speculate stands only where speculating steps, timed end to end,
have not emitted fewer tokens per second than plain ones."""
import bisect
import itertools
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

from vllm.spec_decode.acceptance import (Acceptance, AcceptedRuns, RunOdds, hazards_of,
                                         tokens_and_hits)
from vllm.spec_decode.realized import RealizedGoodput


# a split step must model this much more goodput than the best unsplit step to be chosen
SPLIT_MARGIN = 0.05
# a cost bucket's estimate is the lower quartile of its last this many measurements
COST_WINDOW = 7
# in a run of plain steps over the same requests with nothing new learnt but plain steps' costs,
# the full choice is remade every this many steps (the steps between only weigh a probe)
PLAIN_RECHECK_STEPS = 16
# in a run of plain steps the drafter is kept caught up (fed the tokens) only while speculation
# is near: the best k > 0 models at least this share of plain decoding's goodput, or a probe
# has half its cost in credit
FEED_NEAR = 0.9
# decode steps kept in GoodputController.trace, one tuple of TRACE_FIELDS each (seconds; the
# estimates are the model's before the step's own measurements)
TRACE_STEPS = 4096
TRACE_FIELDS = ("k", "requests", "propose_s", "step_s", "drafter_s", "first_forward_s",
                "catch_up_tokens", "measured", "t_draft_s", "t_first_s", "draft_ahead",
                "modelled_speedup", "acceptance", "ahead_hit", "queued_s")


class CostCurve:
    """Seconds as a function of a size, learnt online: per half-octave bucket of size, the mean
    size and the lower quartile of the seconds of the bucket's last `window` measurements, read
    by linear interpolation between buckets; beyond the largest bucket the slope of the last
    two is kept (flat with one). Never decreasing in size.

    Low figures, because a cost priced too high is not measured again (what it prices out is
    not chosen; only the probes, budgeted by that same price, measure it), while one priced
    too low is chosen and so measured at once. Measured on the H200: one first proposal of
    105 ms, against ~7 ms for those after it, kept the controller plain for ~520 steps. So a
    bucket counts from its second measurement on (its first may have paid a warm-up: the
    drafter's first proposal, a graph capture); until then its sizes read from the other
    buckets, or as unmeasured. With two to four the lowest counts; from five on the second
    lowest: stalls and warm-ups move nothing, a lasting fall comes through at once and a
    lasting rise after three quarters of the window. A bucket's first measurement may only
    lower its own sizes' reading: a cost it shows lower than the curve's is chosen again and
    so measured a second time. (On a 2-core AVX-512 Xeon, a CPU target at batch 4, k = 2's
    first verification of 12 tokens, read instead from the 4- and 8-token buckets, was priced
    below plain decoding and not taken again.)"""

    def __init__(self, window: int = COST_WINDOW) -> None:
        self.window = window
        self.samples: dict[int, deque] = {}  # bucket -> deque of (size, seconds)
        self._bucket_points: dict[int, tuple[float, float]] = {}  # buckets that count
        self._xs: list[float] = []  # their (mean size, lower-quartile seconds), by size
        self._ys: list[float] = []
        self._ys_max: list[float] = []  # the most of _ys up to each
        self._estimates: dict[float, Optional[float]] = {}  # size -> estimate, until a record
        self._firsts: dict[int, float] = {}  # bucket -> its one measurement (not counting yet)

    @staticmethod
    def _bucket(size: float) -> int:
        return round(2 * math.log2(max(size, 1)))

    def record(self, size: float, seconds: float) -> None:
        key = self._bucket(size)
        bucket = self.samples.get(key)
        if bucket is None:
            bucket = self.samples[key] = deque(maxlen=self.window)
        bucket.append((float(size), seconds))
        if len(bucket) < 2:
            self._firsts[key] = seconds  # provisional: may lower its own sizes' estimates
            self._estimates.clear()
            return
        self._firsts.pop(key, None)
        times = sorted(t for _, t in bucket)
        point = (sum(x for x, _ in bucket) / len(bucket), times[(len(times) - 1) // 4])
        if self._bucket_points.get(key) == point:
            return  # the same curve: the estimates kept stand
        self._bucket_points[key] = point
        pts = sorted(self._bucket_points.values())
        self._xs = [x for x, _ in pts]
        self._ys = [t for _, t in pts]
        self._ys_max = list(itertools.accumulate(self._ys, max))
        self._estimates.clear()

    def largest_measured(self) -> Optional[float]:
        """The mean size of the largest bucket that counts (None: none does)."""
        return self._xs[-1] if self._xs else None

    def measured(self, size: float) -> bool:
        """Whether size's bucket counts (holds two measurements or more)."""
        return self._bucket(size) in self._bucket_points

    def estimate(self, size: float) -> Optional[float]:
        """The modelled seconds at size (None before any bucket counts); a decision asks the
        same few sizes dozens of times, so each answer is kept until the next record."""
        try:
            return self._estimates[size]
        except KeyError:
            estimate = self._interpolate(size)
            first = self._firsts.get(self._bucket(size))
            if estimate is not None and first is not None:
                estimate = min(estimate, first)
            self._estimates[size] = estimate
            return estimate

    def _interpolate(self, size: float) -> Optional[float]:
        xs, ys = self._xs, self._ys
        if not xs:
            return None
        i = bisect.bisect_right(xs, size)  # xs[i - 1] <= size < xs[i]
        if i == 0:
            return ys[0]
        best = self._ys_max[i - 1]  # the curve is made non-decreasing
        if i < len(xs):
            x0, t0, x1, t1 = xs[i - 1], ys[i - 1], xs[i], ys[i]
            return max(best, t0 + (size - x0) / max(x1 - x0, 1e-9) * (t1 - t0))
        if len(xs) == 1:
            return best
        slope = max(0.0, (ys[-1] - ys[-2]) / max(xs[-1] - xs[-2], 1e-9))
        return max(best, ys[-1] + slope * (size - xs[-1]))


def later_forward_seconds(k: int, seconds: float,
                          first_forward_s: Optional[float]) -> Optional[float]:
    """One draft forward after the first, from a proposal of k drafts the drafter timed at
    seconds, of which its first forward first_forward_s; None for a one-draft proposal timed
    so (it has no later forward: its first one also catches up on the last token or two and
    costs about twice a later one, 1.16 against 0.54 ms on the H200's host). Without the
    first forward's time, the k forwards are taken as equal."""
    if first_forward_s is None:
        return seconds / k
    return (seconds - first_forward_s) / (k - 1) if k > 1 else None


@dataclass
class StepTally:
    """What the steps of one k cost, summed (StepTally per k: GoodputController.by_k): the
    engine's wait for proposals, the drafter's own timing of them and of their first forwards,
    the whole steps, and the tokens the draft had to catch up on."""
    steps: int = 0
    measured: int = 0  # steps whose proposal measured the draft (the drafter was caught up)
    propose_s: float = 0.0
    step_s: float = 0.0
    timed: int = 0  # steps with the drafter's timing
    drafter_s: float = 0.0
    first_forward_s: float = 0.0
    catch_up_tokens: int = 0

    def as_dict(self) -> dict:
        n, t = max(self.steps, 1), max(self.timed, 1)
        return {"steps": self.steps, "measured": self.measured,
                "propose_ms": 1e3 * self.propose_s / n, "step_ms": 1e3 * self.step_s / n,
                "drafter_ms": 1e3 * self.drafter_s / t,
                "first_forward_ms": 1e3 * self.first_forward_s / t,
                "catch_up_tokens": self.catch_up_tokens / n}


@dataclass
class Decision:
    k: int  # drafts per decoding request this step (0: plain decoding)
    draft_ahead: bool = False
    probe: bool = False  # k = 1 taken to measure acceptance, not because the model chose it
    modelled_speedup: Optional[float] = None  # goodput(k) / goodput(0), when both are modelled
    split: bool = False  # batched overlap: half the batch verifies while the other half drafts


class GoodputController:

    def __init__(self, max_k: int, prior_acceptance: float = 0.6, prior_weight: float = 2.0,
                 decay: float = 0.98, probe_fraction: float = 0.03,
                 draft_ahead_overlaps: bool = False, explore_upward: bool = False) -> None:
        self.max_k = max_k
        self.prior_acceptance = prior_acceptance
        self.prior_weight = prior_weight
        self.decay = decay
        self.probe_fraction = probe_fraction
        # the draft runs on another device than the target: drafting ahead overlaps the
        # verification (else the engine does not draft ahead, or it is forced on)
        self.draft_ahead_overlaps = draft_ahead_overlaps
        # the target's verification grows with its tokens (a CPU target): k climbs one at a
        # time past the verification sizes measured (reach)
        self.explore_upward = explore_upward
        self.t_draft = CostCurve()  # one later draft forward, by drafting requests
        self.t_first = CostCurve()  # a proposal's wait less its later forwards, by requests
        self.t_verify = CostCurve()  # the step less drafting, by tokens
        # the engine's wait for a proposal whose drafts were all made ahead, by requests
        self.t_hit = CostCurve()
        self.engine_acceptance = Acceptance()
        # how far runs of accepted drafts reach, positions 1..max_k + 1 (the last: a guess
        # made ahead after k accepted drafts)
        self.runs = AcceptedRuns(max_k + 1, decay)
        self.request_runs: dict[str, AcceptedRuns] = {}  # each request's own
        # requests whose drafts were all accepted in a step that drafted ahead, and of those
        # the ones whose bonus token was the draft's guess (record_ahead)
        self.num_ahead_heard = self.num_ahead_used = 0
        self.probe_credit = 0.0  # seconds the probes may still spend
        # a probe after plain steps makes the draft catch up on every token it has not seen:
        # its seconds per such token (the median of the last probes), so that a probe's cost
        # is foreseen from the tokens it would catch up on
        self.probe_cost_per_token: Optional[float] = None
        self._probes: deque = deque(maxlen=COST_WINDOW)  # seconds per caught-up token
        self.catch_up_tokens = 0  # of the decoding requests now (set by decide)
        self.last = Decision(0)
        # the last choice's best goodput with drafting over plain decoding's (None: unmodelled)
        self.best_spec_ratio: Optional[float] = None
        self.last_batch = 1
        # a run of plain steps: (requests, changes) of the last full choice, which chose plain,
        # and the steps it still stands for; changes counts what can move a choice but plain
        # steps' costs (verdicts, draft costs, freed requests)
        self._plain_key: Optional[tuple] = None
        self._plain_steps_left = 0
        self._changes = 0
        self.num_probes = 0
        self.k_histogram = [0] * (max_k + 1)
        self.by_k = [StepTally() for _ in range(max_k + 1)]  # decode steps' costs per k
        # the last decode steps, one tuple each (see record_step), for a benchmark to print:
        # how the costs and the choices moved over a run
        self.trace: deque = deque(maxlen=TRACE_STEPS)
        # batched overlap may be chosen (the draft runs in its own process, beside the target)
        self.can_split = False
        self.num_split_steps = 0
        # the guard on what the model leaves out: speculation only where it measured more
        # tokens per second than plain decoding (realized.py); the engine records each step's
        # end-to-end time under `arm`, the last decision's (decoding requests, speculating), or
        # not at all (None: a probe, a seeded step, no decoding request)
        self.realized = RealizedGoodput()
        self.arm: Optional[tuple[int, bool]] = None

    # estimates

    def acceptance(self) -> float:
        """The engine's acceptance: the chance a judged draft is accepted (geometric fit)."""
        return self.engine_acceptance.estimate(self.prior_acceptance, self.prior_weight)

    def _proposal_costs(self, batch: int) -> Optional[tuple[float, float]]:
        """(t_first, t_draft) of a proposal for batch requests, t_first read as one draft
        forward until measured; None while the draft forward is unmeasured."""
        draft = self.t_draft.estimate(batch)
        if draft is None:
            return None
        first = self.t_first.estimate(batch)
        return (draft if first is None else first), draft

    def propose_seconds(self, k: int, batch: int) -> float:
        """Modelled seconds of a proposal of k drafts for batch requests: t_first plus k - 1
        later forwards. Unmeasured drafting is taken as free, so that it is tried until a
        proposal made while the drafter was caught up has measured it (once per engine:
        afterwards the curves cover every batch size)."""
        costs = self._proposal_costs(batch)
        if k == 0 or costs is None:
            return 0.0
        return costs[0] + (k - 1) * costs[1]

    def propose_seconds_by_k(self, batch: int) -> list[float]:
        """propose_seconds(k, batch) for k = 0..max_k, the estimates read once."""
        costs = self._proposal_costs(batch)
        if costs is None:
            return [0.0] * (self.max_k + 1)
        first, draft = costs
        return [0.0] + [first + (k - 1) * draft for k in range(1, self.max_k + 1)]

    def step_seconds_by_k(self, batch: int) -> Optional[list[float]]:
        """For k = 0..max_k: the modelled seconds of a decode step of batch requests drafting k
        each, t(k, B) of the module's docstring (None when the plain step is not measured
        yet)."""
        plain = self.t_verify.estimate(batch)
        if plain is None:
            return None
        verify = self.t_verify.estimate
        propose = self.propose_seconds_by_k(batch)
        return [plain] + [propose[k] + max(plain, verify(batch * (k + 1)))
                          for k in range(1, self.max_k + 1)]

    def reach(self, batch: int) -> int:
        """The largest k a step of batch requests may choose: max_k, or exploring upward, one
        past the k of the largest verification size measured (whose tokens are batch * (k + 1)):
        largest / batch, rounded (1 at least, from plain steps alone; at most max_k)."""
        if not self.explore_upward:
            return self.max_k
        largest = self.t_verify.largest_measured() or batch
        return max(1, min(self.max_k, int(largest / batch + 0.5)))

    def split_step_seconds(self, k: int, batch: int) -> Optional[float]:
        """Modelled seconds of a split step: half the batch is verified (k drafts each) while
        the draft process drafts k for the other half; the slower of the two sets the pace."""
        half, other = batch - batch // 2, batch // 2
        plain = self.t_verify.estimate(half)
        verify = self.t_verify.estimate(half * (k + 1))
        if plain is None or verify is None or self.t_draft.estimate(other) is None:
            return None
        draft = self.propose_seconds(k, other)
        if not self.t_draft.measured(other):
            # never measured at this batch: optimistically proportional to the whole batch's
            # cost, so that one split is tried; its measurement then corrects the model
            draft = min(draft, self.propose_seconds(k, batch) * other / batch)
        return max(draft, max(plain, verify))

    def ahead_step_seconds(self, batch: int, seconds: list[float],
                           odds: RunOdds) -> Optional[list[float]]:
        """For k = 0..max_k (0: None): the modelled seconds of a decode step of batch requests
        drafting k each and drafting ahead during the verification, from seconds, the same
        step's without drafting ahead (step_seconds_by_k), and odds, the chances that the
        drafts made ahead are used (a request's k drafts accepted, its bonus token the draft's
        guess). Where they are for every request, the next proposal is the wait for them
        (t_hit, free until measured); else it drafts for those they are not used for (a
        smaller batch). The k + 1 forwards ahead delay the next proposal by as much as they
        outlast the verification. None before the draft forward is measured."""
        draft = self.t_draft.estimate(batch)
        if draft is None:
            return None
        hit_wait = self.t_hit.estimate(batch) or 0.0
        proposals = self.propose_seconds_by_k(batch)
        out: list[Optional[float]] = [None]
        for k in range(1, self.max_k + 1):
            propose = proposals[k]
            p_all = odds.all_hit[k]
            if p_all < 1.0:  # the requests missed, where not all hit
                missed = min(batch, max(1.0, (batch - odds.hits[k]) / (1.0 - p_all)))
                missed_propose = propose if missed == batch else self.propose_seconds(k, missed)
                wait = p_all * hit_wait + (1.0 - p_all) * missed_propose
            else:
                wait = hit_wait
            stall = max(0.0, (k + 1) * draft - (seconds[k] - propose))
            out.append(seconds[k] - propose + min(wait, propose) + stall)
        return out

    def split_goodput(self, k: int, batch: int, tokens: list[float]) -> Optional[float]:
        """Tokens per second of split steps over batch requests: each emits the tokens of half
        the batch. tokens: the summed tokens per verification by k (run_odds)."""
        t = self.split_step_seconds(k, batch)
        if t is None:
            return None
        half = batch - batch // 2
        return tokens[k] / batch * half / t

    def run_odds(self, req_ids: list[str], can_hit: Optional[list[bool]] = None) -> RunOdds:
        """The tokens a verification of each k emits over req_ids and the chances that drafts
        made ahead are used (acceptance.py): each request's runs, the engine's as their prior,
        whose prior is the engine's geometric acceptance."""
        engine = self.runs.hazards([1.0 - self.acceptance()] * self.runs.max_len)
        get = self.request_runs.get
        if len(req_ids) > 4:  # one array for many (a list each costs 4x the decision at 64)
            hazards = hazards_of([get(r) for r in req_ids], engine)
        else:
            hazards = []
            for req_id in req_ids:
                runs = get(req_id)
                hazards.append(engine if runs is None else runs.hazards(engine))
        return tokens_and_hits(hazards, self.max_k, can_hit)

    # decisions

    def decide(self, req_ids: list[str], seeded: bool, catch_up_tokens: int = 0,
               can_hit: Optional[list[bool]] = None,
               tokens_left: Optional[Callable[[], Optional[float]]] = None) -> Decision:
        """k and drafting ahead for a step whose decoding requests are req_ids; catch_up_tokens:
        the tokens of theirs the draft has not seen (what a probe would make it catch up on);
        can_hit: per request, whether drafts are made ahead for it (greedy requests; default
        all); tokens_left: gives the most tokens each may still generate, on average (None:
        unknown); asked only where resuming would catch up on more than a token or two a
        request (_resume_seconds), not every step."""
        self.catch_up_tokens = catch_up_tokens
        self.arm = None
        if seeded:  # depends on nothing timed: the configured k
            decision = Decision(self.max_k, draft_ahead=self.draft_ahead_overlaps)
        elif not req_ids:
            decision = Decision(0)
        else:
            if self._plain_steps_left > 0 and self._plain_key == (tuple(req_ids), self._changes):
                self._plain_steps_left -= 1  # still plain: only whether a probe is due
                decision = self._probe_or_plain(len(req_ids))
            else:
                self._plain_steps_left = 0
                decision = self._choose(req_ids, can_hit, tokens_left)
                if self._plain_steps_left:
                    self._plain_key = (tuple(req_ids), self._changes)
            if decision.k > 0 and not decision.probe and not self._realized_allows(req_ids):
                decision = Decision(0, modelled_speedup=1.0)
            if not decision.probe:
                self.arm = (len(req_ids), decision.k > 0)
        self.last = decision
        self.k_histogram[decision.k] += 1
        self.num_split_steps += decision.split
        return decision

    def _realized_allows(self, req_ids: list[str]) -> bool:
        """The realized-goodput guard's word on speculating over the decoding requests."""
        plain_s = self.t_verify.estimate(len(req_ids))
        return self.realized.allows(req_ids, len(req_ids) / plain_s if plain_s else None)

    def _choose(self, req_ids: list[str], can_hit: Optional[list[bool]],
                tokens_left: Optional[Callable[[], Optional[float]]] = None) -> Decision:
        batch = self.last_batch = len(req_ids)
        seconds = self.step_seconds_by_k(batch)
        if seconds is None:
            return Decision(0)  # measure a plain step first: it costs nothing extra
        odds = self.run_odds(req_ids, can_hit)
        tokens = odds.tokens
        resume = self._resume_seconds(batch, tokens_left)
        if resume:  # each speculative step's share of the catch-up that resuming costs
            cost, left = resume
            seconds = seconds[:1] + [t + cost * n / batch / left
                                     for t, n in zip(seconds[1:], tokens[1:])]
        rates = [n / t for n, t in zip(tokens, seconds)]
        ahead = [False] * len(rates)
        ahead_seconds = (self.ahead_step_seconds(batch, seconds, odds)
                         if self.draft_ahead_overlaps else None)
        for i, t in enumerate(ahead_seconds or ()):
            if t is not None and tokens[i] / t > rates[i]:
                rates[i], ahead[i] = tokens[i] / t, True
        plain = rates[0]
        reach = self.reach(batch)
        self.best_spec_ratio = max(rates[1:reach + 1], default=0.0) / plain
        k = max(range(reach + 1), key=lambda i: (rates[i], -i))
        split = self._best_split(batch, tokens, reach)
        if split is not None and split[1] > rates[k] * (1 + SPLIT_MARGIN):
            return Decision(split[0], False, False, split[1] / plain, split=True)
        if k > 0:
            return Decision(k, ahead[k], False, rates[k] / plain)
        self._plain_steps_left = PLAIN_RECHECK_STEPS - 1
        return self._probe_or_plain(batch)

    def _resume_seconds(self, batch: int, tokens_left: Optional[Callable[[], Optional[float]]]
                        ) -> Optional[tuple[float, float]]:
        """What speculating costs first after a run of plain steps where the drafter was not fed
        (a drafter in the engine's process): its catch-up on every token since, beyond the
        token or two a request that every proposal catches up on, at the cost per token the
        catch-ups measured, with the tokens the requests have left (tokens_left, asked only
        here; None while either is unknown or nothing beyond the usual is to be caught up on).
        _choose spreads it over the steps the requests have left at each k (the tokens left
        over the tokens a step emits). (2-core AVX-512 Xeon, `make demo`'s pair on the CPU at
        batch 4: after 37 plain steps, with ~16 tokens left, k = 2 was chosen again; its first
        step took 2.96 s, against ~0.35 s for a k = 2 step and ~0.14 for a plain one.)"""
        excess = self.catch_up_tokens - 2 * batch
        if self.probe_cost_per_token is None or tokens_left is None or excess <= 0:
            return None
        left = tokens_left()
        return (self.probe_cost_per_token * excess, left) if left else None

    def _probe_or_plain(self, batch: int) -> Decision:
        """Plain decoding was chosen: a one-draft probe if the probes' credit pays for one."""
        cost = self._probe_cost(batch)
        self.probe_credit = min(self.probe_credit, cost)  # no burst of probes
        if self.probe_credit >= cost:
            self.probe_credit -= cost
            self.num_probes += 1
            return Decision(1, False, True, 1.0)
        return Decision(0, False, False, 1.0)

    def feeding_pays(self) -> bool:
        """Whether, in a plain step, the drafter should catch up on the tokens (so that the
        next speculative step or probe costs drafting only): while speculation is near (the
        last choice modelled a k > 0 within FEED_NEAR of plain decoding, or nothing is modelled
        yet) or a probe has half its cost in credit. With a useless draft the drafter then idles
        between probes instead of running a forward beside every step. (Measured on the H200,
        a never-accepted draft fed every step: the plain steps ran 0.4-1.2 ms slower than plain
        decoding at batch 1-32; how much of that the feeding caused was not measured apart.)"""
        if self.best_spec_ratio is None or self.best_spec_ratio >= FEED_NEAR:
            return True
        return self.probe_credit >= 0.5 * self._probe_cost(self.last_batch)

    def _probe_cost(self, batch: int) -> float:
        """Foreseen seconds of a one-draft probe over a plain step: the model's, plus the
        tokens it would catch up on at the cost per token the last probes measured beyond the
        model's. (Priced per token alone, as before, a probe after a long run of plain steps
        was dearer than the credit could ever reach, which grows by the same steps: on the H200
        a request that went plain was never probed again, 116 steps, its catch-up forward of
        117 tokens costing 2.1 ms against 0.7 ms for one.)"""
        modelled = self._modelled_probe_cost(batch)
        if self.probe_cost_per_token is None:
            return modelled
        return modelled + self.probe_cost_per_token * max(self.catch_up_tokens, batch)

    def _modelled_probe_cost(self, batch: int) -> float:
        """The model's seconds of a one-draft step over a plain one (no catch-up)."""
        seconds = self.step_seconds_by_k(batch)
        return 0.0 if seconds is None else seconds[1] - seconds[0]

    def _best_split(self, batch: int, tokens: list[float],
                    reach: int) -> Optional[tuple[int, float]]:
        """(k <= reach, modelled tokens/s) of the best split step, or None when splitting is
        not an option (fewer than 2 decoding requests, no draft process) or not modelled
        yet."""
        if not self.can_split or batch < 2:
            return None
        best = None
        for k in range(1, reach + 1):
            rate = self.split_goodput(k, batch, tokens)
            if rate is not None and (best is None or rate > best[1]):
                best = (k, rate)
        return best

    # measurements

    def record_step(self, decision: Decision, num_decoding: int, num_tokens: int,
                    draft_s: float, step_s: float, draft_measured: bool,
                    drafter_s: Optional[float] = None,
                    first_forward_s: Optional[float] = None, ahead_hit: bool = False,
                    queued_s: float = 0.0) -> None:
        """A decode-only step ran: num_decoding requests, num_tokens tokens verified, draft_s of
        its step_s seconds spent proposing. draft_measured: the drafter was caught up (each
        drafting request drafted in the previous step, or the drafter had seen all its tokens
        but the last one or two), so draft_s is k forwards, not a catch-up on a prompt or on a
        run of plain steps. drafter_s, first_forward_s: the drafter's own timing of the
        proposal and of its first forward, where it reports them. ahead_hit: every request's
        drafts had been made ahead (draft_s: the wait for them). queued_s: of draft_s, the
        wait for the drafter to finish drafting ahead past the last proposal (priced apart:
        ahead_step_seconds' stall; on the H200 it went into the proposal's fixed cost, 1.0 ->
        2.2 ms, where the forwards ahead outlasted the verification)."""
        tally = self.by_k[decision.k]
        tally.steps += 1
        tally.measured += bool(draft_measured)
        tally.propose_s += draft_s
        tally.step_s += step_s
        tally.catch_up_tokens += self.catch_up_tokens
        if drafter_s is not None:
            tally.timed += 1
            tally.drafter_s += drafter_s
            tally.first_forward_s += first_forward_s or 0.0
        self.trace.append((decision.k, num_decoding, draft_s, step_s, drafter_s,
                           first_forward_s, self.catch_up_tokens, bool(draft_measured),
                           self.t_draft.estimate(num_decoding),
                           self.t_first.estimate(num_decoding), decision.draft_ahead,
                           decision.modelled_speedup, self.acceptance(), ahead_hit, queued_s))
        if decision.probe:
            plain = self.t_verify.estimate(num_decoding)
            if plain is not None:
                extra = max(step_s - plain, draft_s)  # at least its drafting, however noisy
                # a probe after a run of plain steps may pay the draft's catch-up on every
                # token since: what it cost beyond the model's probe, per caught-up token
                # (medians of the last probes)
                beyond = max(0.0, extra - self._modelled_probe_cost(num_decoding))
                self._record_catch_up(beyond / max(self.catch_up_tokens, num_decoding))
        elif (decision.k > 0 and not draft_measured and not ahead_hit and draft_s > 0
              and self.catch_up_tokens >= 2 * num_decoding):
            # a speculative step whose drafter caught up first (on the prompts, after plain
            # steps) prices a probe's catch-up too, before any probe has: its proposal beyond
            # the model's, per caught-up token (2-core CPU, a 0.5B draft beside a 1.5B target
            # on the same cores: ~7-12 ms a token; priced at nothing, the first probe after
            # 40 plain steps caught up on 163 tokens in 1.15 s, 7 plain steps' time)
            beyond = max(0.0, draft_s - self.propose_seconds(decision.k, num_decoding))
            self._record_catch_up(beyond / self.catch_up_tokens)
        self.t_verify.record(num_tokens, max(step_s - draft_s, 0.0))
        if decision.k > 0 and ahead_hit and not decision.split:
            self.t_hit.record(num_decoding, max(draft_s - queued_s, 0.0))
        if decision.k > 0 and draft_measured and not decision.split:
            self._record_proposal(num_decoding, decision.k, max(draft_s - queued_s, 0.0),
                                  drafter_s, first_forward_s)
        if decision.k == 0:
            self.probe_credit += self.probe_fraction * step_s

    def _record_catch_up(self, seconds_per_token: float) -> None:
        """A catch-up's seconds per caught-up token: probes are priced by the median of the
        last ones (probe_cost_per_token)."""
        self._probes.append(seconds_per_token)
        self.probe_cost_per_token = statistics.median_low(self._probes)

    def _record_proposal(self, num_requests: int, k: int, wait_s: float,
                         drafter_s: Optional[float], first_forward_s: Optional[float]) -> None:
        """A proposal of k drafts the engine waited wait_s for: its later forwards as the
        drafter timed them (a one-draft proposal has none), the rest of the wait as t_first;
        without the drafter's timing, k equal forwards."""
        self._changes += 1
        if drafter_s is None or first_forward_s is None:
            self.t_draft.record(num_requests, wait_s / k)
            return
        later = self._record_later_forward(num_requests, k, drafter_s, first_forward_s)
        self.t_first.record(num_requests, max(wait_s - (k - 1) * later, 0.0))

    def _record_later_forward(self, num_requests: int, k: int, seconds: float,
                              first_forward_s: Optional[float]) -> float:
        """Records one later draft forward of a proposal the drafter timed at seconds, and
        returns it; a one-draft proposal has none (0 is returned) and its forward stands in
        only while nothing is measured."""
        later = later_forward_seconds(k, seconds, first_forward_s)
        if later is not None:
            self.t_draft.record(num_requests, later)
            return later
        if self.t_draft.estimate(num_requests) is None:
            self.t_draft.record(num_requests, first_forward_s)
        return 0.0

    def record_draft(self, num_requests: int, k: int, seconds: float,
                     first_forward_s: Optional[float] = None) -> None:
        """A proposal of k drafts for num_requests took the drafter this long (of which its
        first forward first_forward_s), as it measured it: a split step's drafting overlaps the
        verification, so the engine's wait does not show it."""
        self._changes += 1
        self._record_later_forward(num_requests, k, seconds, first_forward_s)

    def record_verdict(self, req_id: str, num_drafts: int, num_accepted: int) -> None:
        """A verification of req_id's num_drafts drafts accepted num_accepted of them."""
        if num_drafts <= 0:
            return
        self._changes += 1
        self.runs.record(num_drafts, num_accepted)
        runs = self.request_runs.get(req_id)
        if runs is None:
            runs = self.request_runs[req_id] = AcceptedRuns(self.max_k + 1, self.decay)
        runs.record(num_drafts, num_accepted)
        self.engine_acceptance.record(num_drafts, num_accepted, self.decay)

    def record_ahead(self, req_id: str, k: int, used: bool) -> None:
        """req_id's k drafts were all accepted in a step that drafted ahead: its bonus token
        was the draft's guess (the drafts made ahead were usable) or not."""
        self._changes += 1
        self.num_ahead_heard += 1
        self.num_ahead_used += used
        self.runs.record_position(k + 1, used)
        runs = self.request_runs.get(req_id)
        if runs is not None:
            runs.record_position(k + 1, used)

    def free(self, req_id: str) -> None:
        self.request_runs.pop(req_id, None)
        self._changes += 1

    def _costs_ms(self) -> dict[str, Optional[float]]:
        """The modelled costs at one drafting request, ms (None: not yet measured, no bucket
        of the curve holding two measurements: CostCurve)."""
        curves = {"draft_forward": self.t_draft, "proposal_fixed": self.t_first,
                  "plain_step": self.t_verify, "ahead_wait": self.t_hit}
        costs = {name: curve.estimate(1) for name, curve in curves.items()}
        return {name: None if s is None else 1e3 * s for name, s in costs.items()}

    def describe(self) -> str:
        """The estimates behind the last decision in words, for the log: a cost not yet
        measured says so, where as_dict's gauges read 0."""
        c = self.as_dict()
        words = {name: "unmeasured" if ms is None else f"{ms:.2f} ms"
                 for name, ms in self._costs_ms().items()}
        return (f"k {c['controller_k']}, acceptance estimate {c['controller_acceptance']:.3f}, "
                f"modelled speedup {c['controller_modelled_speedup']:.2f}x, draft ahead "
                f"{c['controller_draft_ahead']}, probes {c['controller_num_probes']}, draft "
                f"forward {words['draft_forward']}, proposal fixed {words['proposal_fixed']}, "
                f"plain step {words['plain_step']}, k chosen {c['controller_k_steps']}")

    def as_dict(self) -> dict:
        """The estimates behind the last decision (for /metrics; 0 where not yet measured)."""
        last = self.last
        costs = {f"controller_{name}_ms": 0.0 if ms is None else ms
                 for name, ms in self._costs_ms().items()}
        return {"controller_k": last.k, "controller_acceptance": self.acceptance(),
                "controller_modelled_speedup": last.modelled_speedup or 1.0,
                "controller_draft_ahead": int(last.draft_ahead),
                "controller_num_probes": self.num_probes,
                "controller_split": int(last.split),
                "controller_num_split_steps": self.num_split_steps,
                "controller_num_vetoed": self.realized.num_vetoed,
                "controller_num_measuring_plain": self.realized.num_measuring,
                **costs,
                "controller_num_ahead_used": self.num_ahead_used,
                "controller_num_ahead_missed": self.num_ahead_heard - self.num_ahead_used,
                "controller_k_steps": list(self.k_histogram)}
