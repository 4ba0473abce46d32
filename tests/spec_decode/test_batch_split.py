"""Batched overlap: half the batch is verified while the draft process drafts the other half.
The controller splits only when its cost model says it pays (a draft whose cost grows with the
batch, next to a flat verification), never at batch 1 or without a draft process; in the engine
a split run gives the same greedy tokens as plain decoding, with the resting half left out of
each split step."""
import random

import pytest

from tests.spec_decode.test_draft_process import (GREEDY, PROMPTS, reference,  # noqa: F401
                                                  spec_engine)
from vllm.spec_decode.acceptance import expected_tokens
from vllm.spec_decode.goodput import GoodputController


def gpu_like(n: int) -> float:  # memory-bound target: flat up to 64 tokens, then linear
    return 5e-3 * max(1.0, n / 64)


def simulate(ctrl: GoodputController, alpha: float, verify, draft, batch: int,
             steps: int = 400, seed: int = 0) -> tuple[float, list]:
    """Decode steps as the engine runs them, split or not as the controller decides; the true
    seconds are verify(tokens) and draft(requests). Returns tokens/s and the decisions."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(batch)]
    tokens, seconds, decisions, prev = 0, 0.0, [], None
    for _ in range(steps):
        d = ctrl.decide(ids, seeded=False)
        k = d.k
        if d.split:
            half, other = ids[:batch - batch // 2], ids[batch - batch // 2:]
            verify_s = verify(len(half) * (k + 1))
            step_s = max(k * draft(len(other)), verify_s)
            ctrl.record_draft(len(other), k, k * draft(len(other)))
            ctrl.record_step(d, len(half), len(half) * (k + 1), step_s - verify_s, step_s,
                             False)
            verified = half
        else:
            draft_s = k * draft(batch)
            step_s = draft_s + verify(batch * (k + 1))
            measured = k > 0 and prev is not None and prev.k > 0 and not prev.split
            ctrl.record_step(d, batch, batch * (k + 1), draft_s, step_s, measured)
            verified = ids
        for r in verified:
            n = next((j for j in range(k) if rng.random() >= alpha), k)
            ctrl.record_verdict(r, k, n)
            tokens += n + 1
        seconds += step_s
        decisions.append(d)
        prev = d
    return tokens / seconds, decisions


def split_controller(max_k: int = 4) -> GoodputController:
    ctrl = GoodputController(max_k=max_k)
    ctrl.can_split = True
    return ctrl


def test_splits_when_drafting_the_batch_costs_about_a_verification():
    """Draft 0.4 ms per request per forward, verification flat 5 ms, 8 requests at acceptance
    0.7: unsplit, the best k (1) gives 8 * 1.7 tokens / 8.2 ms; split with k = 3 the drafting
    (4.8 ms) hides under the verification: 4 * 2.53 tokens / 5 ms, 22% more."""
    ctrl = split_controller()
    rate, decisions = simulate(ctrl, 0.7, gpu_like, lambda b: 4e-4 * b, batch=8)
    late = decisions[100:]
    assert sum(d.split for d in late) > 0.9 * len(late)
    assert max(set(d.k for d in late), key=[d.k for d in late].count) == 3
    unsplit = 8 * expected_tokens(0.7, 1) / (1 * 8 * 4e-4 + 5e-3)
    assert rate > 1.1 * unsplit


def test_no_split_when_the_draft_costs_the_same_at_any_batch():
    """A memory-bound draft (1 ms per forward whatever the batch): unsplit k = 4 verifies all 8
    requests in 9 ms; split would verify 4 in 5 ms."""
    ctrl = split_controller()
    _, decisions = simulate(ctrl, 0.7, gpu_like, lambda b: 1e-3, batch=8)
    assert sum(d.split for d in decisions[100:]) < 0.05 * 300


@pytest.mark.parametrize("batch,can_split", [(1, True), (8, False)])
def test_never_splits_one_request_or_without_a_draft_process(batch, can_split):
    ctrl = GoodputController(max_k=4)
    ctrl.can_split = can_split
    _, decisions = simulate(ctrl, 0.7, gpu_like, lambda b: 4e-4 * b, batch=batch)
    assert not any(d.split for d in decisions)


@pytest.mark.parametrize("draft", ["self", "other"])
def test_split_greedy_equals_plain(reference, spec_target, spec_draft, draft):  # noqa: F811
    """Four requests, two of them arriving later, every step with 2+ decoding requests split;
    the resting requests are never in the step that rests them."""
    engine = spec_engine(spec_target, spec_target if draft == "self" else spec_draft,
                         speculative_batch_split="on")
    outputs, split_steps = {}, 0
    try:
        for i in range(2):
            engine.add_request(str(i), PROMPTS[i], GREEDY)
        step = 0
        while engine.has_unfinished_requests():
            if step == 5:
                for i in range(2, len(PROMPTS)):
                    engine.add_request(str(i), PROMPTS[i], GREEDY)
            scheduled = []
            original = engine.scheduler.schedule

            def spy(*args, **kwargs):
                out = original(*args, **kwargs)
                scheduled.extend(r.req_id for r in out.requests)
                return out

            engine.scheduler.schedule = spy
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out.outputs[0].token_ids
            engine.scheduler.schedule = original
            resting = {r.req_id for r in engine.spec.resting}
            if resting:
                split_steps += 1
                assert not resting & set(scheduled)
            step += 1
        assert [outputs[str(i)] for i in range(len(PROMPTS))] == reference
        m = engine.spec_metrics
        assert split_steps > 10 and m.num_spec_steps > 0
        if draft == "self":
            assert m.acceptance_rate == 1.0
    finally:
        engine.shutdown()
