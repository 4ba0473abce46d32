"""The CPU draft's thread count: picked by measurement at start-up, or set by the flag."""
import time

import pytest
import torch

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.tokenizer import get_tokenizer
from vllm.model_executor.model_loader.loader import resolve_config
from vllm.spec_decode.draft_worker import DraftModelProposer
from vllm.worker import cpu_threads


def test_pick_takes_the_fewest_threads_near_the_fastest():
    costs = {1: 0.04, 2: 0.021, 4: 0.02, 8: 0.03}  # seconds per forward by thread count
    before = torch.get_num_threads()
    try:
        n, times = cpu_threads.pick_num_threads(
            lambda: time.sleep(costs[torch.get_num_threads()]), list(costs), repeats=3,
            tolerance=0.25)
        assert n == 2 and torch.get_num_threads() == 2
        assert times[8] > times[4] and times[1] > times[2]
    finally:
        torch.set_num_threads(before)


def test_pick_is_not_misled_by_a_slow_spell(monkeypatch):
    """A host that slows down for a while: measured count by count, the spell falls on 2
    threads alone (the truly fastest) and 4 is picked; interleaved rounds spread it out."""
    costs = {1: 2.0, 2: 1.0, 4: 1.1}  # ms per forward by thread count, outside the spell
    clock = {"now": 0.0, "calls": 0}

    def forward():
        slow = 6 <= clock["calls"] < 12  # the second count's first six forwards
        clock["now"] += costs[torch.get_num_threads()] * (1.6 if slow else 1.0) / 1e3
        clock["calls"] += 1

    monkeypatch.setattr(cpu_threads.time, "perf_counter", lambda: clock["now"])
    before = torch.get_num_threads()
    try:
        n, times = cpu_threads.pick_num_threads(forward, [1, 2, 4], repeats=5, rounds=1)
        assert n == 4 and times[2] > times[4]  # one round: the spell decides
        clock.update(now=0.0, calls=0)
        n, times = cpu_threads.pick_num_threads(forward, [1, 2, 4], repeats=5)
        assert n == 2 and times[2] == pytest.approx(1.0)
    finally:
        torch.set_num_threads(before)


def test_candidates_are_powers_of_two_up_to_the_cores():
    counts = cpu_threads.candidate_counts()
    assert counts[0] == 1 and counts == sorted(set(counts))
    assert all(c & (c - 1) == 0 for c in counts[:-1])


def make_proposer(target, draft, threads, owns_process=True):
    args = EngineArgs(model=target, dtype="float32", device="cpu", speculative_model=draft,
                      num_speculative_tokens=2, cpu_draft_worker=True,
                      speculative_draft_dtype="float32", speculative_draft_threads=threads)
    config = resolve_config(args.create_engine_config())
    return DraftModelProposer(config, get_tokenizer(config.model_config), owns_process)


def test_flag_sets_the_draft_threads(spec_target, spec_draft):
    before = torch.get_num_threads()
    try:
        assert make_proposer(spec_target, spec_draft, 1).num_threads == 1
        assert torch.get_num_threads() == 1
        measured = make_proposer(spec_target, spec_draft, 0).num_threads
        assert measured in cpu_threads.candidate_counts()
        assert torch.get_num_threads() == measured
    finally:
        torch.set_num_threads(before)


def test_beside_a_cpu_target_in_one_process_threads_are_left_alone(spec_target, spec_draft):
    """torch's thread count is process-wide: a draft sharing a CPU target's process must not
    change the target's."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert make_proposer(spec_target, spec_draft, 1, owns_process=False).num_threads == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_negative_thread_count_is_refused(spec_target, spec_draft):
    with pytest.raises(ValueError, match="speculative_draft_threads"):
        make_proposer(spec_target, spec_draft, -1)
