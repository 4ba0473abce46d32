"""/metrics from an engine's stats: the spec-decode counters, the drafter's fault counters and
the goodput controller's estimates appear under vLLM-style names with the values given."""
from prometheus_client.parser import text_string_to_metric_families

from vllm.engine.engine_client import EngineClient, EngineStats
from vllm.entrypoints.openai.metrics import ServerMetrics


class FakeEngine(EngineClient):
    def __init__(self, spec: dict) -> None:
        super().__init__(max_model_len=64, max_num_seqs=4, max_waiting_requests=None)
        self.spec = spec

    def stats(self) -> EngineStats:
        return EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.25,
                           spec_decode=self.spec)


def samples(engine: EngineClient) -> dict[str, float]:
    text = ServerMetrics(engine, "m").render().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_spec_decode_controller_and_drafter_metrics():
    spec = {"acceptance_rate": 0.5, "system_efficiency": 0.4, "mean_accepted_length": 2.5,
            "num_draft_tokens": 40, "num_accepted_tokens": 20, "num_emitted_tokens": 30,
            "drafter_num_restarts": 1, "drafter_num_failures": 2, "controller_k": 3,
            "controller_acceptance": 0.55, "controller_modelled_speedup": 1.7,
            "controller_draft_forward_ms": 1.5, "controller_plain_step_ms": 6.0,
            "controller_num_probes": 4, "controller_num_split_steps": 7,
            "controller_ahead_wait_ms": 0.2, "controller_num_ahead_used": 9,
            "controller_num_ahead_missed": 5, "controller_k_steps": [10, 0, 2, 5]}
    got = samples(FakeEngine(spec))
    assert got["vllm:num_requests_running"] == 3 and got["vllm:num_requests_waiting"] == 2
    assert got["vllm:kv_cache_usage_perc"] == 0.25
    assert got["vllm:spec_decode_num_draft_tokens_total"] == 40
    assert got["vllm:spec_decode_drafter_num_failures_total"] == 2
    assert got["vllm:spec_decode_drafter_num_restarts_total"] == 1
    assert got["vllm:spec_decode_controller_k"] == 3
    assert got["vllm:spec_decode_controller_modelled_speedup"] == 1.7
    assert got["vllm:spec_decode_controller_plain_step_ms"] == 6.0
    assert got["vllm:spec_decode_controller_num_probes_total"] == 4
    assert got["vllm:spec_decode_controller_num_split_steps_total"] == 7
    assert got["vllm:spec_decode_controller_ahead_wait_ms"] == 0.2
    assert got["vllm:spec_decode_controller_num_ahead_used_total"] == 9
    assert got["vllm:spec_decode_controller_num_ahead_missed_total"] == 5
    text = ServerMetrics(FakeEngine(spec), "m").render().decode()
    by_k = {s.labels["k"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "vllm:spec_decode_controller_steps_total"}
    assert by_k == {"0": 10, "1": 0, "2": 2, "3": 5}


def test_no_spec_decode_metrics_without_a_draft():
    got = samples(FakeEngine(None))
    assert not [name for name in got if name.startswith("vllm:spec_decode")]
