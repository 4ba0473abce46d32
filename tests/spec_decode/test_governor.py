"""The adaptive switch-off: speculation that is measured slower than plain decoding is turned
off for a while (and probed again); speculation that pays stays on; outputs are unchanged."""
import time

from tests.spec_decode.test_greedy_equality import PROMPTS, generate
from vllm import LLM
from vllm.spec_decode.governor import SpecGovernor
from vllm.spec_decode.proposer import Proposal, ProposalHandle, Proposer


def run_steps(gov: SpecGovernor, plain_ms: float, spec_ms: float, tau: float, steps: int):
    decisions = []
    for _ in range(steps):
        on = gov.should_speculate()
        decisions.append(on)
        if on:
            gov.record_spec(spec_ms, round(tau))
        else:
            gov.record_plain(plain_ms, 1)
    return decisions


def test_speculation_that_pays_stays_on():
    gov = SpecGovernor(window=8)
    decisions = run_steps(gov, plain_ms=10.0, spec_ms=15.0, tau=3, steps=400)
    # only the first probe of plain decoding (nothing measured yet), then always on
    assert decisions.count(False) == gov.plain_probe and gov.num_switch_offs == 0
    assert abs(gov.speedup - 2.0) < 1e-9


def test_speculation_that_does_not_pay_is_switched_off_with_backoff():
    gov = SpecGovernor(window=8, backoff=16, max_backoff=64)
    decisions = run_steps(gov, plain_ms=10.0, spec_ms=30.0, tau=1, steps=400)
    assert gov.num_switch_offs >= 4
    assert decisions.count(True) < 0.25 * len(decisions)  # mostly plain
    assert gov.backoff == 64  # doubled up to the cap
    # probes keep happening: it can turn back on when drafts start paying
    assert True in decisions[-100:]


def test_backoff_resets_when_speculation_pays_again():
    gov = SpecGovernor(window=8, backoff=16)
    run_steps(gov, plain_ms=10.0, spec_ms=30.0, tau=1, steps=100)
    assert gov.backoff > 16
    run_steps(gov, plain_ms=10.0, spec_ms=12.0, tau=4, steps=200)
    assert gov.backoff == 16 and gov.speedup > 1


class SlowUselessProposer(Proposer):
    """Proposes token 1 every time and sleeps 10 ms a call: far slower than a step of the tiny
    target, whatever it gets accepted."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, requests, max_num_drafts):
        self.calls += 1
        time.sleep(0.01)
        return ProposalHandle(lambda: Proposal([[1] * k for k in max_num_drafts],
                                               [None] * len(requests)))


def test_engine_switches_a_useless_slow_proposer_off(spec_target):
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model="[ngram]",
              num_speculative_tokens=3)
    reference = generate(LLM(spec_target, dtype="float32", device="cpu"), PROMPTS[:2])
    engine = llm.llm_engine
    engine.proposer = proposer = SlowUselessProposer()
    engine.governor = SpecGovernor(window=4, backoff=8)
    assert generate(llm, PROMPTS[:2]) == reference  # lossless whatever the governor does
    assert engine.governor.num_switch_offs >= 1
    assert proposer.calls < 0.6 * 40  # 40 tokens: without the governor every step proposes


def test_governor_is_on_by_default_and_can_be_turned_off(spec_target):
    kw = dict(dtype="float32", device="cpu", speculative_model="[ngram]",
              num_speculative_tokens=2)
    assert LLM(spec_target, **kw).llm_engine.governor is not None
    assert LLM(spec_target, speculative_adaptive="off", **kw).llm_engine.governor is None
