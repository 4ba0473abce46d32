"""The goodput controller's choices on injected costs and acceptance: k = 0 when drafting cannot
pay (and then its probes cost about probe_fraction), larger k as acceptance rises, the
configured k for seeded requests; in a simulated engine it gets close to the best fixed k; in
the real engine a useless slow proposer is left alone and outputs are unchanged."""
import random
import time

import pytest

from tests.spec_decode.test_greedy_equality import PROMPTS, generate
from vllm import LLM, SamplingParams
from vllm.spec_decode import goodput
from vllm.spec_decode.goodput import CostCurve, Decision, GoodputController
from vllm.spec_decode.proposer import Proposal, ProposalHandle, Proposer


def simulate(ctrl: GoodputController, alpha: float, verify, draft, batch: int = 1,
             steps: int = 400, fixed_k=None, seed: int = 0,
             fed: bool = False) -> tuple[float, list[int]]:
    """Runs steps decode steps of batch requests whose drafts are each accepted with
    probability alpha; verify(tokens) and draft(batch) are the true seconds. Returns tokens per
    second and the k of each step (fixed_k: that k every step, no controller). fed: the drafter
    catches up during plain steps (a draft process), so every proposal measures the draft;
    else only one following a speculative step does."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(batch)]
    tokens, seconds, ks, prev_k = 0, 0.0, [], 0
    for _ in range(steps):
        decision = ctrl.decide(ids, seeded=False)
        if fixed_k is not None:
            decision.k = fixed_k
        k = decision.k
        draft_s = k * draft(batch) if k else 0.0
        step_s = draft_s + verify(batch * (k + 1))
        for r in ids:
            n = next((j for j in range(k) if rng.random() >= alpha), k)
            ctrl.record_verdict(r, k, n)
            tokens += n + 1
        ctrl.record_step(decision, batch, batch * (k + 1), draft_s, step_s,
                         k > 0 and (prev_k > 0 or fed))
        seconds += step_s
        ks.append(k)
        prev_k = k
    return tokens / seconds, ks


def gpu_like(n: int) -> float:  # memory-bound target: flat up to 64 tokens, then linear
    return 5e-3 * max(1.0, n / 64)


def record_twice(curve: CostCurve, size: float, seconds: float) -> None:
    curve.record(size, seconds)
    curve.record(size, seconds)


def test_cost_curve_interpolates_and_never_decreases():
    curve = CostCurve(window=5)
    assert curve.estimate(4) is None
    record_twice(curve, 1, 1.0)
    assert curve.estimate(100) == 1.0  # one point: flat
    assert curve.estimate(0.5) == 1.0
    record_twice(curve, 8, 2.0)
    assert curve.estimate(4.5) == pytest.approx(1.5)
    assert curve.estimate(16) == pytest.approx(2.0 + 8 / 7)  # the last slope, extrapolated
    record_twice(curve, 16, 0.5)  # a noisy low point does not make more tokens cheaper
    assert curve.estimate(16) == 2.0
    assert curve.estimate(12) == 2.0
    for seconds in (4.0, 4.0, 3.0):  # the lower quartile of a bucket's measurements
        curve.record(8, seconds)  # 2 2 4 4 3: the second lowest
    assert curve.estimate(8) == pytest.approx(2.0)
    curve.record(8, 5.0)  # 2 4 4 3 5 (window 5)
    assert curve.estimate(8) == pytest.approx(3.0)


def test_a_bucket_counts_from_its_second_measurement():
    """A first measurement may have paid a warm-up: alone it changes no estimate (its size
    reads from the other buckets), and with a second one the lower of the two counts."""
    curve = CostCurve(window=7)
    curve.record(1, 0.105)  # the drafter's first proposal on the H200: 105 ms, then ~7 ms
    assert curve.estimate(1) is None and not curve.measured(1)
    curve.record(1, 7e-3)
    assert curve.estimate(1) == pytest.approx(7e-3) and curve.measured(1)
    curve.record(16, 0.2)  # a new bucket's first: the others' figure, extrapolated flat
    assert curve.estimate(16) == pytest.approx(7e-3)
    curve.record(16, 9e-3)
    assert curve.estimate(16) == pytest.approx(9e-3)


def test_a_first_measurement_may_only_lower_its_own_bucket():
    """A new bucket's first measurement, lower than the curve reads its sizes, is their
    estimate until a second one makes the bucket count (then the lower quartile as ever); a
    higher one (a warm-up) moves nothing, and no other bucket's sizes move either."""
    curve = CostCurve(window=7)
    record_twice(curve, 4, 0.10)
    record_twice(curve, 8, 0.20)
    assert curve.estimate(12) == pytest.approx(0.30)  # the slope of 4 and 8, extrapolated
    curve.record(12, 0.21)  # 12 tokens cost about what 8 do (a pass of the CPU's tiles)
    assert curve.estimate(12) == pytest.approx(0.21) and not curve.measured(12)
    assert curve.estimate(16) == pytest.approx(0.40) and curve.estimate(6) == pytest.approx(0.15)
    curve.record(12, 0.25)
    assert curve.estimate(12) == pytest.approx(0.21) and curve.measured(12)
    curve.record(24, 5.0)  # a warm-up: the curve's figure stands
    assert curve.estimate(24) == pytest.approx(0.21 + 12 * 0.01 / 4)  # 12 and 8's slope


def test_a_stall_or_a_warm_up_moves_a_bucket_not_at_all_and_a_lasting_change_comes_through():
    """On the H200 a graph capture in the middle of serving (~36 ms against a 6 ms step), and a
    first draft proposal that paid the drafter's warm-up (12 ms against 0.7), each kept the
    controller at plain decoding: a bucket's estimate is a low quantile of its last
    measurements (a lasting rise comes through after three quarters of the window)."""
    curve = CostCurve(window=7)
    curve.record(4, 12e-3)  # the first measurement paid a warm-up
    curve.record(4, 0.7e-3)
    assert curve.estimate(4) == pytest.approx(0.7e-3)  # outvoted at once
    for _ in range(5):
        curve.record(4, 0.7e-3)
    curve.record(4, 0.1)  # one stall
    assert curve.estimate(4) == pytest.approx(0.7e-3)
    for _ in range(4):  # the step really became 4x slower
        curve.record(4, 2.8e-3)
    assert curve.estimate(4) == pytest.approx(0.7e-3)  # 0.7 0.7 100 2.8 x 4: not yet
    curve.record(4, 2.8e-3)
    assert curve.estimate(4) == pytest.approx(2.8e-3)


def test_an_early_slow_proposal_does_not_keep_the_controller_plain():
    """The trap the H200 showed: the first proposals cost 15x the draft's real forward (its
    catch-up on the prompt, its thread pool waking). A drafter that catches up during plain
    steps makes every probe measure the draft, and the controller comes back to drafting."""
    calls = {"n": 0}

    def draft(batch):  # the first three proposals pay a warm-up
        calls["n"] += 1
        return 10e-3 if calls["n"] <= 3 else 0.7e-3
    ctrl = GoodputController(max_k=4)
    _, ks = simulate(ctrl, 0.75, gpu_like, draft, steps=400, fed=True, seed=3)
    assert sum(k >= 2 for k in ks[200:]) > 0.9 * 200
    assert ctrl.t_draft.estimate(1) == pytest.approx(0.7e-3)


def test_a_first_proposal_that_paid_a_warm_up_costs_one_more_proposal_not_a_run_of_plain():
    """The H200's trap (trained 7B pair, the controller's first row): the drafter's first
    proposal cost 115 ms against ~7 ms after it, t_first read 105 ms, and the probes, priced by
    it, came once in ~3 s: 683 plain steps of 718. Now the next step drafts again."""
    calls = {"n": 0}

    def draft(batch):
        calls["n"] += 1
        return 0.1 if calls["n"] == 1 else 0.7e-3
    ctrl = GoodputController(max_k=8)
    _, ks = simulate(ctrl, 0.85, gpu_like, draft, steps=200, fed=True)
    # two plain steps measure the target, then drafting is tried, twice unmeasured
    assert ks[:4] == [0, 0, 8, 8]
    assert sum(k == 0 for k in ks) == 2
    assert ctrl.t_draft.estimate(1) == pytest.approx(0.7e-3)


def test_the_step_costs_of_every_k_follow_the_model():
    """t(k, B) = t_first(B) + (k - 1) t_draft(B) + max(t_verify(B), t_verify(B (k + 1))), read
    from the learnt curves (t_verify(B) alone for k = 0)."""
    ctrl = GoodputController(max_k=6)
    assert ctrl.step_seconds_by_k(1) is None  # no plain step measured yet
    simulate(ctrl, 0.7, gpu_like, lambda b: 0.7e-3 * (1 + b / 8), batch=4, steps=60)
    ctrl.t_first.record(4, 1.5e-3)
    ctrl.t_first.record(4, 1.5e-3)
    for batch in (1, 3, 4, 9, 40):
        plain, verify = ctrl.t_verify.estimate(batch), ctrl.t_verify.estimate
        first, draft = ctrl.t_first.estimate(batch), ctrl.t_draft.estimate(batch)
        assert first is not None and draft is not None
        assert ctrl.step_seconds_by_k(batch) == pytest.approx(
            [plain] + [first + (k - 1) * draft + max(plain, verify(batch * (k + 1)))
                       for k in range(1, 7)])


def test_a_probe_is_priced_by_the_tokens_the_draft_must_catch_up_on():
    """Once a probe measured its cost per caught-up token (beyond the model's probe), a probe
    that would make the draft catch up on a long history waits, and one over new requests
    (their prompts only) goes; a long history prices a probe by its tokens, not as a multiple
    of the first probe's whole cost."""
    ctrl = GoodputController(max_k=4)
    ids = [f"r{i}" for i in range(8)]
    for _ in range(20):  # plain steps, then a probe over 8 x 100 tokens costing 80 ms
        d = ctrl.decide(ids, seeded=False, catch_up_tokens=800)
        ctrl.record_step(d, 8, 8 * (d.k + 1), 0.0, 6e-3, False)
    for r in ids:
        ctrl.record_verdict(r, 1, 0)
    ctrl.record_draft(8, 1, 2e-3)
    ctrl.record_draft(8, 1, 2e-3)
    ctrl.decide(ids, seeded=False, catch_up_tokens=800)
    ctrl.record_step(Decision(1, probe=True), 8, 16, 0.08, 0.086, False)
    # 2 ms of it the model's probe (one 2 ms draft forward for the 8), 78 ms the 800 tokens
    assert ctrl.probe_cost_per_token == pytest.approx(0.078 / 800)
    ctrl.catch_up_tokens = 8000
    assert ctrl._probe_cost(8) == pytest.approx(0.002 + 0.78)
    ctrl.probe_credit = 0.04  # half the cost of catching up on 800 tokens again
    assert ctrl.decide(ids, seeded=False, catch_up_tokens=800).k == 0
    assert ctrl.decide(ids, seeded=False, catch_up_tokens=200).probe  # 21.5 ms: paid


def test_a_request_gone_plain_is_probed_again_however_long_its_history():
    """A request whose drafts were rejected goes plain and the drafter is no longer fed, so each
    plain step adds a token a probe must catch up on; its credit grows by the same steps. The
    first probe (2 tokens to catch up on, 1.4 ms beyond a plain step, the model's 1.3 ms of it)
    must not price every later one by its whole cost per token (0.7 ms a token against 0.15 ms
    of credit a step: never again); measured on the H200, 116 plain steps to the request's end.
    A probe's catch-up is one forward, 2.1 ms for 117 tokens against 0.7 ms for one."""
    ctrl = GoodputController(max_k=4)
    record_twice(ctrl.t_verify, 1, 5e-3)
    record_twice(ctrl.t_verify, 2, 5e-3)
    record_twice(ctrl.t_draft, 1, 0.8e-3)
    record_twice(ctrl.t_first, 1, 1.3e-3)
    for _ in range(20):
        ctrl.record_verdict("r0", 4, 0)
    assert ctrl.decide(["r0"], seeded=False, catch_up_tokens=2).k == 0
    ctrl.catch_up_tokens = 2
    ctrl.record_step(Decision(1, probe=True), 1, 2, 1.4e-3, 6.4e-3, True)
    probes_at = []
    for step in range(1, 200):
        d = ctrl.decide(["r0"], seeded=False, catch_up_tokens=step)
        if d.probe:
            probes_at.append(step)
            break
        ctrl.record_step(d, 1, 1, 0.0, 5e-3, False)
    assert probes_at and probes_at[0] < 60


def cpu_like(n: int) -> float:  # compute-bound target: every token costs the same
    return 10e-3 * n


def test_a_cpu_target_climbs_k_one_at_a_time():
    """Exploring upward (a CPU target), a step's k is at most one past the k of the largest
    verification size measured, so the first speculative steps draft 1 each where the configured K (the
    verification priced flat before it is measured) drafted 4 and paid 5 plain steps' time for
    it, twice; once the curve measures the growth, both go plain."""
    draft = lambda b: 2e-3 * b  # noqa: E731
    upward = GoodputController(max_k=4, explore_upward=True)
    rate_up, ks_up = simulate(upward, 0.95, cpu_like, draft, batch=4, steps=30)
    rate_k, ks_k = simulate(GoodputController(max_k=4), 0.95, cpu_like, draft, batch=4, steps=30)
    assert ks_k[:4] == [0, 0, 4, 4] and ks_up[:4] == [0, 0, 1, 1]  # each size measured twice
    assert set(ks_up[4:]) == set(ks_k[4:]) == {0}
    plain = 4 / cpu_like(4)  # tokens per second of plain steps: 30 steps within 2% of it
    assert rate_up > 0.98 * plain and rate_k < 0.94 * plain
    # where the verification is flat (a GPU's) the climb reaches K, a k every two steps
    flat = GoodputController(max_k=4, explore_upward=True)
    _, ks = simulate(flat, 0.95, gpu_like, lambda b: 1e-3, batch=4, steps=60)
    first = next(i for i, k in enumerate(ks) if k > 0)
    assert ks[first:first + 7] == [1, 1, 2, 2, 3, 3, 4] and ks[-20:].count(4) >= 18
    # the reach: one past the k of the largest size whose bucket counts, at least 1, at most K
    assert flat.reach(4) == 4 and upward.reach(4) == 2  # 8 tokens measured: k = 2 next
    assert GoodputController(max_k=4, explore_upward=True).reach(8) == 1
    assert GoodputController(max_k=4).reach(8) == 4


def passes_like(n: int) -> float:
    """A CPU target on register tiles: the weights are read once a pass of up to 6 rows, so 12
    tokens cost what 8 do (4 x 3 rows: 2 passes), 16 a pass more (3 x 6)."""
    return {4: 0.100, 8: 0.130, 12: 0.130, 16: 0.190, 20: 0.220}[n]


def test_a_cpu_target_measures_every_k_on_its_climb():
    """Where the verification's cost steps (passes_like), an unmeasured k read between two
    measured ones is mispriced: climbing by octaves (1, then 3 priced from 4 and 8 tokens, then
    4) priced k = 2 half way between 8 and 16 tokens and settled on k = 4 (69.9 tokens/s of
    the model against k = 2's 76.3). Climbing one k at a time measures k = 2 and keeps it."""
    ctrl = GoodputController(max_k=4, explore_upward=True)
    rate, ks = simulate(ctrl, 0.95, passes_like, lambda b: 10e-3, batch=4, steps=60)
    first = next(i for i, k in enumerate(ks) if k > 0)
    assert ks[first:first + 6] == [1, 1, 2, 2, 3, 3]
    assert ks[-30:].count(2) >= 28
    best = simulate(GoodputController(max_k=4), 0.95, passes_like, lambda b: 10e-3, batch=4,
                    steps=60, fixed_k=2)[0]
    assert rate > 0.95 * best  # (by octaves: 69.9 against 76.3, 0.92x)


def test_resuming_after_plain_steps_prices_the_catch_up_over_the_tokens_left():
    """A drafter that was not fed during plain steps (in the engine's process) catches up on
    every token since at the next speculative step: that cost, spread over the steps the
    requests have left, is weighed before resuming. Near the end it keeps plain decoding; with
    many tokens left, or the tokens left unknown, or nothing to catch up on, k = 2 as before."""
    def controller() -> GoodputController:
        ctrl = GoodputController(max_k=2)
        record_twice(ctrl.t_verify, 4, 0.14)
        record_twice(ctrl.t_verify, 8, 0.20)
        record_twice(ctrl.t_verify, 12, 0.25)
        record_twice(ctrl.t_draft, 4, 0.03)
        record_twice(ctrl.t_first, 4, 0.04)
        ctrl.probe_cost_per_token = 0.015  # a catch-up's seconds per token beyond the model's
        for r in ids:
            for _ in range(20):
                ctrl.record_verdict(r, 2, 2)
        return ctrl

    ids = [f"r{i}" for i in range(4)]

    def left(n):  # the engine's tokens_left: asked only where there is a catch-up to price
        def ask():
            asked.append(n)
            return n
        return ask

    asked = []
    # 37 plain steps behind: 148 tokens, ~2.1 s of catch-up beyond the usual 8
    assert controller().decide(ids, seeded=False, catch_up_tokens=148,
                               tokens_left=left(16)).k == 0
    assert controller().decide(ids, seeded=False, catch_up_tokens=148,
                               tokens_left=left(400)).k == 2
    assert controller().decide(ids, seeded=False, catch_up_tokens=148).k == 2
    assert controller().decide(ids, seeded=False, catch_up_tokens=8, tokens_left=left(2)).k == 2
    assert asked == [16, 400]  # not where nothing beyond the usual is to be caught up on
    ctrl = controller()
    seconds = ctrl.step_seconds_by_k(4)
    tokens = ctrl.run_odds(ids).tokens
    # k = 2 at 16 tokens left: 140 tokens' catch-up over the 16 / (tokens[2] / 4) steps left
    share = 0.015 * 140 * tokens[2] / 4 / 16
    ctrl.decide(ids, seeded=False, catch_up_tokens=148, tokens_left=left(16))
    assert ctrl.best_spec_ratio == pytest.approx(
        max(tokens[1] / (seconds[1] + 0.015 * 140 * tokens[1] / 4 / 16),
            tokens[2] / (seconds[2] + share)) / (tokens[0] / seconds[0]))


def test_a_speculative_step_that_caught_up_prices_the_first_probe():
    """A speculative step whose drafter first caught up on the prompts (or after plain steps)
    measures a catch-up's cost per token before any probe has: the first probe is then priced
    by the tokens it would catch up on instead of at the model's one draft forward."""
    ctrl = GoodputController(max_k=4)
    ids = [f"r{i}" for i in range(4)]
    for _ in range(2):  # plain steps measured
        ctrl.record_step(ctrl.decide(ids, seeded=False), 4, 4, 0.0, 0.15, False)
    d = ctrl.decide(ids, seeded=False, catch_up_tokens=40)
    assert d.k > 0 and ctrl.probe_cost_per_token is None
    # 0.5 s of proposal for 40 tokens caught up (the draft forward unmeasured: taken as free)
    ctrl.record_step(d, 4, 4 * (d.k + 1), 0.5, 1.3, False)
    assert ctrl.probe_cost_per_token == pytest.approx(0.5 / 40)
    ctrl.catch_up_tokens = 160
    assert ctrl._probe_cost(4) >= 160 * 0.5 / 40
    # a step caught up (drafter measured) or one that caught up on a token or two prices none
    other = GoodputController(max_k=4)
    for _ in range(2):
        other.record_step(other.decide(ids, seeded=False), 4, 4, 0.0, 0.15, False)
    d = other.decide(ids, seeded=False, catch_up_tokens=4)
    other.record_step(d, 4, 4 * (d.k + 1), 0.5, 1.3, False)
    assert other.probe_cost_per_token is None


def fed_share(ctrl: GoodputController, draft_cost: float) -> tuple[float, int]:
    """Runs a controller learning a never-accepted draft 300 steps, then 600 more; returns the
    share of those plain steps in which it asked for the drafter to be fed, and their number."""
    simulate(ctrl, 0.0, gpu_like, lambda b: draft_cost, steps=300, fed=True)
    ids, fed, plain = ["r0"], 0, 0
    for _ in range(600):
        d = ctrl.decide(ids, seeded=False)
        if d.k == 0:
            plain += 1
            fed += ctrl.feeding_pays()
        else:
            ctrl.record_verdict("r0", d.k, 0)
        ctrl.record_step(d, 1, d.k + 1, d.k * draft_cost, d.k * draft_cost + gpu_like(d.k + 1),
                         d.k > 0)
    return fed / max(plain, 1), plain


def test_the_drafter_is_fed_in_plain_steps_only_while_speculation_is_near():
    """A useless dear draft: plain steps, the drafter fed only on the way to a probe (at
    most the second half of the credit each probe needs); before anything is modelled, and
    when drafting would nearly pay (a draft that costs a plain step, always accepted at k
    forced plain by its cost), it is fed every plain step."""
    assert GoodputController(max_k=4).feeding_pays()  # nothing modelled yet
    share, plain = fed_share(GoodputController(max_k=4), 8e-3)
    assert plain > 500 and 0.0 < share <= 0.55
    near = GoodputController(max_k=1)
    record_twice(near.t_verify, 1, 5e-3)
    record_twice(near.t_verify, 2, 5e-3)
    record_twice(near.t_draft, 1, 5.3e-3)  # k = 1 emits 2 tokens in 10.3 ms: 0.97x plain
    near.engine_acceptance.record(1, 1, 1.0)
    near.engine_acceptance.accepted = 1e6
    decision = near.decide(["r0"], seeded=False)
    assert decision.k == 0 and near.best_spec_ratio == pytest.approx(2 * 5 / 10.3, rel=1e-3)
    assert near.feeding_pays()


def test_a_run_of_plain_steps_remakes_the_full_choice_only_now_and_then(monkeypatch):
    """Over the same requests with nothing new learnt, the full choice is remade every
    PLAIN_RECHECK_STEPS plain steps (the steps between only weigh a probe); a verdict or a new
    request remakes it at once, and the choices are those of a controller without the shortcut."""
    ctrl = GoodputController(max_k=4)
    simulate(ctrl, 0.0, gpu_like, lambda b: 8e-3, steps=300, fed=True)
    calls = []
    choose = ctrl._choose
    monkeypatch.setattr(ctrl, "_choose", lambda *args: calls.append(1) or choose(*args))
    ids = ["r0"]
    ctrl.probe_credit = 0.0
    for _ in range(64):
        d = ctrl.decide(ids, seeded=False)
        assert d.k == 0
        ctrl.record_step(d, 1, 1, 0.0, gpu_like(1), False)
        ctrl.probe_credit = 0.0  # no probe in this run: only the shortcut is looked at
    assert len(calls) == 64 // goodput.PLAIN_RECHECK_STEPS
    ctrl.decide(ids + ["r1"], seeded=False)  # a new request
    assert len(calls) == 64 // goodput.PLAIN_RECHECK_STEPS + 1
    ctrl.record_verdict("r0", 1, 1)  # something learnt
    ctrl.decide(ids + ["r1"], seeded=False)
    assert len(calls) == 64 // goodput.PLAIN_RECHECK_STEPS + 2


def test_the_plain_run_shortcut_changes_no_choice(monkeypatch):
    """Two controllers fed the same steps, one with the shortcut off (the full choice every
    step): the same k in every step."""
    _, fast = simulate(GoodputController(max_k=4), 0.05, gpu_like, lambda b: 8e-3, steps=600,
                       fed=True)
    monkeypatch.setattr(goodput, "PLAIN_RECHECK_STEPS", 1)
    _, full = simulate(GoodputController(max_k=4), 0.05, gpu_like, lambda b: 8e-3, steps=600,
                       fed=True)
    assert fast == full and fast.count(0) > 400


@pytest.mark.parametrize("draft_cost", [1e-3, 8e-3])
def test_never_accepted_drafts_go_plain_and_probes_stay_within_budget(draft_cost):
    ctrl = GoodputController(max_k=4)
    rate, ks = simulate(ctrl, 0.0, gpu_like, lambda b: draft_cost, steps=1000)
    # after learning: plain, but for probes, as many as 3% of the time pays for
    assert sum(k > 0 for k in ks[200:]) < (0.05 if draft_cost > 5e-3 else 0.2) * 800
    assert ctrl.num_probes > 0 and max(ks[200:]) == 1  # probes are single drafts
    plain = 1 / gpu_like(1)
    assert rate > 0.95 * plain  # a cheap and a dear draft both cost at most a few percent
    assert ctrl.acceptance() < 0.1


def test_k_grows_with_acceptance():
    chosen = []
    for alpha in (0.0, 0.3, 0.6, 0.8, 0.95):
        ctrl = GoodputController(max_k=8)
        _, ks = simulate(ctrl, alpha, gpu_like, lambda b: 1e-3, steps=300, seed=1)
        chosen.append(max(set(ks[100:]), key=ks[100:].count))  # the usual k once learnt
    assert chosen[0] == 0 and chosen[-1] == 8
    assert chosen == sorted(chosen) and chosen[2] > chosen[1] >= 1


def test_large_batches_on_a_compute_bound_target_go_plain():
    """At batch 64 the verification of k + 1 tokens per request costs k + 1 plain steps: no k
    pays even at high acceptance when each draft forward costs something."""
    ctrl = GoodputController(max_k=4)
    _, ks = simulate(ctrl, 0.7, gpu_like, lambda b: 1e-3 * b / 8, batch=64, steps=300)
    assert sum(k > 0 for k in ks[100:]) < 0.1 * 200
    ctrl = GoodputController(max_k=4)  # the same acceptance at batch 1 pays
    _, ks = simulate(ctrl, 0.7, gpu_like, lambda b: 1e-3 * b / 8, batch=1, steps=300)
    assert min(ks[100:]) >= 2


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_controller_is_near_the_best_fixed_k(alpha):
    draft = lambda b: 1.5e-3 * b  # noqa: E731 - the CPU draft: cost grows with the batch
    best_fixed = max(simulate(GoodputController(max_k=6), alpha, gpu_like, draft, batch=4,
                              steps=400, fixed_k=k, seed=2)[0] for k in range(7))
    rate, _ = simulate(GoodputController(max_k=6), alpha, gpu_like, draft, batch=4, steps=400,
                       seed=2)
    assert rate > 0.9 * best_fixed


def test_seeded_steps_use_the_configured_k_whatever_was_measured():
    ctrl = GoodputController(max_k=3)
    simulate(ctrl, 0.0, gpu_like, lambda b: 1e-2, steps=100)
    assert ctrl.decide(["a"], seeded=False).k in (0, 1)
    assert ctrl.decide(["a"], seeded=True).k == 3


def test_per_request_acceptance_has_the_engine_prior():
    """A request's runs start as the engine's and its own verdicts take over; a freed request
    reads as a new one."""
    ctrl = GoodputController(max_k=4, prior_acceptance=0.5, prior_weight=2.0)
    for _ in range(20):
        ctrl.record_verdict("good", 4, 4)
    for _ in range(40):
        ctrl.record_verdict("bad", 4, 0)
    tokens = lambda req_id: ctrl.run_odds([req_id]).tokens[4]  # noqa: E731
    assert 4.0 < tokens("good") <= 5.0 and tokens("bad") < 1.2
    assert tokens("good") > tokens("new") > tokens("bad")
    ctrl.free("good")
    assert tokens("good") == tokens("new")


def test_a_request_below_the_engine_is_not_modelled_to_accept_nothing():
    """The engine's runs either rejected at once or accepted whole (half and half, k = 8); a
    request whose drafts are accepted two at a time is below the engine's geometric rate
    (0.67 against 0.89). Its own runs decide: about 2 accepted drafts, 3 tokens at k = 4. On the
    H200, scaling the engine's hazards by the request's rate put its first hazard past 1: 1
    token modelled at every k, and plain decoding for hundreds of steps."""
    ctrl = GoodputController(max_k=8)
    for i in range(200):
        ctrl.record_verdict(f"e{i % 10}", 8, 8 if i % 2 else 0)
    for _ in range(10):
        ctrl.record_verdict("r", 4, 2)
    assert ctrl.acceptance() > 0.85
    assert ctrl.run_odds(["r"]).tokens[4] == pytest.approx(3.0, abs=0.3)


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


def test_engine_leaves_a_useless_slow_proposer_alone(spec_target):
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model="[ngram]",
              num_speculative_tokens=3)
    reference = generate(LLM(spec_target, dtype="float32", device="cpu"), PROMPTS[:2])
    engine = llm.llm_engine
    engine.proposer = proposer = SlowUselessProposer()
    assert generate(llm, PROMPTS[:2]) == reference  # lossless whatever the controller does
    assert proposer.calls < 0.25 * 40  # 40 steps: without the controller every one proposes
    stats = engine.stats().spec_decode
    assert stats["controller_k"] == 0 and stats["controller_acceptance"] < 0.5


def test_controller_is_on_by_default_and_can_be_turned_off(spec_target):
    kw = dict(dtype="float32", device="cpu", speculative_model="[ngram]",
              num_speculative_tokens=2)
    assert LLM(spec_target, **kw).llm_engine.spec.controller is not None
    off = LLM(spec_target, speculative_adaptive="off", **kw).llm_engine
    assert off.spec.controller is None and "controller_k" not in off.stats().spec_decode


def test_a_fixed_cost_per_proposal_is_told_from_the_cost_per_forward():
    """The draft process on the H200: a proposal costs ~3 ms beyond its forwards (messages,
    waking up) and 0.7 ms per forward. From the drafter's own timing of its forwards the
    controller models both, so it reaches the best fixed k; a model of k equal forwards prices
    small k too cheap and large k too dear."""
    fixed, forward = 3e-3, 0.7e-3

    def run(ctrl, fixed_k=None, timed=True, seed=5):
        rng = random.Random(seed)
        tokens, seconds = 0, 0.0
        prev_k = 0
        for _ in range(600):
            d = ctrl.decide(["r0"], seeded=False)
            if fixed_k is not None:
                d.k = fixed_k
            k = d.k
            draft_s = fixed + k * forward if k else 0.0
            step_s = draft_s + gpu_like(k + 1)
            n = next((j for j in range(k) if rng.random() >= 0.8), k)
            ctrl.record_verdict("r0", k, n)
            tokens += n + 1
            seconds += step_s
            timing = (k * forward, forward) if timed and k else (None, None)
            ctrl.record_step(d, 1, k + 1, draft_s, step_s, k > 0, *timing)
            prev_k = k
        return tokens / seconds, prev_k

    best = max(run(GoodputController(max_k=8), fixed_k=k)[0] for k in range(9))
    rate, _ = run(GoodputController(max_k=8))
    assert rate > 0.95 * best
    ctrl = GoodputController(max_k=8)
    run(ctrl)
    assert ctrl.t_first.estimate(1) == pytest.approx(fixed + forward)
    assert ctrl.t_draft.estimate(1) == pytest.approx(forward)


def test_a_one_draft_proposal_does_not_price_the_later_forwards():
    """A one-draft proposal has no later forward: its only forward also catches up on the last
    token or two (on the H200's host 1.16 ms against 0.54 for a later one). Taken as a later
    forward, a run of k = 1 steps (a request of low acceptance) priced every larger k at twice
    its cost for the requests after it."""
    first, later, messages = 1.16e-3, 0.54e-3, 0.1e-3
    ctrl = GoodputController(max_k=8)
    rng = random.Random(3)
    for req, alpha in (("good", 0.9), ("poor", 0.3)):
        for _ in range(150):
            d = ctrl.decide([req], seeded=False)
            k = d.k
            drafter_s = first + (k - 1) * later if k else None
            draft_s = drafter_s + messages if k else 0.0
            step_s = draft_s + gpu_like(k + 1)
            n = next((j for j in range(k) if rng.random() >= alpha), k)
            ctrl.record_verdict(req, k, n)
            ctrl.record_step(d, 1, k + 1, draft_s, step_s, k > 0, drafter_s,
                             first if k else None)
        assert ctrl.t_draft.estimate(1) == pytest.approx(later)
    assert ctrl.k_histogram[1] > 0  # the poor request did take one-draft steps
    # the per-k tally of the steps' costs (the benchmark's diagnosis of a controller's run)
    assert sum(t.steps for t in ctrl.by_k) == 300
    for k, t in enumerate(ctrl.by_k):
        assert t.steps == ctrl.k_histogram[k]
        if k and t.steps:
            row = t.as_dict()
            assert row["drafter_ms"] == pytest.approx(1e3 * (first + (k - 1) * later))
            assert row["first_forward_ms"] == pytest.approx(1e3 * first)
            assert row["propose_ms"] == pytest.approx(row["drafter_ms"] + 1e3 * messages)
            assert row["step_ms"] == pytest.approx(row["propose_ms"] + 1e3 * gpu_like(k + 1))
    # one-draft proposals alone (nothing measured yet) stand in for a forward
    fresh = GoodputController(max_k=4)
    for _ in range(2):
        fresh.record_step(Decision(1), 1, 2, first + messages, 6e-3, True, first, first)
    assert fresh.t_draft.estimate(1) == pytest.approx(first)
    assert fresh.t_first.estimate(1) == pytest.approx(first + messages)


class OracleProposer(Proposer):
    """Proposes each request's reference continuation (every draft accepted) and reports every
    other proposal as made ahead during the last verification (no forward run now, ~0 s), the
    others as drafted now (2 ms, 1 ms of it the first forward)."""

    def __init__(self, reference: dict[tuple, list[int]]) -> None:
        self.reference = reference
        self.calls = 0

    def propose(self, requests, max_num_drafts):
        self.calls += 1
        ahead = self.calls % 2 == 0
        drafts = [self.reference[tuple(r.prompt_token_ids)][len(r.output_token_ids):][:k]
                  for r, k in zip(requests, max_num_drafts)]
        proposal = Proposal(drafts, [None] * len(requests), 1e-5 if ahead else 2e-3,
                            0.0 if ahead else 1e-3, list(range(len(requests))) if ahead else [])
        return ProposalHandle(lambda: proposal)


def test_drafts_made_ahead_price_no_draft_forward(spec_target, monkeypatch):
    """A proposal served from drafting ahead ran no forward: it must not teach the controller
    that a draft forward costs nothing (on the H200 that drove it to k = 8 at 1.41x plain where
    k = 4 gave 1.65x). Outputs stay plain decoding's."""
    plain = LLM(spec_target, dtype="float32", device="cpu")
    outs = plain.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=24,
                                                      ignore_eos=True), use_tqdm=False)
    reference = {tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) for o in outs}
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model="[ngram]",
              num_speculative_tokens=3)
    engine = llm.llm_engine
    engine.proposer = proposer = OracleProposer(reference)
    priced = []
    monkeypatch.setattr(GoodputController, "_record_proposal",
                        lambda self, n, k, wait_s, drafter_s, first_s: priced.append(drafter_s))
    got = llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=24,
                                                   ignore_eos=True), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in got] == [reference[tuple(o.prompt_token_ids)]
                                                          for o in got]
    assert proposer.calls >= 4 and priced  # speculated, and proposals drafted now priced
    assert all(s == 2e-3 for s in priced)  # none of the ones made ahead


def simulate_ahead(ctrl: GoodputController, steps: int, seed: int, fixed=None,
                   stay: float = 0.93, recover: float = 0.6, later: float = 0.6e-3,
                   requests=None) -> tuple[float, list]:
    """One greedy request at batch 1, a CPU draft beside a GPU target (the H200's 7B pair:
    verification ~5 ms whatever its few tokens, 0.6 ms a later draft forward, 1.2 ms for the
    first with the messages, 0.15 ms to hand over drafts made ahead). The draft agrees with the
    target in runs: after a draft that agreed the next agrees with probability `stay`, after
    one that did not, `recover` (a Markov chain over positions, the bonus token's guess the
    position after the last draft). Drafting ahead drafts k + 1 past the proposal during the
    verification; the next proposal is the drafts made ahead when all k were accepted and the
    guess was right. fixed: (k, ahead) every step, no controller's choice. requests: (stay,
    recover) of each request in turn, 128 tokens each, one after the other (else one request).
    Returns tokens per second and the (k, ahead) of each step."""
    rng = random.Random(seed)
    verify = lambda n: 4.85e-3 + 5e-5 * n  # noqa: E731
    first, handover = 2 * later, 0.15e-3
    agreed = False  # the last position's verdict
    ahead_ready, stall = False, 0.0  # the last step drafted ahead and its guess was right
    tokens, seconds, chosen, prev_k = 0, 0.0, [], 0
    req, req_tokens = 0, 0
    for _ in range(steps):
        if requests is not None:
            if req_tokens >= 128:  # the next request: its drafter state starts over
                ctrl.free(f"r{req}")
                req, req_tokens, prev_k, ahead_ready, stall = req + 1, 0, 0, False, 0.0
            stay, recover = requests[req % len(requests)]
        rid = "r" if requests is None else f"r{req}"
        decision = ctrl.decide([rid], seeded=False)
        if fixed is not None:
            decision.k, decision.draft_ahead = fixed
        k = decision.k
        hit = k > 0 and ahead_ready
        draft_s = (stall + (handover if hit else first + (k - 1) * later)) if k else 0.0
        verify_s = verify(k + 1)
        n = 0
        while n < k:  # the drafts' verdicts, then the bonus token's guess
            agreed = rng.random() < (stay if agreed else recover)
            if not agreed:
                break
            n += 1
        guessed = n == k and rng.random() < (stay if agreed else recover)
        if n == k:
            agreed = guessed
        ahead = k > 0 and decision.draft_ahead
        ahead_ready = ahead and guessed
        stall = max(0.0, (k + 1) * later - verify_s) if ahead else 0.0
        ctrl.record_verdict(rid, k, n)
        if ahead and n == k:
            ctrl.record_ahead(rid, k, guessed)
        drafter_s = None if hit or not k else first + (k - 1) * later
        ctrl.record_step(decision, 1, k + 1, draft_s, draft_s + verify_s,
                         k > 0 and prev_k > 0 and not hit, drafter_s,
                         first if drafter_s else None, ahead_hit=hit)
        tokens += n + 1
        req_tokens += n + 1
        seconds += draft_s + verify_s
        chosen.append((k, ahead))
        prev_k = k
    return tokens / seconds, chosen


@pytest.mark.parametrize("stay,recover,later", [(0.93, 0.6, 0.6e-3), (0.9, 0.9, 1e-3),
                                                (0.97, 0.3, 1.5e-3)])
def test_drafting_ahead_is_priced_into_the_choice_of_k(stay, recover, later):
    """With drafting ahead on the table the controller gets within 5% of the best fixed (k,
    ahead) of the sweep, on runs of agreement and on independent verdicts (0.9, 0.9). Where the
    k + 1 forwards ahead outlast the verification at large k (a draft forward of 1 or 1.5 ms
    beside a 5 ms verification), the best k with drafting ahead is smaller than the best
    synchronous one; a controller that chose k as if synchronous and then drafted ahead where
    that paid at it reached 0.73-0.77x of the best (k = 6-8 against 2-4)."""
    rows = {(k, ahead): simulate_ahead(GoodputController(max_k=8), 1500, seed=3,
                                       fixed=(k, ahead), stay=stay, recover=recover,
                                       later=later)[0]
            for k in range(1, 9) for ahead in (False, True)}
    best = max(rows, key=rows.get)
    ctrl = GoodputController(max_k=8, draft_ahead_overlaps=True)
    rate, chosen = simulate_ahead(ctrl, 1500, seed=3, stay=stay, recover=recover, later=later)
    assert rate >= 0.95 * rows[best], (rate, best, rows[best])
    assert best[1] and sum(ahead for _, ahead in chosen[300:]) > 0.8 * 1200
    usual = max(set(chosen[300:]), key=chosen[300:].count)
    assert abs(usual[0] - best[0]) <= 1


def test_the_wait_for_drafting_ahead_is_not_priced_as_the_proposal_s_own():
    """A proposal that waited for the drafter to finish drafting ahead (the forwards ahead
    outlasted the verification) prices its proposal cost without that wait, which the model
    prices apart where the forwards ahead outlast the verification (on the H200 the fixed cost
    of a proposal read 1.0 -> 2.2 ms from it, and the controller drafted less and less)."""
    ctrl = GoodputController(max_k=4, draft_ahead_overlaps=True)
    for _ in range(3):
        ctrl.record_step(Decision(4, draft_ahead=True), 1, 5, 5.2e-3, 10.2e-3, True, 3.0e-3,
                         0.9e-3, queued_s=2.0e-3)
    assert ctrl.t_draft.estimate(1) == pytest.approx(0.7e-3)
    assert ctrl.t_first.estimate(1) == pytest.approx(3.2e-3 - 3 * 0.7e-3)
    for _ in range(2):  # drafts made ahead served: the wait for them, without the queue
        ctrl.record_step(Decision(4, draft_ahead=True), 1, 5, 0.5e-3, 5.5e-3, False,
                         ahead_hit=True, queued_s=0.3e-3)
    assert ctrl.t_hit.estimate(1) == pytest.approx(0.2e-3)


def test_requests_that_differ_each_get_their_own_model():
    """Requests one after another whose drafts agree very differently (a boilerplate one, whose
    runs are mostly whole, a middling one and a poor one), as the H200's humaneval prompts: the
    controller stays within 10% of the best fixed (k, ahead) over them, drafting little for the
    poor request and much for the boilerplate one. (Run 19 on the H200, a model that scaled the
    engine's runs by each request's rate: 1.59x and 2.00x plain against 1.73x and 2.58x for the
    best fixed k at 7B and 13B, plain or one draft in half the steps.)"""
    kinds = [(0.97, 0.3), (0.85, 0.6), (0.5, 0.4)]
    rows = {(k, ahead): simulate_ahead(GoodputController(max_k=8), 2000, seed=5,
                                       fixed=(k, ahead), requests=kinds)[0]
            for k in range(1, 9) for ahead in (False, True)}
    best = max(rows, key=rows.get)
    ctrl = GoodputController(max_k=8, draft_ahead_overlaps=True)
    rate, chosen = simulate_ahead(ctrl, 2000, seed=5, requests=kinds)
    assert rate >= 0.9 * rows[best], (rate, best, rows[best])


def test_the_log_says_which_costs_are_not_yet_measured():
    """The controller's log line names a cost it has not yet measured (no curve bucket with two
    measurements) instead of printing 0.00 ms, which read as a free draft; once measured, its
    milliseconds; the /metrics gauges keep a number (0) either way."""
    ctrl = GoodputController(max_k=4)
    ctrl.t_draft.record(1, 2e-3)  # one measurement: provisional
    text = ctrl.describe()
    assert "draft forward unmeasured" in text and "plain step unmeasured" in text
    assert ctrl.as_dict()["controller_draft_forward_ms"] == 0.0
    record_twice(ctrl.t_draft, 1, 2e-3)
    record_twice(ctrl.t_verify, 1, 9e-3)
    text = ctrl.describe()
    assert "draft forward 2.00 ms" in text and "plain step 9.00 ms" in text
    assert "proposal fixed unmeasured" in text
    assert ctrl.as_dict()["controller_draft_forward_ms"] == pytest.approx(2.0)
