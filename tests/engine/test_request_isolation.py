"""A fault while handling one request fails that request alone, inside LLMEngine: a tokenizer
raising any exception (ValueError at add_request), non-finite probabilities in one sampling row,
a detokenizer or logprob fault, a failed forward (the step's requests fail, later ones are
served), and a proposer raising (the step runs without speculation: outputs equal plain
decoding). Every case checks the other requests' outputs against a clean run."""
import pytest

from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine

PROMPTS = ["The quick brown fox", "def fibonacci(n):", "Once upon a time"]


def greedy(n=12):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine.from_engine_args(EngineArgs(model=tiny_llama, dtype="float32",
                                                 device="cpu", max_num_seqs=8))


def run(engine, requests):
    """requests: id -> (prompt, params). Returns id -> final RequestOutput."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    finals = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert not engine.has_unfinished_requests() and engine.block_manager.usage == 0
    assert not engine.groups
    return finals


def token_ids(finals):
    return {rid: [o.token_ids for o in out.outputs] for rid, out in finals.items()}


@pytest.fixture(scope="module")
def reference(engine):
    return token_ids(run(engine, {f"ref{i}": (p, greedy()) for i, p in enumerate(PROMPTS)}))


def good_requests():
    return {f"ref{i}": (p, greedy()) for i, p in enumerate(PROMPTS)}


def assert_good_unchanged(finals, reference):
    for rid in reference:
        assert finals[rid].error is None
        assert token_ids({rid: finals[rid]}) == {rid: reference[rid]}


def test_tokenizer_exception_is_value_error(engine, monkeypatch):
    # a lone surrogate makes the fast tokenizer raise TypeError, not ValueError
    with pytest.raises(ValueError, match="tokenizer rejected the prompt.*TypeError"):
        engine.add_request("surrogate", "abc \ud800 def", greedy())
    with pytest.raises(ValueError, match="must be a string"):
        engine.add_request("not-text", {"prompt": 5}, greedy())

    def panic(*_, **__):
        raise RuntimeError("tokenizer panicked")

    monkeypatch.setattr(engine.tokenizer, "encode", panic)
    with pytest.raises(ValueError, match="RuntimeError: tokenizer panicked"):
        engine.add_request("panic", "hello", greedy())
    monkeypatch.undo()
    assert not engine.groups and not engine.has_unfinished_requests()


def test_max_logprobs(engine):
    assert engine.config.model_config.max_logprobs == 20
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"{field}=21 is more than max_logprobs=20"):
            engine.add_request("many", "hello", SamplingParams(**{field: 21}))
    assert not engine.groups


def test_nonfinite_sampling_row_fails_alone(engine, reference):
    # a repetition penalty that is 0 in fp32 divides the prompt's positive logits to +inf: the
    # row's probabilities are NaN
    nan_params = SamplingParams(temperature=1.0, repetition_penalty=1e-46, max_tokens=8)
    finals = run(engine, {**good_requests(), "nan": ("The quick brown fox", nan_params),
                          "nan-greedy": ("import torch", SamplingParams(
                              temperature=0.0, repetition_penalty=1e-46, max_tokens=8))})
    for rid in ("nan", "nan-greedy"):
        assert "not finite" in finals[rid].error
        assert finals[rid].outputs[0].finish_reason == "error"
        assert finals[rid].outputs[0].token_ids == []
    assert_good_unchanged(finals, reference)
    assert token_ids(run(engine, good_requests())) == reference  # and it goes on serving


def test_detokenizer_and_logprob_faults_fail_alone(engine, reference, monkeypatch):
    decode = engine.detokenizer.decode_new_tokens

    def faulty_decode(req, new_ids):
        if req.group_id == "bad-text" and len(req.output_token_ids) == 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return decode(req, new_ids)

    entry = engine._logprob_entry

    def faulty_entry(ids, lps, rank, num):
        if num == 3:  # only the request that asked for 3 logprobs
            raise KeyError("injected")
        return entry(ids, lps, rank, num)

    monkeypatch.setattr(engine.detokenizer, "decode_new_tokens", faulty_decode)
    monkeypatch.setattr(engine, "_logprob_entry", faulty_entry)
    n2 = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, n=2)
    lp3 = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    finals = run(engine, {**good_requests(), "bad-text": ("import torch", n2),
                          "bad-logprobs": ("import torch", lp3)})
    assert "UnicodeDecodeError" in finals["bad-text"].error
    # both children of the n=2 request are finished with the error
    assert [o.finish_reason for o in finals["bad-text"].outputs] == ["error", "error"]
    assert "KeyError" in finals["bad-logprobs"].error
    assert_good_unchanged(finals, reference)


def test_failed_forward_fails_its_step_then_serves(engine, reference, monkeypatch):
    execute = engine.worker.execute_model
    calls = {"n": 0}

    def faulty_execute(out, before_sync=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected forward fault")
        return execute(out, before_sync)

    monkeypatch.setattr(engine.worker, "execute_model", faulty_execute)
    finals = run(engine, good_requests())
    assert all("injected forward fault" in f.error for f in finals.values())
    assert all(f.finished for f in finals.values())
    monkeypatch.undo()
    assert token_ids(run(engine, good_requests())) == reference


class FlakyProposer:
    """Wraps a proposer; raises in propose() on every other call, and in accept() once."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0
        self.raised = 0
        self.accept_raised = False

    def propose(self, requests, max_num_drafts):
        self.calls += 1
        if self.calls % 2 == 0:
            self.raised += 1
            raise RuntimeError("injected drafter fault")
        return self.inner.propose(requests, max_num_drafts)

    def propose_ahead(self):
        return self.inner.propose_ahead()

    def accept(self, req, num_accepted):
        if not self.accept_raised:
            self.accept_raised = True
            raise RuntimeError("injected accept fault")
        return self.inner.accept(req, num_accepted)

    def free(self, req_id):
        return self.inner.free(req_id)


@pytest.mark.parametrize("draft", ["[ngram]", "self"])
def test_raising_proposer_equals_plain_decoding(tiny_llama, reference, draft):
    model = tiny_llama if draft == "self" else draft
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=tiny_llama, dtype="float32", device="cpu", speculative_model=model,
        num_speculative_tokens=3, cpu_draft_worker=True, speculative_draft_dtype="float32",
        speculative_adaptive="off"))
    flaky = engine.proposer = FlakyProposer(engine.proposer)
    finals = run(engine, good_requests())
    assert token_ids(finals) == reference
    assert flaky.raised >= 2 and flaky.accept_raised
    assert all(f.error is None for f in finals.values())
    if draft == "self":  # the steps that did speculate drafted and were all accepted
        assert engine.spec_metrics.num_draft_tokens > 0
        assert engine.spec_metrics.acceptance_rate == 1.0
