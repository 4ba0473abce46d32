"""The engine's StepTimer counts every step it runs by kind and puts each step's time in one of
its phases; /metrics carries the same numbers."""
from prometheus_client.parser import text_string_to_metric_families

from vllm import LLM, SamplingParams
from vllm.engine.engine_client import EngineClient
from vllm.engine.step_timer import PHASES, per_step_ms
from vllm.entrypoints.openai.metrics import ServerMetrics


def test_step_counts_and_phases(tiny_llama):
    llm = LLM(model=tiny_llama, max_model_len=128)
    engine = llm.llm_engine
    before = engine.step_timer.as_dict()
    prompts = ["one two three", "four five six seven eight nine"]
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    after = engine.step_timer.as_dict()
    # both prompts prefill in one step, then 6 decode steps give the other 6 tokens each
    assert after["steps"]["prefill"] - before["steps"]["prefill"] == 1
    assert after["steps"]["decode"] - before["steps"]["decode"] == 6
    assert after["num_first_tokens"] - before["num_first_tokens"] == 2
    phases = sum(after["phase_s"][p] - before["phase_s"][p] for p in PHASES)
    steps = sum(after["step_s"][k] - before["step_s"][k] for k in after["step_s"])
    assert 0 < phases <= steps * 1.0001  # every phase lies inside a step (no core_io offline)
    assert after["phase_s"]["execute"] > before["phase_s"]["execute"]
    ms = per_step_ms(before, after)
    assert ms["decode_steps"] == 6 and ms["prefill_steps"] == 1
    assert ms["engine_ttft_ms"] > 0

    class Client(EngineClient):
        def stats(self):
            return engine.stats()

    text = ServerMetrics(Client(128, 4, None), "m").render().decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(text) for s in f.samples}
    label = (("kind", "decode"), ("model_name", "m"))
    assert got[("vllm:engine_steps_total", label)] == after["steps"]["decode"]
    assert got[("vllm:engine_step_seconds_total", label)] == after["step_s"]["decode"]
    execute = (("model_name", "m"), ("phase", "execute"))
    assert got[("vllm:engine_step_phase_seconds_total", execute)] == after["phase_s"]["execute"]
    assert got[("vllm:engine_first_tokens_total", (("model_name", "m"),))] == 2 + before[
        "num_first_tokens"]
