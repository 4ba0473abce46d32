"""Tensor parallelism on GPUs (NCCL, CUDA graphs on): greedy output of tensor_parallel_size N
(VLLM_TEST_TP_SIZE, default 2) equals tensor_parallel_size 1, plain and with a CPU draft on the
driver. Needs N GPUs on this host (scripts/gpu_check.sh tp runs it); skipped elsewhere."""
import gc
import os

import pytest
import torch

from tests.tiny_models import build_model
from vllm import LLM, SamplingParams

TP = int(os.environ.get("VLLM_TEST_TP_SIZE", "2"))
PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over", "x",
           "Once upon a time, in a land far away,"]

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(torch.cuda.device_count() < TP,
                                 reason=f"needs {TP} GPUs (VLLM_TEST_TP_SIZE)")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    # 8 query heads, 2 KV heads: up to 8 ranks (KV heads replicated beyond 2)
    shape = dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16)
    root = tmp_path_factory.mktemp("tp-cuda")
    return (str(build_model(root / "target", "llama", seed=3, **shape)),
            str(build_model(root / "draft", "llama", seed=4, num_hidden_layers=1, **shape)))


def greedy(llm):
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def run(target, tp, **kwargs):
    llm = LLM(target, dtype="float32", device="cuda", tensor_parallel_size=tp,
              gpu_memory_utilization=0.3, num_gpu_blocks_override=256, max_num_seqs=8, **kwargs)
    try:
        assert llm.llm_engine.worker.model_runner.cuda_graphs is not None
        return greedy(llm), llm.llm_engine.spec_metrics.num_spec_steps
    finally:
        llm.llm_engine.model_executor.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("with_draft", [False, True], ids=["plain", "cpu-draft"])
def test_tp_cuda_greedy_equals_tp1(models, with_draft):
    target, draft = models
    kwargs = dict(speculative_model=draft, num_speculative_tokens=3, cpu_draft_worker=True,
                  speculative_draft_dtype="float32", speculative_adaptive="off")
    kwargs = kwargs if with_draft else {}
    reference, _ = run(target, 1)
    tokens, spec_steps = run(target, TP, **kwargs)
    assert tokens == reference
    assert (spec_steps > 0) == with_draft
