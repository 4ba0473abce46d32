"""Scheduler: token budget, chunked prompts, preemption of the newest request, nothing lost;
appending stops at the first token that ends a request."""
import pytest

from vllm.config import SchedulerConfig
from vllm.core.block_manager import BlockManager
from vllm.core.request import Request, RequestStatus
from vllm.core.scheduler import Appended, Scheduler
from vllm.sampling_params import SamplingParams


def make(num_blocks=8, budget=64, max_seqs=8):
    bm = BlockManager(num_blocks, 4)
    return Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget), bm,
                     max_model_len=64), bm


def req(rid, n):
    return Request(rid, None, list(range(1, n + 1)), SamplingParams(max_tokens=8), None)


def run_step(s, out):
    s.update(out, [[7] if out.samples(i) else None for i in range(len(out.requests))])


def test_prompts_are_chunked_under_the_budget():
    s, _ = make(budget=6)
    s.add_request(req("a", 10))
    out = s.schedule()
    assert out.num_scheduled_tokens == [6] and not out.samples(0)
    run_step(s, out)
    out = s.schedule()
    assert out.num_scheduled_tokens == [4] and out.samples(0)
    run_step(s, out)
    assert s.requests["a"].output_token_ids == [7]


def test_newest_request_is_preempted_and_recomputed():
    s, bm = make(num_blocks=4, budget=64)
    a, b = req("a", 8), req("b", 8)  # 2 blocks each: the pool is full after both prefills
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    assert [r.req_id for r in out.requests] == ["a", "b"]
    run_step(s, out)
    # decode: each needs a third block for token 9; only a can have it, b is preempted
    out = s.schedule()
    assert [r.req_id for r in out.requests] == ["a"] and out.preempted == [b]
    assert b.status == RequestStatus.WAITING and b.num_computed_tokens == 0 and not b.block_ids
    assert b.output_token_ids == [7]  # its output survives; it is recomputed from all tokens
    run_step(s, out)
    s.finish_request(a, RequestStatus.FINISHED_STOPPED)
    out = s.schedule()
    assert out.requests == [b] and out.num_scheduled_tokens == [9] and out.samples(0)
    assert bm.num_free_blocks == 4 - len(b.block_ids)


def test_max_num_seqs_limits_admission():
    s, _ = make(max_seqs=2)
    for i in range(3):
        s.add_request(req(str(i), 3))
    assert len(s.schedule().requests) == 2


EOS = 2


@pytest.mark.parametrize("params, new_ids, num_kept, status, stop_reason", [
    (SamplingParams(max_tokens=8), [4, EOS, 6, 9], 2, RequestStatus.FINISHED_STOPPED, None),
    (SamplingParams(max_tokens=8, stop_token_ids=[6]), [4, 3, 6, 9], 3,
     RequestStatus.FINISHED_STOPPED, 6),
    (SamplingParams(max_tokens=3), [4, 3, 6, 9], 2, RequestStatus.FINISHED_LENGTH_CAPPED, None),
    # the eos at output position 2 is under min_tokens; the one at position 4 ends it
    (SamplingParams(max_tokens=8, min_tokens=3), [EOS, 3, EOS, 9], 3,
     RequestStatus.FINISHED_STOPPED, None),
    (SamplingParams(max_tokens=8), [4, 3, 6, 9], 4, None, None),
], ids=["eos", "stop-token-id", "max-tokens", "min-tokens", "no-stop"])
def test_update_stops_at_the_first_stop_inside_a_speculative_append(params, new_ids, num_kept,
                                                                     status, stop_reason):
    """A verification appends accepted drafts plus a target token at once: update keeps them
    up to the first one that ends the request and drops the rest."""
    s, _ = make()
    r = Request("a", None, [1, 1, 1], params, EOS)
    s.add_request(r)
    out = s.schedule()
    assert s.update(out, [[5]]) == [Appended(1)]  # the prompt's token
    out = s.schedule(num_lookahead=3)
    assert out.num_lookahead == [3]
    out.draft_token_ids[0] = new_ids[:3]  # as the proposer fills them in
    out.num_scheduled_tokens[0] += 3
    assert s.update(out, [new_ids]) == [Appended(num_kept, status)]
    assert r.output_token_ids == [5] + new_ids[:num_kept]
    assert r.stop_reason == stop_reason


def test_update_reports_nothing_for_a_request_mid_prompt():
    s, _ = make(budget=4)
    r = req("a", 6)
    s.add_request(r)
    out = s.schedule()
    assert s.update(out, [None]) == [None] and r.output_token_ids == []


def test_delay_factor_lets_prompts_arriving_close_together_share_a_step():
    """--scheduler-delay-factor 1: with a request running, a new prompt waits until it has
    waited as long as the last prompt step took (0.1 s here), so a second prompt arriving
    meanwhile joins the same prefill step; with nothing running, a prompt is admitted at once."""
    bm = BlockManager(16, 4)
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64,
                                  scheduler_delay_factor=1.0), bm, max_model_len=64)
    a = Request("a", None, [1, 2, 3], SamplingParams(max_tokens=8), None, arrival_time=0.0)
    s.add_request(a)
    out = s.schedule(now=0.0)  # nothing runs: admitted at once
    assert [r.req_id for r in out.requests] == ["a"]
    run_step(s, out)
    out = s.schedule(now=0.1)  # the prompt step took 0.1 s
    assert s.prompt_step_s == pytest.approx(0.1) and [r.req_id for r in out.requests] == ["a"]
    run_step(s, out)
    b = Request("b", None, [4, 5], SamplingParams(max_tokens=8), None, arrival_time=0.15)
    c = Request("c", None, [6, 7], SamplingParams(max_tokens=8), None, arrival_time=0.2)
    s.add_request(b)
    out = s.schedule(now=0.2)  # b has waited 0.05 s < 0.1 s: decode only
    assert [r.req_id for r in out.requests] == ["a"]
    run_step(s, out)
    s.add_request(c)
    out = s.schedule(now=0.26)  # b has waited 0.11 s: b and c share the step
    assert [r.req_id for r in out.requests] == ["a", "b", "c"]


def test_no_delay_by_default():
    s, _ = make()
    s.add_request(req("a", 3))
    run_step(s, s.schedule(now=0.0))
    s.schedule(now=10.0)
    s.add_request(req("b", 3))
    assert [r.req_id for r in s.schedule(now=10.0).requests] == ["a", "b"]
