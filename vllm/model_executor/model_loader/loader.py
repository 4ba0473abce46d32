"""get_model: the model's HF config, class and weights, from a checkpoint directory
(safetensors), a GGUF file, or random weights (load_format=dummy) for timing large shapes."""
import copy
import functools
import os
from typing import Any, Iterator

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.distributed.parallel_state import building
from vllm.logger import init_logger
from vllm.model_executor.model_loader.weight_arena import pack_weights
from vllm.model_executor.models.registry import resolve_model_class

logger = init_logger(__name__)


def resolve_load_format(model: str, load_format: str) -> str:
    if not os.path.exists(model):
        raise ValueError(f"model path {model!r} does not exist (give a HF checkpoint directory "
                         "or a .gguf file; nothing is downloaded)")
    if load_format != "auto":
        return load_format
    return "gguf" if model.endswith(".gguf") else "safetensors"


def open_gguf(path: str):
    """The GGUF file opened once per process (config, weights and tokenizer all read it)."""
    stat = os.stat(path)
    return _open_gguf(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _open_gguf(path: str, mtime_ns: int, size: int):
    from vllm.model_executor.model_loader.gguf_loader import load_gguf
    return load_gguf(path)


def load_hf_config(model: str, load_format: str, hf_overrides: dict | None = None) -> Any:
    fmt = resolve_load_format(model, load_format)
    if fmt == "gguf" or (fmt == "dummy" and model.endswith(".gguf")):
        config = copy.deepcopy(open_gguf(model).config)  # callers override fields
    else:
        from vllm.model_executor.model_loader.safetensors_loader import load_hf_config as load
        config = load(model)
    for key, value in (hf_overrides or {}).items():
        setattr(config, key, value)
    return config


def resolve_config(config: Any) -> Any:
    """A created VllmConfig made whole: the model's HF config read (with its overrides), then
    every derived field resolved against it. The engine and the draft worker start this way."""
    mc = config.model_config
    config.hf_config = load_hf_config(mc.model, mc.load_format, mc.hf_overrides)
    config.resolve()
    return config


def _iter_weights(model: str, fmt: str) -> Iterator[tuple[str, torch.Tensor]]:
    if fmt == "gguf":
        return open_gguf(model).iter_weights()
    from vllm.model_executor.model_loader.safetensors_loader import iter_safetensors_weights
    return iter_safetensors_weights(model)


def _init_dummy_weights(model: nn.Module, seed: int) -> None:
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, 0.02, generator=gen)


def get_model(config: VllmConfig) -> nn.Module:
    mc = config.model_config
    fmt = resolve_load_format(mc.model, mc.load_format)
    model_cls = resolve_model_class(config.hf_config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(config.torch_dtype)
    try:
        with torch.device(config.device), building(config.parallel_config.tensor_parallel_size):
            model = model_cls(config.hf_config)
    finally:
        torch.set_default_dtype(previous)
    if fmt == "dummy":
        _init_dummy_weights(model, mc.seed)
    else:
        model.load_weights(_iter_weights(mc.model, fmt))
    if torch.device(config.device).type == "cpu":
        pack_weights(model)  # every weight on huge pages (weight_arena.py)
    logger.info("loaded %s (%s, %s) on %s: %.2f GB", model_cls.__name__, fmt,
                str(config.torch_dtype).replace("torch.", ""), config.device,
                sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9)
    return model.eval()
