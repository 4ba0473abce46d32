"""The realized-goodput guard: speculation is kept only where it has been measured to emit more
tokens per second than plain decoding.

The goodput controller's model prices a decode-only step from its learnt costs; whatever it
leaves out (a prompt's prefill beside the verification, the engine's own work per emitted token,
the staggered finishes that speculation causes and the extra prefill steps they bring under
closed-loop load) it cannot weigh. Measured on the H200 (trained 7B pair, served, 64 clients):
the model chose speculation in 122 of 322 steps and the server emitted 0.92x plain decoding's
tokens per second (0.75x without a prefill delay), though every decode step it modelled paid.

So the engine's steps are timed end to end (from one step's start to the next one's: the
forward, the sampling, the outputs, the messages) with the tokens each emitted, in two arms per
octave of decoding requests: steps that speculated and plain steps. Where the speculating arm
has been measured below the model's plain decode step and the plain arm not, plain steps are
taken until it is; where the speculating arm's tokens per second fall below the plain arm's by
GUARD_MARGIN, speculation is vetoed there for a while, then measured again (the veto doubling
each time it is renewed, so a draft that never pays at a load costs ever fewer steps).
Speculation's rate belongs to the requests it was measured on (their acceptance): when none of
them remains (at batch 1, the next request) it is measured afresh and a veto lapses.
(Measured on the H200, trained 7B pair, batch 1 offline: without that, the veto of a request
the draft could not follow ran on into the next requests, and the controller reached 1.52x
plain against 1.65x for the best fixed k.) Decisions change only how fast tokens come, never
which."""
import math
from collections import deque
from typing import Optional, Sequence

# steps of an arm that count (the newest); an arm's rate needs at least MIN_SAMPLES of them
WINDOW = 32
MIN_SAMPLES = 8
# speculation is vetoed where it measured this much below plain decoding
GUARD_MARGIN = 0.03
# a veto's first length in decisions at its octave; each renewal doubles it, up to the most
VETO_STEPS = 32
MAX_VETO_STEPS = 1024
# a step whose span is longer was not back to back with the next (the engine idled): not counted
MAX_STEP_S = 1.0


def octave(num_requests: int) -> int:
    return round(math.log2(max(num_requests, 1)))


class _Arm:
    """An arm's newest WINDOW steps, (tokens, seconds) each, with their sums kept as they come
    and go (a rate is read at every decision)."""

    def __init__(self) -> None:
        self.steps: deque = deque()
        self.tokens = 0
        self.seconds = 0.0

    def append(self, tokens: int, seconds: float) -> None:
        if len(self.steps) == WINDOW:
            old_tokens, old_seconds = self.steps.popleft()
            self.tokens -= old_tokens
            self.seconds -= old_seconds
        self.steps.append((tokens, seconds))
        self.tokens += tokens
        self.seconds += seconds

    def __len__(self) -> int:
        return len(self.steps)


class RealizedGoodput:

    def __init__(self) -> None:
        # (octave, speculated) -> its newest steps
        self.arms: dict[tuple[int, bool], _Arm] = {}
        # octave -> decisions still vetoed; octave -> the next veto's length
        self.vetoed: dict[int, int] = {}
        self.veto_length: dict[int, int] = {}
        self.last_requests: dict[int, frozenset] = {}  # octave -> the requests of its last check
        self.num_vetoed = 0  # decisions turned to plain decoding by a veto
        self.num_measuring = 0  # decisions turned to plain decoding to measure plain

    def record(self, num_requests: int, speculated: bool, tokens: int, seconds: float) -> None:
        """A step over num_requests decoding requests emitted tokens in seconds (end to end)."""
        if seconds <= 0.0 or seconds > MAX_STEP_S:
            return
        key = (octave(num_requests), speculated)
        arm = self.arms.get(key)
        if arm is None:
            arm = self.arms[key] = _Arm()
        arm.append(tokens, seconds)

    def rate(self, num_requests: int, speculated: bool) -> Optional[float]:
        """Tokens per second of the arm's newest steps (None: fewer than MIN_SAMPLES)."""
        arm = self.arms.get((octave(num_requests), speculated))
        if arm is None or len(arm) < MIN_SAMPLES:
            return None
        return arm.tokens / arm.seconds

    def allows(self, req_ids: Sequence[str], plain_model: Optional[float] = None) -> bool:
        """Whether a step over the decoding requests req_ids may speculate, as the model chose;
        False turns it into a plain step (to measure plain decoding here, or vetoed).
        plain_model: the model's tokens per second of plain decode steps here (their forward
        alone, so no less than plain decoding realizes end to end): speculation realizing more
        than that by GUARD_MARGIN needs no measurement of plain decoding (at batch 1 on the
        H200 it realizes twice that). Speculation's rate is its requests' (their acceptance):
        where none of the requests of the octave's last check remains (batch 1: the next
        request), it is measured afresh and a veto lapses; plain decoding's rate stands."""
        num_requests = len(req_ids)
        o = octave(num_requests)
        last = self.last_requests.get(o)
        self.last_requests[o] = frozenset(req_ids)
        if last is not None and last.isdisjoint(req_ids):
            self.arms.pop((o, True), None)
            self.vetoed.pop(o, None)
        left = self.vetoed.get(o, 0)
        if left > 0:
            self.vetoed[o] = left - 1
            self.num_vetoed += 1
            if left == 1:  # the veto lapses: speculation is measured afresh
                self.arms.pop((o, True), None)
            return False
        spec, plain = self.rate(num_requests, True), self.rate(num_requests, False)
        if spec is None:
            return True
        if plain is None and plain_model is not None and spec > plain_model * (1 + GUARD_MARGIN):
            return True
        if plain is None:
            self.num_measuring += 1
            return False
        if spec < plain * (1.0 - GUARD_MARGIN):
            length = self.veto_length.get(o, VETO_STEPS)
            self.veto_length[o] = min(2 * length, MAX_VETO_STEPS)
            self.vetoed[o] = length - 1
            self.num_vetoed += 1
            return False
        self.veto_length.pop(o, None)  # speculation pays here: a later veto starts short
        return True
