"""/metrics: Prometheus text with vLLM's metric names. Gauges and counters are read from the
engine when scraped; the latency histograms are observed by AsyncLLMEngine as requests go."""
from typing import Iterator, Optional

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vllm.engine.engine_client import EngineClient

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                    160.0, 320.0)


class _EngineCollector(Collector):

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.engine = engine
        self.labels = {"model_name": model_name}

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=list(self.labels))
        c.add_metric(list(self.labels.values()), value)
        return c

    def collect(self) -> Iterator[Metric]:
        eng = self.engine
        stats = eng.stats()
        yield self._gauge("vllm:num_requests_running", "requests in the running batch",
                          stats.num_running)
        yield self._gauge("vllm:num_requests_waiting", "requests waiting for a slot",
                          stats.num_waiting)
        yield self._gauge("vllm:gpu_cache_usage_perc", "fraction of KV cache blocks in use "
                          "(1 = full), whichever device holds the cache", stats.kv_cache_usage)
        yield self._gauge("vllm:kv_cache_usage_perc", "fraction of KV cache blocks in use",
                          stats.kv_cache_usage)
        yield self._counter("vllm:prompt_tokens", "prompt tokens prefilled",
                            eng.counters.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "tokens generated",
                            eng.counters.generation_tokens)
        done = CounterMetricFamily("vllm:request_success", "finished requests by reason",
                                   labels=[*self.labels, "finished_reason"])
        for reason in ("stop", "length", "abort"):
            done.add_metric([*self.labels.values(), reason], eng.counters.finished[reason])
        yield done
        yield from self._step_times(stats.step_times)
        m = stats.spec_decode
        if m is not None:
            yield self._gauge("vllm:spec_decode_draft_acceptance_rate",
                              "accepted / drafted tokens", m["acceptance_rate"])
            yield self._gauge("vllm:spec_decode_efficiency", "emitted tokens / (k + 1) per "
                              "verification step", m["system_efficiency"])
            yield self._gauge("vllm:spec_decode_mean_accepted_length", "tokens emitted per "
                              "target forward", m["mean_accepted_length"])
            for key, doc in (("num_draft_tokens", "tokens drafted"),
                             ("num_accepted_tokens", "drafted tokens accepted"),
                             ("num_emitted_tokens", "tokens emitted by verification steps"),
                             ("num_spec_steps", "sequence-steps that verified drafts"),
                             ("num_verify_forwards", "batched target forwards that verified "
                              "drafts"),
                             ("draft_time_s", "seconds spent drafting"),
                             ("verify_time_s", "seconds spent in verification forwards"),
                             ("drafter_num_restarts", "draft processes restarted after a "
                              "fault"),
                             ("drafter_num_failures", "draft process faults (died, stalled "
                              "past the timeout, or raised)")):
                if key in m:
                    name = key.replace("_time_s", "_time_seconds")
                    yield self._counter(f"vllm:spec_decode_{name}", doc, m[key])
            for key, doc in (("controller_k", "drafts per request the goodput controller chose "
                              "for the last step (0: plain decoding)"),
                             ("controller_acceptance", "the controller's acceptance estimate"),
                             ("controller_modelled_speedup", "modelled tokens/s of the chosen k "
                              "over plain decoding"),
                             ("controller_draft_forward_ms", "measured ms of a draft forward "
                              "(batch 1)"),
                             ("controller_proposal_fixed_ms", "measured ms of a proposal "
                              "beyond its later forwards: messages, waking, the first forward "
                              "(batch 1)"),
                             ("controller_plain_step_ms", "measured ms of a plain step "
                              "(batch 1)"),
                             ("controller_ahead_wait_ms", "measured ms of a proposal whose "
                              "drafts were made ahead (batch 1)")):
                if key in m:
                    yield self._gauge(f"vllm:spec_decode_{key}", doc, m[key])
            for key, doc in (("controller_num_probes", "one-draft probes the controller took"),
                             ("controller_num_split_steps", "steps the controller split (batched "
                              "overlap)"),
                             ("controller_num_vetoed", "steps the realized-goodput guard kept "
                              "plain where speculation measured slower than plain decoding"),
                             ("controller_num_measuring_plain", "steps the realized-goodput "
                              "guard kept plain to measure plain decoding"),
                             ("controller_num_ahead_used", "requests whose drafts were all "
                              "accepted in a step that drafted ahead and whose bonus token "
                              "was the draft's guess (the drafts made ahead were usable)"),
                             ("controller_num_ahead_missed", "requests whose drafts were all "
                              "accepted in a step that drafted ahead, but the bonus token was "
                              "not the draft's guess")):
                if key in m:
                    yield self._counter(f"vllm:spec_decode_{key}", doc, m[key])
            if "controller_k_steps" in m:
                steps = CounterMetricFamily("vllm:spec_decode_controller_steps", "steps by the "
                                            "drafts per request the controller chose (0: plain "
                                            "decoding)", labels=[*self.labels, "k"])
                for k, count in enumerate(m["controller_k_steps"]):
                    steps.add_metric([*self.labels.values(), str(k)], count)
                yield steps


    def _step_times(self, t: Optional[dict]) -> Iterator[Metric]:
        """The engine's StepTimer: seconds per step phase and per step kind."""
        if t is None:
            return
        names, values = list(self.labels), list(self.labels.values())
        phases = CounterMetricFamily("vllm:engine_step_phase_seconds", "seconds the engine "
                                     "spent in each phase of its steps", labels=[*names, "phase"])
        for phase, seconds in t["phase_s"].items():
            phases.add_metric([*values, phase], seconds)
        yield phases
        steps = CounterMetricFamily("vllm:engine_steps", "engine steps by kind (prefill: a "
                                    "prompt is in the step)", labels=[*names, "kind"])
        step_s = CounterMetricFamily("vllm:engine_step_seconds", "seconds of engine steps by "
                                     "kind", labels=[*names, "kind"])
        for kind in t["steps"]:
            steps.add_metric([*values, kind], t["steps"][kind])
            step_s.add_metric([*values, kind], t["step_s"][kind])
        yield steps
        yield step_s
        yield self._counter("vllm:engine_first_token_seconds", "sum over requests of the time "
                            "from the engine receiving one to its first token",
                            t["first_token_s"])
        yield self._counter("vllm:engine_first_tokens", "requests that got their first token",
                            t["num_first_tokens"])


class ServerMetrics:
    """The server's registry; hooks itself into the engine as its stats sink."""

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        self._ttft = Histogram("vllm:time_to_first_token_seconds",
                               "time from request arrival to its first token",
                               ["model_name"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self._e2e = Histogram("vllm:e2e_request_latency_seconds",
                              "time from request arrival to its last token", ["model_name"],
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self._ttft_child = self._ttft.labels(model_name)
        self._e2e_child = self._e2e.labels(model_name)
        engine.stats_sink = self

    def observe_first_token(self, seconds: float) -> None:
        self._ttft_child.observe(seconds)

    def observe_finished(self, e2e_seconds: float, finish_reason: Optional[str]) -> None:
        self._e2e_child.observe(e2e_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
