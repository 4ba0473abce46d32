"""StepTimer: where an engine step's time goes, summed since start, so that a served step can be
compared with an offline one phase by phase (`/metrics`: vllm:engine_step_phase_seconds and
friends; benchmarks print it per run).

    schedule   the controller's k, the scheduler's batch
    propose    waiting for the drafts (a draft process drafts while nothing else runs here)
    execute    the target's forward, sampling or verification, the read-back of token ids
    update     token appends, the drafter's rollback, the controller's bookkeeping
    outputs    stop checks, detokenization, logprobs, RequestOutputs
    core_io    (engine core process only) receiving requests and sending each step's outputs

A step is a prefill step when any request in it brings more tokens than its last token and its
drafts (a prompt or a chunk of one), else a decode step. first_token_s sums, over requests, the
time from the engine receiving a request to its first token (the engine's share of TTFT)."""
import time
from dataclasses import dataclass, field

PHASES = ("schedule", "propose", "execute", "update", "outputs", "core_io")


@dataclass
class StepTimer:
    phase_s: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: dict = field(default_factory=lambda: {"prefill": 0, "decode": 0})
    step_s: dict = field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})
    first_token_s: float = 0.0
    num_first_tokens: int = 0
    _start: float = 0.0
    _last: float = 0.0

    def begin(self) -> None:
        self._start = self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """The time since the last mark (or begin) was spent in phase."""
        now = time.perf_counter()
        self.phase_s[phase] += now - self._last
        self._last = now

    def end(self, kind: str) -> None:
        """The step begun last was of kind ('prefill' or 'decode')."""
        self.steps[kind] += 1
        self.step_s[kind] += time.perf_counter() - self._start

    def add(self, phase: str, seconds: float) -> None:
        self.phase_s[phase] += seconds

    def first_token(self, seconds: float) -> None:
        self.first_token_s += seconds
        self.num_first_tokens += 1

    def as_dict(self) -> dict:
        return {"phase_s": dict(self.phase_s), "steps": dict(self.steps),
                "step_s": dict(self.step_s), "first_token_s": self.first_token_s,
                "num_first_tokens": self.num_first_tokens}


def per_step_ms(before: dict, after: dict) -> dict:
    """What happened between two as_dict() snapshots, per step: ms per phase (over all steps),
    ms per prefill and per decode step, and the engine's mean share of TTFT."""
    steps = {k: after["steps"][k] - before["steps"].get(k, 0) for k in after["steps"]}
    n = max(sum(steps.values()), 1)
    out = {f"{p}_ms": 1e3 * (after["phase_s"][p] - before["phase_s"].get(p, 0.0)) / n
           for p in after["phase_s"]}
    for kind, count in steps.items():
        out[f"{kind}_steps"] = count
        out[f"{kind}_step_ms"] = (1e3 * (after["step_s"][kind] - before["step_s"].get(kind, 0.0))
                                  / count if count else None)
    firsts = after["num_first_tokens"] - before.get("num_first_tokens", 0)
    out["engine_ttft_ms"] = (1e3 * (after["first_token_s"] - before.get("first_token_s", 0.0))
                             / firsts if firsts else None)
    return out


def phases_line(steps: dict) -> str:
    """per_step_ms's figures in one line: 'schedule 0.02 propose 0.00 ...; prefill 15.6, decode
    5.5' (core_io left out: offline engines have none)."""
    phases = " ".join(f"{p} {steps[f'{p}_ms']:.2f}" for p in PHASES if p != "core_io")
    return (f"{phases}; prefill {steps['prefill_step_ms'] or 0.0:.2f}, decode "
            f"{steps['decode_step_ms'] or 0.0:.2f}")
