"""Text made in the API server's process (StreamDetokenizer over token-id outputs, as the engine
core sends them) equals the text the engine makes itself, after every step: sampled outputs that
include byte tokens (incomplete UTF-8 held back), n > 1, and a request with stop strings (whose
text the core still makes)."""
from vllm import LLM, SamplingParams
from vllm.engine.stream_detokenizer import StreamDetokenizer

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Bonjour, ça va?"]


def params_list() -> list[SamplingParams]:
    return [SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=3, max_tokens=17, n=2, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=5, max_tokens=20, stop=["e", "a"],
                           ignore_eos=True)]


def run_steps(engine, stream: StreamDetokenizer = None) -> list[list[tuple]]:
    """Per step, each output's (request id, [(text, token ids, finish reason)])."""
    for i, (prompt, params) in enumerate(zip(PROMPTS, params_list())):
        engine.add_request(str(i), prompt, params)
        if stream is not None:
            stream.add(str(i), params)
    steps = []
    while engine.has_unfinished_requests():
        outs = engine.step()
        if stream is not None:
            for out in outs:
                stream.process(out)
        steps.append(sorted((o.request_id, [(c.text, list(c.token_ids), c.finish_reason,
                                             c.stop_reason) for c in o.outputs])
                            for o in outs))
    return steps


def test_stream_text_equals_engine_text(tiny_llama):
    llm = LLM(model=tiny_llama, max_model_len=128)
    engine = llm.llm_engine
    reference = run_steps(engine)
    engine.detokenize_all = False
    stream = StreamDetokenizer(engine.get_tokenizer())
    assert run_steps(engine, stream) == reference
    assert not stream._params and not stream._completions  # finished requests are forgotten
    texts = [c[0] for step in reference for _, cs in step for c in cs]
    assert any(t for t in texts)  # the test compares real text
    # without the stream detokenizer the core leaves text empty (but not for stop strings)
    last = {rid: cs for step in run_steps(engine) for rid, cs in step}
    assert all(c[0] == "" for c in last["0"] + last["1"])
    assert last["2"][0][0] == {rid: cs for step in reference for rid, cs in step}["2"][0][0]
