"""serve_sweep's rounds: the rounds of one (layout, config, clients) add up to one row whose
throughput is all tokens over all seconds, with counts summed and per-step figures weighted by
steps; a single round passes through."""
import pytest

from benchmarks.serve_sweep import combine_rounds


def row(config: str, round_: int, tok_s: float, seconds: float, prefill: int, decode: int,
        decode_ms: float) -> dict:
    return {"layout": "mp", "config": config, "concurrency": 64, "round": round_,
            "output_throughput": tok_s, "duration_s": seconds, "failed": 0,
            "tpot_ms_median": 10.0 + round_, "ttft_ms_mean": 100.0 * (round_ + 1),
            "cpu": {"engine core (7)": {"cpu_s": 2.0, "cores": [0, 1]}},
            "spec_decode": {"num_emitted_tokens": 300, "num_spec_steps": 100} if config != "plain"
            else {},
            "engine_steps": {"schedule_ms": 0.1 * (round_ + 1), "prefill_steps": prefill,
                             "decode_steps": decode, "prefill_step_ms": 20.0,
                             "decode_step_ms": decode_ms, "engine_ttft_ms": 40.0},
            "tau": 3.0 if config != "plain" else None}


def test_rounds_add_up_to_tokens_over_seconds():
    rows = [row("plain", 0, 4000.0, 4.0, 100, 300, 7.0), row("goodput", 0, 3000.0, 5.0, 100,
                                                              100, 9.0),
            row("goodput", 1, 4000.0, 3.0, 100, 300, 11.0), row("plain", 1, 3000.0, 6.0, 100,
                                                                100, 8.0)]
    plain, goodput = combine_rounds(rows)
    assert (plain["config"], goodput["config"]) == ("plain", "goodput")
    assert plain["output_throughput"] == pytest.approx((16000 + 18000) / 10.0)
    assert goodput["output_throughput"] == pytest.approx((15000 + 12000) / 8.0)
    assert goodput["round_throughputs"] == [3000.0, 4000.0] and goodput["duration_s"] == 8.0
    assert goodput["spec_decode"] == {"num_emitted_tokens": 600, "num_spec_steps": 200}
    assert goodput["tau"] == 3.0 and goodput["cpu"]["engine core (7)"]["cpu_s"] == 4.0
    steps = goodput["engine_steps"]
    assert (steps["prefill_steps"], steps["decode_steps"]) == (200, 400)
    assert steps["decode_step_ms"] == pytest.approx((9.0 * 100 + 11.0 * 300) / 400)
    assert steps["schedule_ms"] == pytest.approx((0.1 * 200 + 0.2 * 400) / 600)
    assert goodput["ttft_ms_mean"] == 150.0


def test_one_round_passes_through():
    r = row("plain", 0, 4000.0, 4.0, 10, 30, 7.0)
    (out,) = combine_rounds([r])
    assert out == dict(r, round_throughputs=[4000.0])
