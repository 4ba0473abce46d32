"""The CPU draft worker: KV rollback after partial acceptance and catch-up of the bonus token,
checked by comparing its drafts with those of a fresh draft worker that recomputes everything;
and the start-up checks."""
import json
import shutil

import pytest

from vllm import LLM, SamplingParams
from vllm.core.request import Request
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.tokenizer import get_tokenizer
from vllm.model_executor.model_loader.loader import resolve_config
from vllm.spec_decode.draft_worker import DraftModelProposer


def make_proposer(target, draft, k=4):
    args = EngineArgs(model=target, dtype="float32", device="cpu", speculative_model=draft,
                      speculative_adaptive="off", num_speculative_tokens=k, cpu_draft_worker=True,
                      speculative_draft_dtype="float32")
    config = resolve_config(args.create_engine_config())
    return DraftModelProposer(config, get_tokenizer(config.model_config))


@pytest.mark.parametrize("target_len,draft_len,draft_positions,expected", [
    (64, None, 512, 64),     # the target's limit, not the draft's own 512
    (512, None, 128, 128),   # a draft of shorter context: its own
    (64, 20, 512, 20),       # speculative_max_model_len given: as given
    (64, 100, 512, 64),      # ... but never past the target's
])
def test_draft_kv_cache_is_sized_by_what_sequences_can_reach(
        spec_target, tmp_path, target_len, draft_len, draft_positions, expected):
    """The draft's max_model_len is the least of the target's and its own (or of
    speculative_max_model_len), and its KV cache holds max_num_seqs sequences of that length:
    no more blocks, so a long-context draft beside a short-context target takes no more memory."""
    draft = tmp_path / "draft"
    shutil.copytree(spec_target, draft)
    config = json.loads((draft / "config.json").read_text())
    config["max_position_embeddings"] = draft_positions
    (draft / "config.json").write_text(json.dumps(config))
    args = EngineArgs(model=spec_target, dtype="float32", device="cpu", max_model_len=target_len,
                      max_num_seqs=3, speculative_model=str(draft), speculative_adaptive="off",
                      num_speculative_tokens=2, cpu_draft_worker=True,
                      speculative_draft_dtype="float32", speculative_max_model_len=draft_len)
    config = resolve_config(args.create_engine_config())
    worker = DraftModelProposer(config, get_tokenizer(config.model_config))
    assert worker.max_model_len == expected
    block = config.cache_config.block_size
    assert worker.block_manager.num_blocks == 3 * -(-expected // block)


def request(token_ids, out_ids=()):
    req = Request("r", None, token_ids, SamplingParams(temperature=0.0), None)
    req.output_token_ids = list(out_ids)
    return req


def test_rollback_and_catch_up_match_a_fresh_draft(spec_target, spec_draft):
    worker = make_proposer(spec_target, spec_draft)
    req = request(list(range(10, 30)))
    drafts = worker.propose([req], [4]).result().draft_token_ids[0]
    assert len(drafts) == 4
    seq = worker.seqs["r"]
    assert seq.num_computed_tokens == 20 + 3  # drafts 1..3 were fed back, the 4th was not
    # the target accepts 2 drafts and emits a different (bonus/correction) token after them
    worker.accept(req, 2)
    assert seq.num_computed_tokens == 22  # rolled back to the accepted prefix
    req.output_token_ids = drafts[:2] + [(drafts[2] + 1) % 400]
    next_drafts = worker.propose([req], [4]).result().draft_token_ids[0]
    fresh = make_proposer(spec_target, spec_draft)
    assert next_drafts == fresh.propose([req], [4]).result().draft_token_ids[0]
    # full acceptance: the 4th draft's KV was never computed and is caught up with the bonus
    worker.accept(req, 4)
    req.output_token_ids += next_drafts + [7]
    again = worker.propose([req], [3]).result().draft_token_ids[0]
    fresh = make_proposer(spec_target, spec_draft)
    assert again == fresh.propose([req], [3]).result().draft_token_ids[0]
    worker.free("r")
    assert worker.block_manager.num_free_blocks == worker.block_manager.num_blocks


def test_draft_with_other_vocabulary_is_refused(spec_target, tmp_path):
    other = tmp_path / "other-vocab"
    shutil.copytree(spec_target, other)
    config = json.loads((other / "config.json").read_text())
    config["vocab_size"] = 512
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="vocab_size"):
        LLM(spec_target, device="cpu", speculative_model=str(other), num_speculative_tokens=2,
            cpu_draft_worker=True, load_format="dummy")


def test_spec_flags_are_checked(spec_target):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(spec_target, device="cpu", speculative_model="[ngram]")
    with pytest.raises(ValueError, match="draft_device"):
        LLM(spec_target, device="cpu", speculative_config={"method": "ngram",
                                                           "num_speculative_tokens": 2,
                                                           "draft_device": "tpu"})
    llm = LLM(spec_target, device="cpu", dtype="float32",
              speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                  "prompt_lookup_max": 3})
    assert llm.llm_engine.spec_config.ngram_prompt_lookup_max == 3
    out = llm.generate("for i in range(10):\n    print(i", SamplingParams(temperature=0.0,
                                                                          max_tokens=8),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8


def test_sampled_spec_decode_is_reproducible_with_seeds(spec_target, spec_draft):
    llm = LLM(spec_target, device="cpu", dtype="float32", speculative_model=spec_draft,
              speculative_adaptive="off", num_speculative_tokens=3, cpu_draft_worker=True)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True)
    a = llm.generate(["def fibonacci(n):"], params, use_tqdm=False)[0].outputs[0].token_ids
    b = llm.generate(["The quick", "def fibonacci(n):"], [SamplingParams(max_tokens=5), params],
                     use_tqdm=False)[1].outputs[0].token_ids
    assert a == b and len(a) == 24
    assert llm.llm_engine.spec_metrics.num_spec_steps > 0


def test_long_requests_and_large_batches_go_on_without_speculation(spec_target, spec_draft):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    plain = LLM(spec_target, device="cpu", dtype="float32")
    ref = plain.generate([prompt, "x", "y"], params, use_tqdm=False)
    # the draft handles at most 20 tokens: the long prompt gets no drafts, the others do
    llm = LLM(spec_target, device="cpu", dtype="float32", speculative_model=spec_draft,
              speculative_adaptive="off", num_speculative_tokens=3, cpu_draft_worker=True,
              speculative_max_model_len=20)
    outs = llm.generate([prompt], params, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
    assert llm.llm_engine.spec_metrics.num_spec_steps == 0
    outs = llm.generate(["x"], params, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == ref[1].outputs[0].token_ids
    assert llm.llm_engine.spec_metrics.num_spec_steps > 0
    # with 3 running requests and the limit at 2, no step speculates
    off = LLM(spec_target, device="cpu", dtype="float32", speculative_model=spec_draft,
              speculative_adaptive="off", num_speculative_tokens=3, cpu_draft_worker=True,
              speculative_disable_by_batch_size=2)
    outs = off.generate([prompt, "x", "y"], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    assert off.llm_engine.spec_metrics.num_spec_steps == 0


@pytest.mark.parametrize("outcome", ["hit", "hit-fewer", "hit-more", "wrong-bonus", "partial",
                                     "plain-step-between"])
def test_drafts_made_ahead_are_used_only_when_valid(spec_target, spec_draft, outcome):
    """After propose() and propose_ahead(), the target's verdict decides: all accepted with the
    guessed bonus token -> the drafts made ahead come back without a forward; otherwise (a
    different bonus token, a rejection, or a plain decode step in between that appended a token)
    they are dropped, the KV is kept only where the tokens are the target's, and the next drafts
    equal those of a fresh draft worker. A right guess with more drafts asked than were made
    ahead (the controller raised k) drafts them all afresh; the proposal says which requests'
    drafts came from ahead and which were guessed right."""
    worker = make_proposer(spec_target, spec_draft)
    req = request(list(range(10, 30)))
    drafts = worker.propose([req], [3]).result().draft_token_ids[0]
    worker.propose_ahead()
    guess, ahead = worker.seqs["r"].token_ids[23], worker.ahead["r"][1]
    if outcome.startswith("hit"):
        worker.accept(req, 3)
        req.output_token_ids = drafts + [guess]
    elif outcome == "wrong-bonus":
        worker.accept(req, 3)
        req.output_token_ids = drafts + [(guess + 1) % 400]
    elif outcome == "partial":
        worker.accept(req, 1)
        req.output_token_ids = drafts[:1] + [(drafts[1] + 1) % 400]
    else:  # all accepted but another bonus token, then a plain step appended one more
        worker.accept(req, 3)
        req.output_token_ids = drafts + [(guess + 1) % 400, 7]
    forwards = worker.runner.model.forward
    calls = []
    worker.runner.model.forward = lambda *a, **kw: calls.append(1) or forwards(*a, **kw)
    step = worker.greedy_step  # a greedy one-token step runs outside the model's forward
    if step is not None:
        worker.greedy_step = lambda *a: calls.append(1) or step(*a)
    k = {"hit-fewer": 2, "hit-more": 5}.get(outcome, 3)
    proposal = worker.propose([req], [k]).result()
    got = proposal.draft_token_ids[0]
    fresh = make_proposer(spec_target, spec_draft)
    assert got == fresh.propose([req], [k]).result().draft_token_ids[0] and len(got) == k
    served = outcome in ("hit", "hit-fewer")
    if served:
        assert got == ahead[:k] and not calls and worker.ahead_stats["used"] == 1
    else:
        assert calls and worker.ahead_stats["used"] == 0
    assert proposal.from_ahead == ([0] if served else [])
    assert proposal.ahead_guessed == ([0] if outcome.startswith("hit") else [])
    # and the KV the worker kept is right: its next drafts after a full acceptance match too
    worker.accept(req, k)
    req.output_token_ids += got + [5]
    fresh = make_proposer(spec_target, spec_draft)
    assert (worker.propose([req], [2]).result().draft_token_ids[0]
            == fresh.propose([req], [2]).result().draft_token_ids[0])


def test_greedy_steps_draft_what_the_model_path_drafts(spec_target, spec_draft, monkeypatch):
    """A plain-greedy draft's one-token steps run GreedyStep (VLLM_CPU_GREEDY_STEP=1, the
    default) and draft exactly what the steps through the model and the sampler draft (=0),
    over a batch, a rollback and a catch-up."""
    drafts, used = {}, {}
    for setting in ("1", "0"):
        monkeypatch.setenv("VLLM_CPU_GREEDY_STEP", setting)
        worker = make_proposer(spec_target, spec_draft)
        step, calls = worker.greedy_step, []
        assert step is not None
        worker.greedy_step = lambda *a: calls.append(1) or step(*a)
        reqs = [Request(f"r{i}", None, list(range(10 + i, 30 + 2 * i)),
                        SamplingParams(temperature=0.0), None) for i in range(3)]
        got = [worker.propose(reqs, [4, 2, 3]).result().draft_token_ids]
        worker.accept(reqs[0], 1)  # a rollback, and a catch-up of two tokens
        reqs[0].output_token_ids = got[0][0][:1] + [(got[0][0][1] + 1) % 400, 5]
        got.append(worker.propose(reqs, [3, 3, 3]).result().draft_token_ids)
        drafts[setting], used[setting] = got, len(calls)
    assert drafts["1"] == drafts["0"]
    assert used["0"] == 0 and used["1"] > 0


def test_a_greedy_proposal_is_one_native_call_timing_its_first_forward(spec_target, spec_draft):
    """A plain-greedy proposal whose requests draft the same k runs its k steps in one
    GreedyStep call, and its first forward's seconds are that call's first step (with the
    Python around the call): more than nothing, less than the whole proposal by the later
    steps' time (greedy_steps' step_ms); requests of different k take a call per group."""
    worker = make_proposer(spec_target, spec_draft)
    step, calls, step_ms = worker.greedy_step, [], []
    worker.greedy_step = lambda *a: calls.append(a[3]) or step_ms.append(a[5]) or step(*a)
    reqs = [Request(f"r{i}", None, list(range(10 + i, 30 + 2 * i)),
                    SamplingParams(temperature=0.0), None) for i in range(2)]
    proposal = worker.propose(reqs, [4, 4]).result()
    assert calls == [4]
    assert all(len(d) == 4 for d in proposal.draft_token_ids)
    first_step_s, later_s = step_ms[0][0].item() / 1e3, step_ms[0][1:].sum().item() / 1e3
    assert first_step_s > 0 and later_s > 0
    # the first step and the Python around the call; not its later steps
    assert first_step_s <= proposal.first_forward_seconds <= proposal.seconds - later_s
    calls.clear()
    step_ms.clear()
    worker.propose(reqs, [2, 5]).result()
    assert calls == [2, 3]
    assert step_ms[1] is None  # only the first call's steps are timed


def test_kept_block_table_follows_the_batch_and_its_blocks(spec_target, spec_draft):
    """The block table a greedy call reads is kept between proposals for the same sequences:
    it must equal a fresh table after a sequence gains a block, and after the batch changes
    (another order, a sequence fewer, a sequence freed and made again under its id)."""
    from vllm.worker.model_runner import block_tables_tensor
    worker = make_proposer(spec_target, spec_draft)
    reqs = [Request(f"r{i}", None, list(range(10 + i, 20 + 3 * i)),
                    SamplingParams(temperature=0.0), None) for i in range(3)]
    worker.propose(reqs, [2, 2, 2]).result()

    def check(ids):
        seqs = [worker.seqs[i] for i in ids]
        table = worker._block_table(seqs)
        assert table.tolist() == block_tables_tensor(seqs).tolist()
        return table

    first = check(["r0", "r1", "r2"])
    assert check(["r0", "r1", "r2"]) is first  # kept
    seq = worker.seqs["r1"]
    assert worker.block_manager.grow(seq.block_ids, len(seq.block_ids) * 16 + 1)
    assert check(["r0", "r1", "r2"]) is not first  # r1's new block read
    check(["r2", "r0", "r1"])
    check(["r0", "r2"])
    worker.free("r2")
    worker.propose([reqs[2]], [2]).result()  # r2 again: a new sequence and new blocks
    check(["r0", "r1", "r2"])
