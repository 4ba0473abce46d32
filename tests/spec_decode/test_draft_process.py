"""The CPU draft in its own process (DraftProcessProposer): greedy outputs equal plain decoding
for a draft equal to and different from the target; a drafter that hangs (SIGSTOP) past the
timeout or dies (SIGKILL) mid-generation is replaced while the engine decodes without
speculation, and outputs still equal plain decoding; a bad draft is a start-up error."""
import multiprocessing
import os
import signal
import threading
import time

import pytest

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.spec_decode import draft_process
from vllm.spec_decode.goodput import GoodputController

PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over", "x", "Once upon a time"]
NUM_TOKENS = 48
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(spec_target):
    llm = LLM(spec_target, dtype="float32", device="cpu")
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def spec_engine(target: str, draft: str, **kwargs) -> LLMEngine:
    kwargs.setdefault("speculative_adaptive", "off")
    return LLMEngine.from_engine_args(EngineArgs(
        model=target, dtype="float32", device="cpu", speculative_model=draft,
        num_speculative_tokens=3, cpu_draft_worker=True, speculative_draft_dtype="float32",
        speculative_draft_process="on", **kwargs))


def run(engine: LLMEngine, on_step=None) -> list[list[int]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, GREEDY)
    outputs, step = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
        step += 1
        if on_step is not None:
            on_step(step)
    return [outputs[str(i)] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("draft,ahead,spin", [("self", "off", False), ("other", "on", False),
                                              ("self", "on", False), ("other", "off", True)])
def test_draft_process_greedy_equals_plain(reference, spec_target, spec_draft, draft, ahead,
                                           spin, monkeypatch):
    """With drafting ahead on, the drafter drafts past each proposal after answering it; with
    VLLM_DRAFTER_SPIN it busy-waits between steps."""
    if spin:
        monkeypatch.setenv("VLLM_DRAFTER_SPIN", "1")
    engine = spec_engine(spec_target, spec_target if draft == "self" else spec_draft,
                         speculative_draft_ahead=ahead)
    assert engine.draft_ahead == (ahead == "on")
    from_ahead = []  # per answer: the requests whose drafts the drafter had made ahead
    receive = engine.proposer._receive
    engine.proposer._receive = lambda empty: (lambda p: from_ahead.append(p.num_from_ahead)
                                              or p)(receive(empty))
    try:
        assert engine.proposer.runs_in_own_process and engine.proposer.pid != os.getpid()
        assert run(engine) == reference
        m = engine.spec_metrics
        assert m.num_spec_steps > 0
        if draft == "self":
            assert m.acceptance_rate == 1.0
        # the drafter's drafting-ahead counts reach the engine's side (benchmarks read them)
        made = engine.proposer.ahead_stats["made"]
        assert (made > 0) == (ahead == "on") and engine.proposer.ahead_stats["used"] <= made
        # the answers say which proposals' drafts were made ahead (the controller prices no
        # draft forward from those)
        assert sum(from_ahead) == engine.proposer.ahead_stats["used"]
        if draft == "self" and ahead == "on":  # every guess right: most proposals come ahead
            assert sum(from_ahead) > 0
    finally:
        engine.shutdown()
    assert engine.proposer.proc.poll() is not None  # shutdown stopped it


def test_the_controller_hears_whether_drafts_made_ahead_were_used(reference, spec_target,
                                                                  monkeypatch):
    """With the controller on and drafting ahead: after a step whose drafts were all accepted,
    the next proposal says whether the drafts made ahead were used (the target's bonus token
    was the draft's guess); the controller learns how far runs of accepted drafts reach from
    it. Every use the drafter reports is heard as one (the draft is the target: every guess is
    right), and outputs stay plain decoding's."""
    heard = []
    monkeypatch.setattr(GoodputController, "record_ahead",
                        lambda self, req_id, k, used: heard.append((k, used)))
    engine = spec_engine(spec_target, spec_target, speculative_draft_ahead="on",
                         speculative_adaptive="on")
    # k from K at once, as over a GPU target: climbing (a CPU target's explore_upward), a step
    # after a smaller k's drafts ahead hears its guess right but drafts its larger k afresh
    engine.spec.controller.explore_upward = False
    from_ahead = []
    receive = engine.proposer._receive
    engine.proposer._receive = lambda empty: (lambda p: from_ahead.append(p.num_from_ahead)
                                              or p)(receive(empty))
    try:
        assert run(engine) == reference
        assert sum(used for _, used in heard) == sum(from_ahead) > 0
        assert all(1 <= k <= 3 and used for k, used in heard)
    finally:
        engine.shutdown()


def test_drafting_ahead_switched_on_after_start_reaches_the_drafter(reference, spec_target,
                                                                    spec_draft):
    """As benchmark_spec_decode's '+ahead' rows do: an engine started with drafting ahead off,
    then switched on (engine.draft_ahead), drafts ahead in its draft process from then on (its
    steps' choice travels with each proposal); outputs unchanged. Before, the process kept the
    flag it started with and such rows drafted synchronously."""
    engine = spec_engine(spec_target, spec_draft, speculative_draft_ahead="off")
    try:
        assert not engine.draft_ahead
        engine.draft_ahead = True
        assert run(engine) == reference
        made = engine.proposer.ahead_stats["made"]
        assert made > 0 and engine.proposer.ahead_stats["used"] <= made
        engine.draft_ahead = False
        # the counts come with the drafter's next answer: the first run after switching off
        # still brings those of the last step before it
        assert run(engine) == reference
        before = dict(engine.proposer.ahead_stats)
        assert run(engine) == reference
        assert engine.proposer.ahead_stats["made"] == before["made"]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("adaptive", ["off", "on"])
def test_prompts_reach_the_drafter_in_the_step_that_prefills_them(reference, spec_target,
                                                                  spec_draft, adaptive):
    """Prompts arriving while a request decodes (as at a busy server) are sent to the draft
    process in the step that prefills them, so that their first proposal does not prefill
    them (which the engine waits for); outputs still equal plain decoding. (With the
    controller, that step may be a plain one, whose catch-up is skipped while the drafter is
    still busy with the last: there only the outputs are checked.)"""
    engine = spec_engine(spec_target, spec_draft, speculative_adaptive=adaptive)
    try:
        engine.add_request("0", PROMPTS[0], GREEDY)
        engine.step()  # 0's prompt
        engine.step()  # 0 decodes
        for i in range(1, len(PROMPTS)):
            engine.add_request(str(i), PROMPTS[i], GREEDY)
        outputs = {}
        for out in engine.step():  # their prompts, beside 0's decoding
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
        for i in range(1, len(PROMPTS)):
            req = engine.groups[str(i)].children[0]
            if adaptive == "off":
                assert engine.spec._seen[req.req_id] == req.num_prompt_tokens
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out.outputs[0].token_ids
        assert [outputs[str(i)] for i in range(len(PROMPTS))] == reference
    finally:
        engine.shutdown()


@pytest.mark.parametrize("spin_idle_s", [1.0, None])  # None: the default window
def test_a_spinning_drafter_rests_once_steps_stop(spec_target, spec_draft, spin_idle_s,
                                                  monkeypatch):
    """VLLM_DRAFTER_SPIN busy-waits only while steps come: the drafter burns CPU right after a
    generation (within a 1 s VLLM_DRAFTER_SPIN_IDLE_S), and none to speak of once that window
    (and its threads' spin count) has passed without a step; the default window is over within
    a few tenths of a second (the plain steps of a goodput controller that stopped drafting)."""
    psutil = pytest.importorskip("psutil")
    monkeypatch.setenv("VLLM_DRAFTER_SPIN", "on")
    if spin_idle_s is not None:
        monkeypatch.setenv("VLLM_DRAFTER_SPIN_IDLE_S", str(spin_idle_s))
    engine = spec_engine(spec_target, spec_draft)
    try:
        drafter = psutil.Process(engine.proposer.pid)
        run(engine)

        def cpu_seconds_over(seconds: float) -> float:
            before = sum(drafter.cpu_times()[:2])
            time.sleep(seconds)
            return sum(drafter.cpu_times()[:2]) - before

        if spin_idle_s is not None:
            busy = cpu_seconds_over(0.3)  # within the window of the last step: spinning
            assert busy > 0.1, busy
            time.sleep(spin_idle_s + 1.5)
        else:
            time.sleep(0.3)
        idle = cpu_seconds_over(1.0)
        assert idle < 0.05, idle
    finally:
        engine.shutdown()


@pytest.mark.parametrize("spins", [True, False])
def test_the_engine_polls_for_an_answer_then_sleeps_until_its_timeout(spins, monkeypatch):
    """Beside a spinning drafter the engine polls the pipe busily for the drafter's spin window,
    then sleeps on it: an answer after the window is still read, none is a timeout after
    timeout_s; without spinning it sleeps from the start (no CPU burnt while waiting)."""
    monkeypatch.setenv("VLLM_DRAFTER_SPIN_IDLE_S", "0.2")
    parent, child = multiprocessing.Pipe()
    proposer = object.__new__(draft_process.DraftProcessProposer)
    proposer.conn, proposer.spins, proposer.timeout_s = parent, spins, 0.1
    start, cpu_start = time.monotonic(), time.thread_time()
    assert not proposer._answer_arrived()
    waited, cpu = time.monotonic() - start, time.thread_time() - cpu_start
    assert waited >= (0.3 if spins else 0.1) - 0.01, waited
    assert (cpu > 0.05) if spins else (cpu < 0.03), cpu
    late = threading.Timer(0.25, child.send, args=("late",))
    late.start()
    try:
        proposer.timeout_s = 5.0
        assert proposer._answer_arrived() and parent.recv() == "late"
    finally:
        late.join()
    child.send("there")  # already waiting in the pipe: read at once either way
    start = time.monotonic()
    assert proposer._answer_arrived() and time.monotonic() - start < 0.05
    assert parent.recv() == "there"


@pytest.mark.parametrize("fault", [signal.SIGSTOP, signal.SIGKILL])
def test_drafter_fault_mid_generation_equals_plain(reference, spec_target, spec_draft, fault):
    engine = spec_engine(spec_target, spec_draft, speculative_draft_timeout=1.0)
    proposer = engine.proposer
    first_pid = proposer.pid

    def inject(step: int) -> None:
        if step == 3:
            os.kill(first_pid, fault)

    try:
        assert run(engine, inject) == reference
        assert proposer.num_failures >= 1 and proposer.num_restarts >= 1
        # the replacement drafter takes over for the next requests
        assert proposer.wait_until_ready(120)
        before = engine.spec_metrics.num_spec_steps
        assert run(engine) == reference
        assert proposer.pid != first_pid and engine.spec_metrics.num_spec_steps > before
    finally:
        engine.shutdown()


def test_bad_draft_is_a_startup_error(spec_target, tmp_path):
    with pytest.raises(ValueError, match="missing"):
        spec_engine(spec_target, str(tmp_path / "missing"))


def test_a_step_after_accepted_drafts_is_no_catch_up(reference, spec_target):
    """The controller hears, as a step's catch-up, the tokens whose KV the drafter lacks: after
    a step that drafted for every request, at most 2 a request (the last draft, the bonus
    token), however many drafts were accepted (so no resume's catch-up is priced: the
    controller's _resume_seconds takes what passes 2 a request). After plain steps the
    drafter was fed (a draft process): 1 or 2 a request (a feed is skipped while the one
    before still runs)."""
    from vllm.spec_decode.goodput import Decision

    engine = spec_engine(spec_target, spec_target, speculative_adaptive="on")
    spec = engine.spec
    pattern = [3, 3, 3, 0, 0, 3]
    seen = []

    def scripted(req_ids, seeded, catch_up_tokens=0, can_hit=None, tokens_left=None):
        k = pattern[len(seen) % len(pattern)]
        seen.append((len(req_ids), catch_up_tokens, k))
        return Decision(k)

    spec.controller.decide = scripted
    try:
        assert run(engine) == reference
        assert engine.spec_metrics.acceptance_rate == 1.0
        after_spec = [(n, c) for (n, c, _), (_, _, prev) in zip(seen[1:], seen) if prev and n]
        assert len(after_spec) > 10
        # every draft accepted: 4 new tokens a request, of which the drafter lacks 2
        assert all(c <= 2 * n for n, c in after_spec)
        assert any(c == 2 * n for n, c in after_spec)
        after_plain = [(n, c) for (n, c, _), (_, _, prev) in zip(seen[1:], seen)
                       if not prev and n]
        assert len(after_plain) > 5 and all(n <= c <= 2 * n for n, c in after_plain)
    finally:
        engine.shutdown()


def test_drafter_catches_up_during_plain_steps(reference, spec_target):
    """Under the goodput controller a plain step sends the drafter the new tokens to catch up on
    (never waited for): with the target as its own draft every later draft is accepted (the KV
    it filled is right), outputs equal plain decoding, and each proposal after plain steps
    measures the draft forward (the drafter was caught up)."""
    from vllm.spec_decode.goodput import Decision

    engine = spec_engine(spec_target, spec_target, speculative_adaptive="on")
    spec = engine.spec
    pattern = [0, 0, 0, 0, 1, 0, 0, 3, 3, 0, 0, 0, 2]
    calls = {"n": 0}

    lefts = []

    def scripted(req_ids, seeded, catch_up_tokens=0, can_hit=None, tokens_left=None):
        # each decoding request's max_tokens less its output (asked for here, every step)
        lefts.append(tokens_left() if tokens_left is not None else None)
        k = pattern[calls["n"] % len(pattern)]
        calls["n"] += 1
        return Decision(k, probe=k == 1)

    measured = []
    record_step = spec.controller.record_step

    def record(decision, num_decoding, num_tokens, draft_s, step_s, draft_measured, *timing,
               **ahead):
        measured.append((decision.k, draft_measured))
        record_step(decision, num_decoding, num_tokens, draft_s, step_s, draft_measured,
                    *timing, **ahead)

    spec.controller.decide, spec.controller.record_step = scripted, record
    fed = {"n": 0}
    observe = engine.proposer.observe

    def counting_observe(reqs):  # waits for each catch-up, so that none is skipped as busy
        took = observe(reqs)
        if took:
            fed["n"] += 1
            feeding, engine.proposer.feeding = engine.proposer.feeding, None
            feeding.result()
        return took

    engine.proposer.observe = counting_observe
    try:
        assert run(engine) == reference
        m = engine.spec_metrics
        assert m.num_spec_steps > 10 and m.acceptance_rate == 1.0
        assert fed["n"] > 10
        after_plain = [ok for (k, ok), (prev, _) in zip(measured[1:], measured) if k and not prev]
        assert len(after_plain) > 5 and all(after_plain)
        # all four decode from the same step and emit the same tokens (every draft accepted)
        # (None: a step with no decoding request, the prompts')
        lefts = [n for n in lefts if n is not None]
        assert lefts[0] == NUM_TOKENS - 1 and lefts == sorted(lefts, reverse=True)
        assert min(lefts) >= 1 and len(set(lefts)) > 10
    finally:
        engine.shutdown()
