"""A request's speculative-decoding counts in its RequestOutput.metrics: with the draft equal to
the target every token after the prompt's comes from a verification, so the emitted count is
exact, added up over the children of an n > 1 request; each output holds a snapshot."""
from vllm import LLM, SamplingParams

MAX_TOKENS = 12


def test_spec_counts_per_request_and_added_up_over_children(spec_target):
    llm = LLM(spec_target, dtype="float32", device="cpu", speculative_model=spec_target,
              speculative_adaptive="off", num_speculative_tokens=3, cpu_draft_worker=True,
              speculative_draft_dtype="float32")
    engine = llm.llm_engine
    for n in (1, 2):
        params = SamplingParams(n=n, temperature=0.8, seed=7, max_tokens=MAX_TOKENS,
                                ignore_eos=True)
        engine.add_request(f"r{n}", "def fibonacci(n):", params)
        outputs = []
        while engine.has_unfinished_requests():
            outputs += [o for o in engine.step() if o.request_id == f"r{n}"]
        final = outputs[-1].metrics["spec_decode"]
        # the first token comes from the prompt's step; all later ones from verifications
        assert final["num_emitted_tokens"] == n * (MAX_TOKENS - 1)
        assert final["acceptance_rate"] == 1.0
        # each verification emits its accepted drafts and one target token, unless max_tokens
        # cuts it inside the drafts (then it emits accepted drafts only)
        assert (final["num_draft_tokens"] >= final["num_accepted_tokens"]
                >= final["num_emitted_tokens"] - final["num_spec_steps"])
        first = next(o.metrics["spec_decode"] for o in outputs if "spec_decode" in o.metrics)
        assert first["num_emitted_tokens"] < final["num_emitted_tokens"]  # not the live counts
