"""The engine with the model on CUDA: greedy tokens equal transformers' (fp32), with CUDA graphs
on and off, and bf16 decode with graphs equal to bf16 without them."""
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
