"""Engine configuration: one dataclass per concern, each field with a default and a one-line help
(field metadata), from which EngineArgs generates the CLI flags (vLLM's names)."""
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch


def doc(default: Any, help: str, **kwargs) -> Any:
    """A dataclass field with its default and its one-line help (shown by --help)."""
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass
class ModelConfig:
    model: str = doc(None, "HF checkpoint directory or .gguf file of the model")
    tokenizer: Optional[str] = doc(None, "tokenizer directory; default: the model's own")
    dtype: str = doc("auto", "auto, float32, bfloat16 or float16 (auto: the checkpoint's; "
                     "bfloat16 for fp16 checkpoints on the CPU)",
                     choices=["auto", "float32", "bfloat16", "float16", "half", "float"])
    seed: int = doc(0, "seed of the default random generator (unseeded requests)")
    max_model_len: Optional[int] = doc(None, "longest prompt + output in tokens; default: the "
                                       "model's max_position_embeddings")
    load_format: str = doc("auto", "auto (by the path), safetensors, gguf, or dummy (random "
                           "weights of the config's shapes)",
                           choices=["auto", "safetensors", "gguf", "dummy"])
    enforce_eager: bool = doc(False, "never use CUDA graphs")
    trust_remote_code: bool = doc(False, "accepted for compatibility; remote code never runs")
    hf_overrides: Optional[dict] = doc(None, "config.json values to override (dummy shapes)")
    served_model_name: Optional[str] = doc(None, "model name in API responses")


@dataclass
class CacheConfig:
    block_size: int = doc(16, "tokens per KV cache block", choices=[16, 32])
    gpu_memory_utilization: float = doc(0.9, "fraction of GPU memory for weights, activations "
                                        "and KV cache")
    num_gpu_blocks_override: Optional[int] = doc(None, "use exactly this many KV blocks "
                                                 "(tests force preemption with it)")
    swap_space: float = doc(4, "accepted for compatibility; preemption recomputes")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = doc(256, "most sequences in one step")
    max_num_batched_tokens: Optional[int] = doc(None, "most tokens in one step; default "
                                                "max(2048, max_num_seqs)")


@dataclass
class DeviceConfig:
    device: str = doc("auto", "auto (cuda when present), cuda or cpu",
                      choices=["auto", "cuda", "cpu"])


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = doc(1, "GPUs per model (only 1 is supported yet)")
    pipeline_parallel_size: int = doc(1, "pipeline stages (only 1 is supported)")


CONFIG_CLASSES = (ModelConfig, CacheConfig, SchedulerConfig, DeviceConfig, ParallelConfig)

_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


@dataclass
class VllmConfig:
    """All configs of one engine, with the values derived from the model resolved."""
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    parallel_config: ParallelConfig
    hf_config: Any = None
    torch_dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")

    def verify(self) -> None:
        mc, sc = self.model_config, self.scheduler_config
        for cfg in CONFIG_CLASSES:
            inst = getattr(self, _attr_name(cfg))
            for f in dataclasses.fields(cfg):
                choices = f.metadata.get("choices")
                value = getattr(inst, f.name)
                if choices and value not in choices:
                    raise ValueError(f"{f.name}={value!r} is invalid; choose one of {choices}")
        if mc.model is None:
            raise ValueError("model is required: a HF checkpoint directory or a .gguf file")
        if self.parallel_config.tensor_parallel_size != 1:
            raise ValueError(f"tensor_parallel_size={self.parallel_config.tensor_parallel_size} "
                             "is not supported yet; use 1")
        if self.parallel_config.pipeline_parallel_size != 1:
            raise ValueError("pipeline_parallel_size must be 1")
        if sc.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {sc.max_num_seqs}")
        if not 0 < self.cache_config.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.cache_config.gpu_memory_utilization}")
        if mc.max_model_len is not None and mc.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {mc.max_model_len}")

    def resolve(self) -> None:
        """Derives device, dtype, max_model_len and token budget from the model's config."""
        dev = self.device_config.device
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        if dev == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but no CUDA GPU is available")
        self.device = torch.device("cuda", torch.cuda.current_device()) if dev == "cuda" \
            else torch.device("cpu")
        self.torch_dtype = _resolve_dtype(self.model_config.dtype, self.hf_config, self.device)
        mc = self.model_config
        limit = getattr(self.hf_config, "max_position_embeddings", None) or 2048
        if mc.max_model_len is None:
            mc.max_model_len = limit
        elif mc.max_model_len > limit:
            raise ValueError(f"max_model_len={mc.max_model_len} exceeds the model's "
                             f"max_position_embeddings={limit}")
        sc = self.scheduler_config
        if sc.max_num_batched_tokens is None:
            sc.max_num_batched_tokens = max(2048, sc.max_num_seqs)
        if sc.max_num_batched_tokens < sc.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({sc.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({sc.max_num_seqs})")


def _attr_name(cls: type) -> str:
    name = cls.__name__.replace("Config", "")
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_") + "_config"


def _resolve_dtype(dtype: str, hf_config: Any, device: torch.device) -> torch.dtype:
    from vllm.logger import init_logger

    if dtype == "auto":
        ckpt = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
        if isinstance(ckpt, str):
            ckpt = _DTYPES.get(ckpt, None)
        result = ckpt if isinstance(ckpt, torch.dtype) else torch.bfloat16
        if result == torch.float32 and device.type == "cuda":
            result = torch.bfloat16
    else:
        result = _DTYPES[dtype]
    if device.type == "cpu" and result == torch.float16:
        init_logger(__name__).warning("float16 has no CPU kernels; using bfloat16 on the CPU")
        result = torch.bfloat16
    return result

