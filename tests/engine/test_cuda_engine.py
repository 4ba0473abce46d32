"""The engine with the model on CUDA: greedy tokens equal transformers' (fp32), with CUDA graphs
on and off, bf16 decode with graphs equal to bf16 without them, and with the kernels launched
with programmatic dependent launch (VLLM_CUDA_PDL=1) equal to plain launches."""
import pytest

from tests.engine.test_correctness import PROMPTS, greedy, token_ids
from tests.tiny_models import hf_greedy
from tests.utils import HAS_CUDA
from vllm import LLM

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("enforce_eager", [True, False])
def test_cuda_greedy_equals_transformers(arch, enforce_eager, tiny_llama, tiny_qwen2):
    model_dir = tiny_llama if arch == "llama" else tiny_qwen2
    llm = LLM(model_dir, dtype="float32", device="cuda", enforce_eager=enforce_eager,
              gpu_memory_utilization=0.3, max_num_seqs=8)
    if not enforce_eager:
        assert llm.llm_engine.worker.model_runner.cuda_graphs is not None
    outputs = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outputs):
        assert out.outputs[0].token_ids == hf_greedy(model_dir, tok.encode(prompt), 32), prompt


def test_cuda_graphs_match_eager_in_bf16(tiny_llama):
    kw = dict(dtype="bfloat16", device="cuda", gpu_memory_utilization=0.3, max_num_seqs=8)
    eager = token_ids(LLM(tiny_llama, enforce_eager=True, **kw).generate(PROMPTS, greedy(),
                                                                         use_tqdm=False))
    graphs = token_ids(LLM(tiny_llama, enforce_eager=False, **kw).generate(PROMPTS, greedy(),
                                                                           use_tqdm=False))
    assert graphs == eager


@pytest.mark.parametrize("max_num_seqs", [1, 8])
def test_pdl_launches_match_plain_ones_in_bf16(tiny_llama, max_num_seqs, monkeypatch):
    """VLLM_CUDA_PDL=1: every vllm._C kernel launched with programmatic dependent launch and
    captured so into the CUDA graphs (one sequence at a time: the decode GEMVs are linear_small,
    which prefetch their weights before waiting) gives the greedy tokens of plain launches."""
    kw = dict(dtype="bfloat16", device="cuda", gpu_memory_utilization=0.3,
              max_num_seqs=max_num_seqs, enforce_eager=False)
    monkeypatch.setenv("VLLM_CUDA_PDL", "0")
    plain = token_ids(LLM(tiny_llama, **kw).generate(PROMPTS, greedy(), use_tqdm=False))
    monkeypatch.setenv("VLLM_CUDA_PDL", "1")
    pdl = token_ids(LLM(tiny_llama, **kw).generate(PROMPTS, greedy(), use_tqdm=False))
    assert pdl == plain
