"""Tensor parallelism on the CPU (gloo, one process per rank, one thread each): greedy output of
tensor_parallel_size 2 equals tensor_parallel_size 1 token for token, for Llama (4 query / 2 KV
heads: one KV head per rank) and Qwen2 (biases, tied embeddings, 1 KV head replicated on both
ranks, a vocabulary of 401 rows split unevenly), with and without a CPU draft on the driver;
through multiprocessing and through a local Ray cluster. Impossible splits raise ValueError."""
import contextlib
import time

import pytest
import torch

from tests.tiny_models import build_model
from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.loader import resolve_config

PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over", "x",
           "Once upon a time, in a land far away,"]
NUM_TOKENS = 24
# each LLM of tensor_parallel_size 2 must start, generate and stop within this (2 slow cores)
BOUND_S = 120


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (target, draft): the draft has one layer and other weights, the same vocabulary."""
    out = {}
    for arch, extra in (("llama", {}), ("qwen2", {"num_key_value_heads": 1, "vocab_size": 401})):
        root = tmp_path_factory.mktemp(f"tp-{arch}")
        target = build_model(root / "target", arch, seed=3, **extra)
        draft = build_model(root / "draft", arch, seed=4, num_hidden_layers=1, **extra)
        out[arch] = (str(target), str(draft))
    return out


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_NUM_THREADS", "1")  # inherited by the ranks' processes


def greedy(llm):
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def draft_kwargs(draft):
    return dict(speculative_model=draft, num_speculative_tokens=3, cpu_draft_worker=True,
                speculative_draft_dtype="float32", speculative_adaptive="off")


@pytest.fixture(scope="module")
def reference(models):
    ref = {}
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for arch, (target, _) in models.items():
            ref[arch] = greedy(LLM(target, dtype="float32", device="cpu"))
    finally:
        torch.set_num_threads(torch_threads)
    return ref


@contextlib.contextmanager
def tp_llm(model, **kwargs):
    """An LLM of tensor_parallel_size 2 whose rank processes are stopped whatever happens."""
    start, threads = time.monotonic(), torch.get_num_threads()
    llm = LLM(model, dtype="float32", device="cpu", tensor_parallel_size=2, **kwargs)
    try:
        yield llm
    finally:
        llm.llm_engine.model_executor.shutdown()
        torch.set_num_threads(threads)  # the driver's worker set one thread
    assert time.monotonic() - start < BOUND_S


def check_sharded(llm, num_kv_heads_per_rank):
    attn = llm.llm_engine.worker.model_runner.model.model.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads) == (2, num_kv_heads_per_rank)  # of 4 and 2 / 1
    cache = llm.llm_engine.worker.model_runner.kv_caches[0][0]
    assert cache.shape[1] == num_kv_heads_per_rank


@pytest.mark.parametrize("with_draft", [False, True], ids=["plain", "cpu-draft"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tp2_greedy_equals_tp1(models, reference, arch, with_draft):
    target, draft = models[arch]
    kwargs = draft_kwargs(draft) if with_draft else {}
    with tp_llm(target, **kwargs) as llm:
        check_sharded(llm, 1)
        assert greedy(llm) == reference[arch]
        if with_draft:
            engine = llm.llm_engine
            assert engine.spec_metrics.num_spec_steps > 0
            # the draft is one whole model on the driver
            draft_attn = engine.proposer.runner.model.model.layers[0].self_attn
            assert draft_attn.num_heads == 4


def test_tp2_ray_greedy_equals_tp1(models, reference):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install ray)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        target, draft = models["qwen2"]
        with tp_llm(target, distributed_executor_backend="ray", **draft_kwargs(draft)) as llm:
            assert greedy(llm) == reference["qwen2"]
            assert llm.llm_engine.spec_metrics.num_spec_steps > 0
    finally:
        ray.shutdown()


def test_impossible_splits_raise(models, monkeypatch):
    target, _ = models["llama"]
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide the model's "
                                         "num_attention_heads=4"):
        LLM(target, device="cpu", tensor_parallel_size=3)
    # the llama has 4 heads and 2 KV heads: 8 ranks would split 4 heads 8 ways
    with pytest.raises(ValueError, match="num_attention_heads"):
        LLM(target, device="cpu", tensor_parallel_size=8)
    config = EngineArgs(model=target, device="cpu", tensor_parallel_size=2).create_engine_config()
    resolve_config(config)
    config.device = torch.device("cuda", 0)  # as if resolved on a host of one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs 2 GPUs; this host has 1"):
        config._check_tensor_parallel()
    with pytest.raises(ValueError, match="distributed_executor_backend='threads'"):
        EngineArgs(model=target, tensor_parallel_size=2,
                   distributed_executor_backend="threads").create_engine_config()
