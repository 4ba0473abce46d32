"""Each benchmark runs end to end on a tiny model (one iteration) and writes its JSON."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("proposer", ["draft", "[ngram]"])
def test_benchmark_spec_decode(tmp_path, tiny_llama, proposer):
    out = tmp_path / "s.json"
    draft = tiny_llama if proposer == "draft" else proposer
    run("benchmark_spec_decode.py", "--model", tiny_llama, "--speculative-model", draft,
        "--cpu-draft-worker", "--device", "cpu", "--dtype", "float32", "--ks", "2",
        "--num-prompts", "2", "--max-tokens", "8", "--output-json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["k"] for r in rows] == [0, 2] and rows[1]["identical_to_plain"]
