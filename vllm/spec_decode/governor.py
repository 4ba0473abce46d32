"""Adaptive switch-off: speculation stays on only while it pays, judged from what the engine
measures. A speculative decode step emits tau tokens per sequence in t_spec (drafting plus
verification); a plain decode step emits one in t_plain. After `window` speculative steps the
governor compares the two rates (per sequence, decode-only steps): if speculation falls below
`margin` of plain decoding, it is switched off for `backoff` steps (doubling on each failed
probe, up to `max_backoff`), during which t_plain is measured, then probed again. With no plain
step measured yet, a few plain steps are taken first to measure one. Steps with a seeded request
are left alone (its output must not depend on timing)."""
from typing import Optional


class SpecGovernor:

    def __init__(self, window: int = 16, backoff: int = 32, max_backoff: int = 1024,
                 margin: float = 0.95, plain_probe: int = 4, decay: float = 0.8) -> None:
        self.window = window
        self.initial_backoff = backoff
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.margin = margin
        self.plain_probe = plain_probe
        self.decay = decay
        self.plain_ms: Optional[float] = None  # per sequence-token, EMA over plain decode steps
        self.spec_ms_per_token: Optional[float] = None  # per emitted token, speculative steps
        self.num_spec = 0  # speculative decode steps since the last decision
        self.off_steps = 0  # plain steps still to take
        self.num_switch_offs = 0

    def _ema(self, old: Optional[float], new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def should_speculate(self) -> bool:
        """Asked once per step."""
        if self.off_steps > 0:
            self.off_steps -= 1
            return False
        return True

    def record_plain(self, step_ms: float, num_seqs: int) -> None:
        """A decode step without speculation: num_seqs tokens in step_ms."""
        self.plain_ms = self._ema(self.plain_ms, step_ms / num_seqs)

    def record_spec(self, step_ms: float, num_emitted: int) -> None:
        """A speculative decode step (drafting + verification) that emitted num_emitted tokens
        over all its sequences."""
        self.spec_ms_per_token = self._ema(self.spec_ms_per_token,
                                           step_ms / max(num_emitted, 1))
        self.num_spec += 1
        if self.num_spec < self.window:
            return
        self.num_spec = 0
        if self.plain_ms is None:
            self.off_steps = self.plain_probe  # nothing to compare with yet: measure plain
        elif self.spec_ms_per_token * self.margin > self.plain_ms:
            self.off_steps = self.backoff
            self.backoff = min(2 * self.backoff, self.max_backoff)
            self.num_switch_offs += 1
        else:
            self.backoff = self.initial_backoff

    @property
    def speedup(self) -> Optional[float]:
        """Measured speculative rate over plain rate (None until both are known)."""
        if self.plain_ms is None or self.spec_ms_per_token is None:
            return None
        return self.plain_ms / self.spec_ms_per_token
