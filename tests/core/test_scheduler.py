"""Scheduler: token budget, chunked prompts, preemption of the newest request, nothing lost."""
from vllm.config import SchedulerConfig
from vllm.core.block_manager import BlockManager
from vllm.core.request import Request, RequestStatus
from vllm.core.scheduler import Scheduler
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
