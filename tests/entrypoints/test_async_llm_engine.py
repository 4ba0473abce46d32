"""AsyncLLMEngine in-process on the tiny Llama: growing outputs per step, equality with the
offline engine, bad requests failing alone, abort freeing KV blocks, and the waiting limit."""
import asyncio

import pytest

from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine, EngineOverloadedError
from vllm.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm_engine(tiny_llama):
    return LLMEngine.from_engine_args(EngineArgs(model=tiny_llama, dtype="float32",
                                                 device="cpu", max_num_seqs=4))


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def collect(engine, prompt, params, rid):
    outs = [o async for o in engine.generate(prompt, params, rid)]
    return outs


def offline_text(llm_engine, prompt, params):
    llm_engine.add_request("offline", prompt, params)
    while llm_engine.has_unfinished_requests():
        for out in llm_engine.step():
            if out.finished:
                return out.outputs[0].text


def test_outputs_grow_and_match_offline(llm_engine):
    engine = AsyncLLMEngine(llm_engine)

    async def main():
        try:
            return await asyncio.gather(*(collect(engine, p, GREEDY, f"r{i}")
                                          for i, p in enumerate(["The quick", "import", "Once"])))
        finally:
            await engine.shutdown()

    results = run(main())
    for prompt, outs in zip(["The quick", "import", "Once"], results):
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        assert lengths == sorted(lengths) and lengths[-1] == 12
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert outs[-1].outputs[0].text == offline_text(llm_engine, prompt, GREEDY)


def test_bad_request_fails_alone_and_abort_frees_kv(llm_engine):
    engine = AsyncLLMEngine(llm_engine)
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def main():
        try:
            good = asyncio.ensure_future(collect(engine, "The quick", GREEDY, "good"))
            with pytest.raises(ValueError, match="empty prompt"):
                await collect(engine, {"prompt_token_ids": []}, GREEDY, "bad")
            stream = engine.generate("The", long, "aborted")
            first = await stream.__anext__()
            assert not first.finished and llm_engine.block_manager.usage > 0
            engine.abort("aborted")
            rest = [o async for o in stream]  # the stream ends without a finished output
            assert all(not o.finished for o in rest)
            outs = await good
            for _ in range(100):
                if not llm_engine.has_unfinished_requests():
                    break
                await asyncio.sleep(0.01)
            return outs
        finally:
            await engine.shutdown()

    outs = run(main())
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 12
    assert llm_engine.block_manager.usage == 0 and not llm_engine.has_unfinished_requests()
    assert engine.counters.finished["abort"] == 1


def test_waiting_limit(llm_engine):
    engine = AsyncLLMEngine(llm_engine, max_waiting_requests=2)
    long = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)

    async def main():
        try:
            # queued in one go, before the loop can admit any: two wait, the third is refused
            streams = [engine.generate("The", long, f"r{i}") for i in range(3)]
            tasks = [asyncio.ensure_future(s.__anext__()) for s in streams]
            done = await asyncio.gather(*tasks, return_exceptions=True)
            for s in streams:
                await s.aclose()
            return done
        finally:
            await engine.shutdown()

    done = run(main())
    assert [isinstance(d, EngineOverloadedError) for d in done] == [False, False, True]
    # shutdown aborted what was still queued or running
    assert llm_engine.block_manager.usage == 0 and not llm_engine.has_unfinished_requests()


def test_request_failed_mid_stream_and_add_fault_fail_alone(llm_engine, monkeypatch):
    """A request the engine fails after its stream started raises RequestFailedError naming it
    (the server reports it in-band); an add_request fault that is not a ValueError fails that
    request alone; the loop keeps serving the others."""
    from vllm.engine.async_llm_engine import RequestFailedError
    engine = AsyncLLMEngine(llm_engine)
    decode = llm_engine.detokenizer.decode_new_tokens

    def faulty_decode(req, new_ids):
        if req.group_id == "doomed" and len(req.output_token_ids) == 4:
            raise RuntimeError("injected")
        return decode(req, new_ids)

    monkeypatch.setattr(llm_engine.detokenizer, "decode_new_tokens", faulty_decode)
    add = llm_engine.add_request

    def faulty_add(request_id, *args, **kwargs):
        if request_id == "bad-add":
            raise KeyError("injected add fault")
        return add(request_id, *args, **kwargs)

    monkeypatch.setattr(llm_engine, "add_request", faulty_add)

    async def main():
        try:
            good = asyncio.ensure_future(collect(engine, "The quick", GREEDY, "good"))
            seen = []
            with pytest.raises(RequestFailedError, match="request doomed failed.*injected"):
                async for out in engine.generate("import", GREEDY, "doomed"):
                    seen.append(len(out.outputs[0].token_ids))
            with pytest.raises(RequestFailedError, match="request bad-add failed.*KeyError"):
                await collect(engine, "import", GREEDY, "bad-add")
            return seen, await good, await collect(engine, "Once", GREEDY, "later")
        finally:
            await engine.shutdown()

    seen, good, later = run(main())
    assert seen and max(seen) == 3  # outputs came before the fault
    assert good[-1].outputs[0].text == offline_text(llm_engine, "The quick", GREEDY)
    assert later[-1].finished and engine.dead_error is None
    assert llm_engine.block_manager.usage == 0 and not llm_engine.groups
