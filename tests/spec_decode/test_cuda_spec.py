"""Heterogeneous speculative decoding in one process: the target on CUDA (CUDA graphs on, for the
k+1-token verification steps too), the draft on the CPU; greedy outputs equal the target's plain
greedy outputs."""
import pytest

from tests.spec_decode.test_greedy_equality import PROMPTS, greedy
from tests.utils import HAS_CUDA
from vllm import LLM

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]


@pytest.mark.parametrize("same_draft", [False, True], ids=["other-draft", "draft==target"])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_cuda_target_cpu_draft_greedy_equality(spec_target, spec_draft, k, same_draft):
    """draft == target accepts every draft (bonus tokens, full catch-up); a different draft
    mostly rejects (rollback)."""
    spec_draft = spec_target if same_draft else spec_draft
    kw = dict(dtype="float32", device="cuda", gpu_memory_utilization=0.3, max_num_seqs=8)
    plain = LLM(spec_target, **kw).generate(PROMPTS, greedy(), use_tqdm=False)
    llm = LLM(spec_target, speculative_model=spec_draft,
              speculative_adaptive="off", num_speculative_tokens=k,
              cpu_draft_worker=True, speculative_draft_dtype="float32", **kw)
    assert llm.llm_engine.worker.model_runner.cuda_graphs is not None
    assert llm.llm_engine.proposer.config.device.type == "cpu"
    outs = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    graphs = llm.llm_engine.worker.model_runner.cuda_graphs.graphs
    assert any(q == k + 1 for _, q in graphs), f"no verification graph was used: {list(graphs)}"
    metrics = llm.llm_engine.spec_metrics
    assert metrics.num_spec_steps > 0
    if same_draft:
        assert metrics.acceptance_rate > 0.9
