"""The realized-goodput guard: speculation is vetoed where steps that speculated emitted fewer
tokens per second (end to end) than plain steps, plain decoding is measured where it is not yet,
a veto lapses and doubles when renewed, and lapses when none of its requests remains; in a
simulated engine whose speculative steps carry a cost the model does not see, the controller ends
near plain decoding, where they carry none it keeps speculating, and a request the draft cannot
follow costs the next ones nothing; in the real engine the guard changes no output and each
step's time reaches only the controller that decided it."""
import random
import time

from tests.spec_decode.test_goodput import gpu_like
from tests.spec_decode.test_greedy_equality import PROMPTS, generate
from vllm import LLM
from vllm.spec_decode import realized
from vllm.spec_decode.goodput import GoodputController
from vllm.spec_decode.realized import MIN_SAMPLES, VETO_STEPS, RealizedGoodput


def ids(n: int, tag: str = "r") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def fill(guard: RealizedGoodput, num_requests: int, speculated: bool, tokens_per_s: float,
         n: int = MIN_SAMPLES) -> None:
    for _ in range(n):
        guard.record(num_requests, speculated, tokens_per_s * 0.01, 0.01)


def test_rates_need_min_samples_and_ignore_idle_gaps():
    guard = RealizedGoodput()
    fill(guard, 8, True, 1000, n=MIN_SAMPLES - 1)
    assert guard.rate(8, True) is None
    guard.record(8, True, 10, realized.MAX_STEP_S + 1)  # the engine idled: not a sample
    assert guard.rate(8, True) is None
    guard.record(8, True, 10, 0.01)
    assert guard.rate(8, True) == 1000
    assert guard.rate(11, True) == 1000 and guard.rate(5, True) is None  # octaves: 8 vs 5


def test_a_rate_is_of_the_newest_window_of_steps():
    """An arm's rate counts its newest WINDOW steps only (sums kept as steps come and go)."""
    guard = RealizedGoodput()
    rng = random.Random(3)
    steps = [(rng.randint(1, 9), rng.uniform(0.001, 0.02)) for _ in range(3 * realized.WINDOW + 5)]
    for i, (tokens, seconds) in enumerate(steps, start=1):
        guard.record(4, True, tokens, seconds)
        newest = steps[max(0, i - realized.WINDOW):i]
        expected = sum(t for t, _ in newest) / sum(s for _, s in newest)
        got = guard.rate(4, True)
        assert (got is None) == (i < MIN_SAMPLES)
        if got is not None:
            assert abs(got - expected) <= 1e-9 * expected


def test_plain_decoding_is_measured_where_speculation_was():
    guard = RealizedGoodput()
    assert guard.allows(ids(4))  # nothing measured: the model's choice stands
    fill(guard, 4, True, 1000)
    assert not guard.allows(ids(4)) and guard.num_measuring == 1  # now plain, to compare
    fill(guard, 4, False, 500)
    assert guard.allows(ids(4)) and guard.num_vetoed == 0  # speculation pays here


def test_speculation_far_above_the_plain_model_needs_no_plain_measurement():
    guard = RealizedGoodput()
    fill(guard, 1, True, 450)
    assert guard.allows(ids(1), plain_model=206.0) and guard.num_measuring == 0  # 2.2x the model
    assert not guard.allows(ids(1), plain_model=440.0) and guard.num_measuring == 1


def test_a_veto_lapses_then_speculation_is_measured_again_and_a_renewal_doubles():
    guard = RealizedGoodput()
    fill(guard, 64, True, 700)
    fill(guard, 64, False, 1000)
    assert guard.allows(ids(1))  # another octave is untouched
    vetoed = 0
    while not guard.allows(ids(64)):
        vetoed += 1
    assert vetoed == VETO_STEPS  # the veto's length, then speculation is measured afresh
    assert guard.rate(64, True) is None
    fill(guard, 64, True, 700)
    vetoed = 0
    while not guard.allows(ids(64)):
        vetoed += 1
    assert vetoed == 2 * VETO_STEPS
    fill(guard, 64, True, 1200)  # now speculation pays: allowed, and the next veto is short
    assert guard.allows(ids(64))
    fill(guard, 64, True, 700, n=realized.WINDOW)
    vetoed = 0
    while not guard.allows(ids(64)):
        vetoed += 1
    assert vetoed == VETO_STEPS


def test_the_next_request_is_measured_afresh_and_lifts_a_veto():
    """Batch 1: a request the draft cannot follow is vetoed; the next one (none of the last
    check's requests remains) is speculated and measured anew, while plain decoding's rate
    stands; a veto over many requests is not lifted by a partial turnover."""
    guard = RealizedGoodput()
    fill(guard, 1, True, 150)
    fill(guard, 1, False, 190)
    assert not guard.allows(["bad"]) and guard.vetoed[0] == VETO_STEPS - 1
    assert not guard.allows(["bad"])
    assert guard.allows(["next"]) and guard.rate(1, True) is None
    assert guard.rate(1, False) == 190
    fill(guard, 64, True, 700)
    fill(guard, 64, False, 1000)
    assert not guard.allows(ids(64))
    assert not guard.allows(ids(32) + ids(32, "new"))  # half the requests are new: still vetoed


def run(ctrl: GoodputController, alpha: float, hidden_s: float, batch: int = 16,
        steps: int = 1500, seed: int = 0) -> tuple[float, list[int]]:
    """Decode steps as the engine runs them, the engine's realized timing included: each step
    that speculates also costs hidden_s, which the model's costs do not show (as a prompt's
    prefill beside the verification, or the outputs of more tokens, do not). Returns tokens per
    second and the k of each step."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(batch)]
    tokens, seconds, ks = 0, 0.0, []
    for _ in range(steps):
        d = ctrl.decide(ids, seeded=False)
        k = d.k
        draft_s = k * 2e-4
        step_s = draft_s + gpu_like(batch * (k + 1))
        emitted = 0
        for r in ids:
            n = next((j for j in range(k) if rng.random() >= alpha), k)
            ctrl.record_verdict(r, k, n)
            emitted += n + 1
        ctrl.record_step(d, batch, batch * (k + 1), draft_s, step_s, k > 0)
        wall = step_s + (hidden_s if k > 0 else 0.0)
        if ctrl.arm is not None:
            ctrl.realized.record(ctrl.arm[0], k > 0, emitted, wall)
        tokens += emitted
        seconds += wall
        ks.append(k)
    return tokens / seconds, ks


def test_a_cost_the_model_does_not_see_turns_speculation_off():
    """At acceptance 0.5 the model sees ~1.9 tokens per step for little more time; a hidden 8 ms
    per speculative step (on a 5 ms plain step) makes every speculative step a loss."""
    ctrl = GoodputController(max_k=4)
    rate, ks = run(ctrl, 0.5, hidden_s=8e-3)
    plain = 16 / gpu_like(16)
    assert rate > 0.9 * plain
    assert sum(k > 0 for k in ks[500:]) < 0.15 * 1000
    assert ctrl.realized.num_vetoed > 0
    unguarded = GoodputController(max_k=4)
    unguarded.realized.allows = lambda req_ids, plain_model=None: True
    assert run(unguarded, 0.5, hidden_s=8e-3)[0] < 0.8 * plain  # what the guard prevents


def test_speculation_that_pays_end_to_end_is_kept():
    ctrl = GoodputController(max_k=4)
    rate, ks = run(ctrl, 0.8, hidden_s=5e-4)
    unguarded = GoodputController(max_k=4)
    unguarded.realized.allows = lambda req_ids, plain_model=None: True
    assert rate > 0.97 * run(unguarded, 0.8, hidden_s=5e-4)[0]
    assert sum(k > 0 for k in ks[100:]) > 0.97 * 1400
    assert ctrl.realized.num_vetoed == 0


def test_the_engine_records_each_step_and_vetoes_change_no_output(spec_target, monkeypatch):
    """Every other guard check vetoes; the engine's steps reach the guard with their decoding
    requests, whether they drafted, the tokens they emitted and their time; outputs equal
    plain decoding's."""
    reference = generate(LLM(spec_target, dtype="float32", device="cpu"), PROMPTS[:3])
    checks, records = [], []
    monkeypatch.setattr(RealizedGoodput, "allows",
                        lambda self, req_ids, plain_model=None: (checks.append(len(req_ids))
                                                                 or len(checks) % 2 == 1))
    original = RealizedGoodput.record
    monkeypatch.setattr(RealizedGoodput, "record", lambda self, *a: (
        records.append(a), original(self, *a))[1])
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=spec_target,
              num_speculative_tokens=3, cpu_draft_worker=True,
              speculative_draft_dtype="float32")
    ctrl = llm.llm_engine.spec.controller
    ctrl.probe_fraction = 0.0
    assert generate(llm, PROMPTS[:3]) == reference
    assert len(checks) >= 4  # the model chose speculation, and the guard was asked
    assert any(spec for _, spec, _, _ in records) and any(not spec for _, spec, _, _ in records)
    assert all(1 <= n <= 3 and tokens >= 1 and seconds > 0 for n, _, tokens, seconds in records)
    assert sum(tokens for _, spec, tokens, _ in records if spec) > sum(
        1 for _, spec, _, _ in records if spec)  # speculative steps emitted several tokens


def test_a_step_is_credited_only_to_the_controller_that_decided_it(spec_target):
    """A benchmark swaps the controller between runs (or drops it): the last step of one run
    reaches neither the next run's controller nor a missing one."""
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=spec_target,
              num_speculative_tokens=2, cpu_draft_worker=True, speculative_draft_dtype="float32")
    spec = llm.llm_engine.spec
    first = spec.controller
    generate(llm, PROMPTS[:1])
    assert sum(len(arm) for arm in first.realized.arms.values()) > 0
    spec.controller = None
    reference = generate(LLM(spec_target, dtype="float32", device="cpu"), PROMPTS[:1])
    assert generate(llm, PROMPTS[:1]) == reference  # failed: the pending step had no controller
    spec.controller = second = spec.make_controller(2)
    generate(llm, PROMPTS[:1])
    assert sum(len(arm) for arm in second.realized.arms.values()) > 0
    assert spec._realized_step[0] is second  # its run's last step, closed by the next step
    spec.controller = first
    records = []
    first.realized.record = second.realized.record = lambda *a: records.append(a)
    time.sleep(0.4)  # second's last step would span this pause
    generate(llm, PROMPTS[:1])
    assert records and all(seconds < 0.3 for *_, seconds in records)


def run_requests(ctrl: GoodputController, alphas: list[float], steps_each: int = 40,
                 seed: int = 0) -> float:
    """Batch 1, one request after another, request i's drafts accepted with probability
    alphas[i]; every step's time reaches the guard as the engine's would. Tokens per second."""
    rng = random.Random(seed)
    tokens, seconds = 0, 0.0
    for i, alpha in enumerate(alphas):
        req = f"q{i}"
        for _ in range(steps_each):
            d = ctrl.decide([req], seeded=False)
            k = d.k
            draft_s = k * 4e-4
            step_s = draft_s + gpu_like(k + 1)
            n = next((j for j in range(k) if rng.random() >= alpha), k)
            ctrl.record_verdict(req, k, n)
            ctrl.record_step(d, 1, k + 1, draft_s, step_s, k > 0)
            if ctrl.arm is not None:
                ctrl.realized.record(1, k > 0, n + 1, step_s)
            tokens += n + 1
            seconds += step_s
        ctrl.free(req)
    return tokens / seconds


def test_a_request_the_draft_cannot_follow_does_not_cost_the_next_ones():
    """Alternating requests the draft follows (0.85) and cannot (0.05), at batch 1: the guard
    costs nothing against the model alone (before the next request lifted a veto, a bad
    request's veto ran on into the good one after it)."""
    alphas = [0.85, 0.05] * 6
    guarded = run_requests(GoodputController(max_k=8), alphas)
    unguarded = GoodputController(max_k=8)
    unguarded.realized.allows = lambda req_ids, plain_model=None: True
    assert guarded > 0.98 * run_requests(unguarded, alphas)
