"""Each benchmark runs end to end on a tiny model (one iteration) and writes its JSON."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], check=True,
                   cwd=ROOT, timeout=600, capture_output=True)


def test_benchmark_kernels(tmp_path):
    out = tmp_path / "k.json"
    run("benchmark_kernels.py", "--device", "cpu", "--quick", "--iters", "2",
        "--output-json", str(out))
    rows = json.loads(out.read_text())["runs"][0]["rows"]
    assert {r["op"] for r in rows} >= {"rms_norm", "paged_attention decode"}
    assert all(r["kernel_ms"]["median"] > 0 and r["floor_ms"] > 0 for r in rows)


def test_benchmark_latency(tmp_path, tiny_llama):
    out = tmp_path / "l.json"
    run("benchmark_latency.py", "--model", tiny_llama, "--device", "cpu", "--dtype", "float32",
        "--batch-size", "2", "--input-len", "8", "--output-len", "4", "--num-iters", "1",
        "--num-iters-warmup", "0", "--output-json", str(out))
    result = json.loads(out.read_text())
    assert result["engine"]["avg_latency"] > 0 and len(result["engine"]["latencies"]) == 1
    assert set(result["engine"]["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
    # vLLM's top-level keys, the engine's figures
    for key in ("avg_latency", "latencies", "percentiles"):
        assert result[key] == result["engine"][key]
    from benchmarks.timing import source_fingerprint
    assert result["provenance"]["source_sha256"] == source_fingerprint()  # the code that ran


def test_latency_decode_ms_is_nan_when_noise_hides_it():
    """decode ms = (full run - prefill-only run) / (tokens - 1); a prefill-only run as slow as
    the full one gives no figure (nan), not a negative one."""
    from types import SimpleNamespace

    from benchmarks.benchmark_latency import summarize
    args = SimpleNamespace(batch_size=2, n=1, output_len=11)
    assert summarize([1.0, 1.2], [0.1, 0.1], args)["decode_step_ms"] == pytest.approx(100.0)
    assert math.isnan(summarize([1.0, 1.0], [1.1, 1.3], args)["decode_step_ms"])


def test_benchmark_spec_decode(tmp_path, tiny_llama):
    """Every proposer row equals plain decoding; the transformers rows (plain and assisted with
    the draft on the CPU) generate the engine's greedy tokens; the floors are measured."""
    out = tmp_path / "s.json"
    run("benchmark_spec_decode.py", "--model", tiny_llama, "--speculative-model", tiny_llama,
        "--cpu-draft-worker", "--device", "cpu", "--dtype", "float32", "--ks", "2",
        "--proposers", "draft,ngram", "--num-prompts", "2", "--batch-size", "1",
        "--max-tokens", "8", "--hf-baseline", "--hf-k", "2", "--output-json", str(out))
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["proposer"], r["k"]) for r in rows] == [("none", 0), ("draft-cpu", 2),
                                                       ("ngram", 2)]
    assert all(r["identical_to_plain"] for r in rows[1:])
    # draft == target (8 tokens: 1 + 3 + 3 + 1)
    assert rows[1]["acceptance_rate"] == 1.0 and rows[1]["tau"] > 2
    assert result["floors"]["target_step_floor_ms"] > 0
    assert result["floors"]["draft_forward_floor_ms"] > 0
    hf = result["hf_transformers"]
    assert [r["mode"] for r in hf] == ["plain", "assisted, CPU draft, k=2"]
    assert all(r["agreement_with_engine"] == 1.0 for r in hf)


def test_benchmark_spec_decode_ngram_only(tmp_path, tiny_llama):
    out = tmp_path / "s.json"
    run("benchmark_spec_decode.py", "--model", tiny_llama, "--speculative-model", "[ngram]",
        "--device", "cpu", "--dtype", "float32", "--ks", "2", "--num-prompts", "2",
        "--max-tokens", "8", "--adaptive", "--control-k", "1", "--rounds", "2",
        "--output-json", str(out))
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["proposer"], r["k"]) for r in rows] == [("none", 0), ("ngram", 2),
                                                       ("ngram+goodput", 2),
                                                       ("ngram (again)", 1)]
    assert all(r["identical_to_plain"] for r in rows[1:])
    # its trace holds one entry per decode step it tallied, k as chosen
    trace = rows[2]["controller"]["trace"]
    assert len(trace) == sum(t["steps"] for t in rows[2]["controller"]["by_k"].values())
    assert all(0 <= t["k"] <= 2 and t["step_s"] > 0 for t in trace)
    # two rounds: every row generated its 2 prompts x 8 tokens twice, its steps added up
    assert result["rounds"] == 2 and rows[0]["rounds"] == 2
    assert rows[0]["tokens_per_s"] * rows[0]["seconds"] == pytest.approx(2 * 2 * 8)
    assert all(r["engine_steps"]["prefill_steps"] == 2 for r in rows)  # both prompts in one
    # the controller's row tallies its decode steps by k: as many as it chose (decode steps)
    by_k = rows[2]["controller"]["by_k"]
    assert by_k and all(t["steps"] > 0 and t["step_ms"] > 0 for t in by_k.values())
    assert sum(t["steps"] for t in by_k.values()) <= sum(rows[2]["controller"]["k_histogram"])


def test_benchmark_throughput(tmp_path, tiny_llama):
    out = tmp_path / "t.json"
    run("benchmark_throughput.py", "--model", tiny_llama, "--device", "cpu", "--dtype",
        "float32", "--num-prompts", "6", "--input-len", "8", "--output-len", "5",
        "--output-json", str(out))
    result = json.loads(out.read_text())
    assert result["num_requests"] == 6 and result["num_output_tokens"] == 30


def test_benchmark_serving(tmp_path, tiny_llama):
    from tests.entrypoints.utils import RemoteServer

    server = RemoteServer(tiny_llama, [])
    try:
        out = tmp_path / "s.json"
        run("benchmark_serving.py", "--base-url", server.base_url, "--model",
            server.served_name, "--num-prompts", "6", "--request-rate", "20", "--input-len", "8",
            "--output-len", "32", "--vocab-size", "300", "--output-json", str(out))
        result = json.loads(out.read_text())
        assert result["completed"] == 6 and result["failed"] == 0
        # every token counted (ignore_eos), from the stream's usage chunk
        assert round(result["output_throughput"] * result["duration_s"]) == 6 * 32
        # a slow reader gets the tokens made meanwhile in one chunk (the outputs are cumulative):
        # at 6 tokens a request, a loaded 2-core CI machine once got every request's whole
        # output in one chunk, so no inter-token gap; 32 leave the engine's steps room
        assert result["ttft_ms"]["50"] > 0 and result["itl_ms"]["50"] is not None
        assert result["tpot_ms"]["50"] > 0
    finally:
        server.stop()


def test_benchmark_draft(tmp_path, tiny_llama):
    out = tmp_path / "d.json"
    run("benchmark_draft.py", "--model", tiny_llama, "--dtypes", "float32", "--threads", "1",
        "--context", "16", "--num-forwards", "6", "--warmup", "2", "--output-json", str(out))
    rows = json.loads(out.read_text())["rows"]
    # both CPU decode paths by default: the fused one and the per-op reference
    assert sorted((r["dtype"], r["threads"], r["path"]) for r in rows) == [
        ("float32", 1, "fused"), ("float32", 1, "native")]
    for row in rows:
        assert 0 < row["min"] <= row["ms_per_forward"] and row["floor_ms"] > 0


def test_benchmark_draft_settings_in_turns(tmp_path, tiny_llama, capsys):
    """--settings: each setting a row of its own (labelled in the path), the forwards of the
    settings and the batch sizes taken in turns (a row each, batch-major); a malformed setting
    and a batch size named twice are refused by name."""
    out = tmp_path / "d.json"
    run("benchmark_draft.py", "--model", tiny_llama, "--dtypes", "bfloat16", "--threads", "1",
        "--context", "16", "--num-forwards", "6", "--warmup", "2", "--paths", "fused",
        "--batch-sizes", "1,2",
        "--settings", "team:VLLM_CPU_DECODE_TEAM=1;VLLM_CPU_DECODE_TEAM=0,"
        "VLLM_CPU_DECODE_SPLIT_ELEMS=0", "--output-json", str(out))
    rows = json.loads(out.read_text())["rows"]
    other = "fused VLLM_CPU_DECODE_TEAM=0,VLLM_CPU_DECODE_SPLIT_ELEMS=0"
    assert [(r["batch_size"], r["path"]) for r in rows] == [
        (1, "fused team"), (1, other), (2, "fused team"), (2, other)]
    for row in rows:
        assert 0 < row["min"] <= row["ms_per_forward"] and row["stage_ms"]["attention"] > 0
    from benchmarks.benchmark_draft import parse_settings
    assert parse_settings("default;A=1,B=2;b:A=3") == [
        ("default", {}), ("A=1,B=2", {"A": "1", "B": "2"}), ("b", {"A": "3"})]
    with pytest.raises(ValueError, match="expected VAR=value, got 'TEAM'"):
        parse_settings("TEAM")
    # the batch sizes take turns, each with its own sequences: a size twice is refused
    from benchmarks.benchmark_draft import make_parser
    args = make_parser().parse_args(["--model", "m", "--batch-sizes", "8,1"])
    assert args.batch_sizes == [8, 1]
    for bad in ("1,1", "0,8"):
        with pytest.raises(SystemExit):
            make_parser().parse_args(["--model", "m", "--batch-sizes", bad])
        assert f"expected distinct positive sizes, got '{bad}'" in capsys.readouterr().err


def test_time_forwards_alternates_settings(monkeypatch):
    """time_forwards runs the batch sizes and the settings in turns (batch-major, every other
    cycle of the turns reversed; turn_block 0: forward by forward), each batch its own
    sequences, each forward's stages on its turn's clock, a
    variable named by one setting alone unset again for the others', and leaves the environment
    and the draft's sequences as it found them."""
    import types
    from benchmarks import benchmark_draft as bd
    seen = []

    class Runner:
        def prepare_inputs(self):
            pass

    class Draft:
        config = types.SimpleNamespace(hf_config=types.SimpleNamespace(vocab_size=10))
        block_manager = types.SimpleNamespace(grow=lambda ids, n: True)

        def __init__(self):
            self.seqs = {}
            self.runner = Runner()

        def propose(self, reqs, ks):
            for r in reqs:
                self.seqs[r.req_id] = types.SimpleNamespace(block_ids=[])
            return types.SimpleNamespace(result=lambda: None)

        def _draft(self, reqs, ks):
            assert ks == [2] * len(reqs)  # args.steps forwards a call
            seen.append((os.environ.get("X_SETTING"), os.environ.get("Y_SETTING"),
                         tuple(r.req_id for r in reqs), bd.cpu_decode.stage_ms))
            self.runner.prepare_inputs()
            bd.ops.linear_argmax()

        def free(self, req_id):
            self.seqs.pop(req_id)

    def lm_head():  # 5 ms under setting b only
        if os.environ.get("X_SETTING") == "b":
            time.sleep(0.005)
    monkeypatch.setattr(bd.ops, "linear_argmax", lm_head)
    monkeypatch.setenv("X_SETTING", "before")
    monkeypatch.delenv("Y_SETTING", raising=False)
    # Y_SETTING named by the first setting only: unset again for the second's forwards
    args = types.SimpleNamespace(context=4, num_forwards=3, warmup=1, steps=2,
                                 settings="X_SETTING=a,Y_SETTING=y;X_SETTING=b",
                                 hold_context=False, turn_block=0)
    clocks = tuple(torch.ones(2) for _ in range(4))
    outside = ({}, {}, {}, {})
    draft = Draft()
    times = bd.time_forwards(draft, args, [1, 2], bd.parse_settings(args.settings), clocks,
                             outside)
    one, two = ("b1-0",), ("b2-0", "b2-1")
    cycle = [("a", "y", one, 0), ("b", None, one, 1), ("a", "y", two, 2), ("b", None, two, 3)]
    warm = [(x, y, ids, None) for x, y, ids, _ in cycle]  # the warm-up's on no clock
    assert [(x, y, ids, next((i for i, c in enumerate(clocks) if c is clock), None))
            for x, y, ids, clock in seen] == warm + cycle[::-1] + cycle
    assert [bd.turn_of(i, 3) for i in range(9)] == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    assert all(not c.any() for c in clocks)  # zeroed after the warm-up forwards
    assert draft.seqs == {}
    # the LM head's time lands in its setting's dict, the warm-up forward's left out (2 x 5 ms
    # counted, not 3), and the timing wrappers are gone afterwards
    assert all(set(o) == {"inputs", "lm_head"} for o in outside)
    for a, b in (outside[0], outside[1]), (outside[2], outside[3]):
        assert a["lm_head"] < 5 <= 10 <= b["lm_head"] < 15
    assert bd.ops.linear_argmax is lm_head and "prepare_inputs" not in vars(draft.runner)
    assert [len(t) for t in times] == [2, 2, 2, 2]  # the warm-up's left out
    # a forward's time: the call's over steps
    assert all(2.5 <= t < 5 for t in times[1] + times[3])
    assert os.environ["X_SETTING"] == "before" and "Y_SETTING" not in os.environ
    assert bd.cpu_decode.stage_ms is None


@pytest.mark.parametrize("hold", [False, True])
def test_hold_context_times_every_call_at_the_context(hold):
    """--hold-context sets each sequence back to its context (and the token drawn after it)
    after every call, so each call starts where the first did; without it the context grows by
    the steps of every call before; mean_context says which."""
    import types
    from benchmarks import benchmark_draft as bd
    starts, grown_to = [], []

    class Draft:
        config = types.SimpleNamespace(hf_config=types.SimpleNamespace(vocab_size=10))
        block_manager = types.SimpleNamespace(grow=lambda ids, n: grown_to.append(n) or True)
        runner = types.SimpleNamespace(prepare_inputs=lambda: None)

        def __init__(self):
            self.seqs = {}

        def propose(self, reqs, ks):  # the context's forward: its tokens and one drawn
            for r in reqs:
                self.seqs[r.req_id] = types.SimpleNamespace(
                    block_ids=[], token_ids=list(r.prompt_token_ids) + [7],
                    num_computed_tokens=len(r.prompt_token_ids))
            return types.SimpleNamespace(result=lambda: None)

        def _draft(self, reqs, ks):
            for r, k in zip(reqs, ks):
                seq = self.seqs[r.req_id]
                starts.append((len(seq.token_ids), seq.num_computed_tokens))
                seq.token_ids += [1] * k
                seq.num_computed_tokens += k

        def free(self, req_id):
            self.seqs.pop(req_id)

    args = types.SimpleNamespace(context=5, num_forwards=3, warmup=1, steps=2,
                                 settings="default", hold_context=hold, turn_block=0)
    bd.time_forwards(Draft(), args, 2)
    grown = [(6 + 2 * i, 5 + 2 * i) for i in range(3) for _ in range(2)]
    assert starts == ([(6, 5)] * 6 if hold else grown)
    # growing: the timed calls (after the warm-up's) start at 7 and 9 tokens
    assert bd.mean_context(args) == (6 if hold else 8)
    # the KV each sequence is grown to: held, one call's slots (the context, the token drawn
    # after it, the steps, one spare), not every call's (a 16-core host's KV ran out so)
    assert grown_to == ([5 + 2 + 2] * 2 if hold else [5 + 2 * 3 + 2] * 2)


def test_forwards_in_blocks_each_after_an_untimed_one_of_its_turn():
    """With turn_block b each turn's timed forwards come b in a row after an untimed one of the
    same turn (a draft's steps follow each other; forward by forward, a batch-1 forward after
    a batch-8 one read up to 1.35x slower), the blocks in turns, every other cycle reversed,
    the warm-up forward by forward; every turn gets its num_forwards - warmup timed ones."""
    from benchmarks import benchmark_draft as bd
    sched = bd.schedule_of(turns=2, warmup=1, num_forwards=6, block=2)
    warm = [(0, False), (1, False)]
    block = lambda t, n: [(t, False)] + [(t, True)] * n  # noqa: E731
    # blocks: cycle 1 (after the warm-up's cycle 0) reversed, then in order, then reversed
    assert sched == warm + block(1, 2) + block(0, 2) + block(0, 2) + block(1, 2) \
        + block(1, 1) + block(0, 1)
    for block_size in (1, 3, 4, 8):
        sched = bd.schedule_of(turns=3, warmup=2, num_forwards=9, block=block_size)
        assert [sum(1 for w, t in sched if w == turn and t) for turn in range(3)] == [7] * 3
        # every timed forward follows one of its own turn
        assert all(prev[0] == cur[0] for prev, cur in zip(sched, sched[1:]) if cur[1])
    assert bd.schedule_of(turns=2, warmup=0, num_forwards=2, block=0) == [
        (0, True), (1, True), (1, True), (0, True)]


def test_profile_prefill(tmp_path, tiny_llama):
    """A prompt's step alone and beside decoding requests (the mixed step): the engine's step
    time, its phases and the profiler's ops are recorded."""
    out = tmp_path / "p.json"
    run("profile_prefill.py", "--model", tiny_llama, "--device", "cpu", "--dtype", "float32",
        "--input-len", "8", "--batches", "1,2", "--iters", "2", "--decoding", "2",
        "--output-json", str(out))
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["rows"]] == [1, 2]
    for r in result["rows"]:
        assert r["decoding"] == 2 and r["engine_step_ms"] > 0 and r["wall_ms"] > 0
        assert r["phases_ms"]["execute_ms"] > 0 and r["top_cpu_ops"]
    assert result["weights_floor_ms"] > 0


def test_draft_summary_sets_batch_ratios_beside_their_floors(capsys):
    """The summary gives batch b's time over batch 1's at the best batch-1 thread count, and
    beside it the ratio of their floors (what the bytes alone allow) and batch b's own time over
    its floor (a batch 1 below its floor can leave batch b at its floor yet over the ratio)."""
    from benchmarks.benchmark_draft import print_summary
    row = dict(model="m", dtype="bfloat16", path="fused")
    rows = [dict(row, threads=2, batch_size=1, ms_per_forward=1.0, floor_ms=0.5),
            dict(row, threads=4, batch_size=1, ms_per_forward=2.0, floor_ms=0.4),
            dict(row, threads=2, batch_size=8, ms_per_forward=1.6, floor_ms=0.75),
            dict(row, threads=4, batch_size=8, ms_per_forward=9.0, floor_ms=9.0)]
    print_summary(rows, {("m", "bfloat16"): 4})
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "1.000 ms = 2.00x floor at 2 thr (5.00x at 4)" in line
    assert line.endswith("b8/b1 1.60 (floors 1.50; 2.13x its floor)")
    # without batch-1 rows: the smallest batch run, named, and no ratio to itself
    print_summary([r for r in rows if r["batch_size"] == 8], {("m", "bfloat16"): 2})
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.endswith("1.600 ms = 2.13x floor at 2 thr (batch 8) (2.13x at 2); -")


def test_draft_pooled_summary_reads_each_setting_over_the_median_batch_one(capsys):
    """With settings timed in turns, batch b of each setting is read over the median batch-1
    time of all settings at that thread count (not over the setting's own batch 1)."""
    from benchmarks.benchmark_draft import print_pooled
    row = dict(model="m", dtype="bfloat16", threads=16, floor_ms=0.3)
    rows = [dict(row, path="fused a", batch_size=1, ms_per_forward=0.30),
            dict(row, path="fused b", batch_size=1, ms_per_forward=0.40),
            dict(row, path="fused c", batch_size=1, ms_per_forward=0.32),
            dict(row, path="fused a", batch_size=8, ms_per_forward=0.48),
            dict(row, path="fused b", batch_size=8, ms_per_forward=0.40),
            dict(row, path="fused c", batch_size=8, ms_per_forward=0.64),
            dict(row, path="fused a", threads=4, batch_size=1, ms_per_forward=1.0),
            dict(row, path="fused a", threads=4, batch_size=8, ms_per_forward=1.5)]
    print_pooled(rows)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].endswith("4 thr: b1 1.000 ms; a b8/b1 1.50")
    assert lines[-1].endswith("16 thr: b1 0.320 ms; a b8/b1 1.50, b b8/b1 1.25, c b8/b1 2.00")
    # rows of one setting only (no label after the path): nothing pooled, nothing printed
    print_pooled([dict(r, path="fused") for r in rows])
    assert capsys.readouterr().out == ""


def test_the_amx_gap_lab_times_the_matrices_not_the_gaps():
    """benchmarks/lab/cpu_amx_gap_lab.py: the step's matrices in the fused step's order (each
    layer's qkv, o, gate_up, down, then the LM head), and a step's time is its calls' own, the
    busy gaps after each left out."""
    from benchmarks.lab import cpu_amx_gap_lab as lab
    shape = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    dims = [tuple(w.shape) for w in lab.step_weights(shape)]
    assert dims == [(128, 64), (64, 64), (192, 64), (64, 96)] * 2 + [(100, 64)]
    ms = lab.step_ms([lambda: lab.busy_wait(1000)] * 3, gap_us=3000)
    assert 3.0 <= ms < 6.0  # three 1 ms calls; the 9 ms of gaps not counted
    # one row on the row-major weight, 8 on the packed copy: the same sums as F.linear
    w = lab.step_weights(shape)[0]
    for rows in (1, 8):
        (call,) = lab.make_calls([w], rows)
        out, x = call.__defaults__[:2]
        call()
        ref = torch.nn.functional.linear(x.float(), w.float())
        torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.02)
