"""pack_weights: a CPU model's parameters moved into one buffer per dtype as views, values and
outputs unchanged, tied weights kept tied; the loader packs every CPU model."""
import torch
from torch import nn

from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.loader import get_model, resolve_config
from vllm.model_executor.model_loader.weight_arena import ALIGN_BYTES, pack_weights


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(37, 24)
        self.proj = nn.Linear(24, 50)  # weight and bias: sizes that are no multiple of a line
        self.norm = nn.Parameter(torch.rand(24, dtype=torch.float32))
        self.head = nn.Linear(24, 37, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(self.embed(ids))[..., :24] * self.norm.to(torch.bfloat16))


def test_pack_keeps_values_outputs_and_ties():
    torch.manual_seed(0)
    model = _Tied().to(torch.bfloat16)
    model.norm.data = model.norm.data.float()  # a second dtype
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.tensor([[1, 5, 36]])
    expected = model(ids)
    packed = pack_weights(model)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
        assert p.untyped_storage().data_ptr() % ALIGN_BYTES == 0
        assert p.data_ptr() % ALIGN_BYTES == 0, name  # each starts on a cache line
    bf16 = [p for p in model.parameters() if p.dtype == torch.bfloat16]
    assert len({p.untyped_storage().data_ptr() for p in bf16}) == 1  # one buffer per dtype
    assert model.head.weight is model.embed.weight  # still tied, packed once
    assert packed >= sum(p.numel() * p.element_size() for p in model.parameters())
    assert torch.equal(model(ids), expected)


def test_the_loader_packs_a_cpu_model(tiny_llama):
    config = resolve_config(EngineArgs(model=tiny_llama, device="cpu",
                                       dtype="bfloat16").create_engine_config())
    model = get_model(config)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1
