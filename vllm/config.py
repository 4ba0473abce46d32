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
    max_logprobs: int = doc(20, "most logprobs (and prompt_logprobs) a request may ask for")


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
    scheduler_delay_factor: float = doc(0.0, "while requests run, admit waiting prompts once "
                                        "the oldest has waited this many times the last "
                                        "prompt step's duration, so that prompts arriving "
                                        "close together share a prefill step (0: at once)")


@dataclass
class DeviceConfig:
    device: str = doc("auto", "auto (cuda when present), cuda or cpu",
                      choices=["auto", "cuda", "cpu"])


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = doc(1, "ranks (GPUs, or CPU processes) the target model is "
                                    "split over by heads and features")
    pipeline_parallel_size: int = doc(1, "pipeline stages (only 1 is supported)")
    distributed_executor_backend: Optional[str] = doc(
        None, "how ranks beyond the driver run: mp (one process per rank on this host, the "
        "default) or ray (a Ray cluster, across hosts)")


@dataclass
class SpeculativeConfig:
    speculative_model: Optional[str] = doc(None, "draft model (HF dir or .gguf) or '[ngram]' "
                                           "for prompt-lookup proposals")
    num_speculative_tokens: Optional[int] = doc(None, "tokens drafted per step (k)")
    cpu_draft_worker: bool = doc(False, "run the draft model on the CPU (its own KV cache, "
                                 "sized by VLLM_CPU_KVCACHE_SPACE, and threads)")
    speculative_draft_dtype: str = doc("auto", "draft dtype on the CPU: auto (bfloat16 for "
                                       "fp16 checkpoints), float32 or bfloat16 (ours)",
                                       choices=["auto", "float32", "bfloat16", "float16"])
    speculative_draft_threads: int = doc(0, "threads of the CPU draft: 0 picks the fastest "
                                         "count by a short measurement at start-up (ours)")
    ngram_prompt_lookup_max: Optional[int] = doc(None, "longest n-gram matched by [ngram]")
    ngram_prompt_lookup_min: Optional[int] = doc(None, "shortest n-gram matched by [ngram]")
    spec_decoding_acceptance_method: str = doc(
        "rejection_sampler", "rejection_sampler (lossless) or typical_acceptance_sampler",
        choices=["rejection_sampler", "typical_acceptance_sampler"])
    typical_acceptance_sampler_posterior_threshold: float = doc(
        0.09, "typical acceptance: probability threshold (epsilon)")
    typical_acceptance_sampler_posterior_alpha: float = doc(
        0.3, "typical acceptance: entropy scale (delta)")
    speculative_disable_by_batch_size: Optional[int] = doc(
        None, "no speculation in steps with at least this many running requests")
    speculative_draft_tensor_parallel_size: Optional[int] = doc(None, "draft TP size (1 only)")
    speculative_max_model_len: Optional[int] = doc(None, "longest sequence the draft handles; "
                                                   "longer ones continue without speculation")
    speculative_draft_ahead: str = doc(
        "auto", "draft past the proposal while the target verifies it (used when every draft "
        "is accepted): auto (when the draft runs on another device than the target), on, "
        "off (ours)", choices=["auto", "on", "off"])
    speculative_adaptive: str = doc(
        "on", "goodput controller: pick k (0 = plain decoding) and drafting ahead each step "
        "from measured costs and acceptance; off: always the configured k (ours)",
        choices=["on", "off"])
    speculative_batch_split: str = doc(
        "auto", "batched overlap: with 2+ decoding requests, verify one half on the target "
        "while the draft process drafts the other, then swap: auto (when the goodput "
        "controller models that it pays; needs a draft process), on (whenever 2+ requests "
        "decode and the draft runs in its own process), off (ours)",
        choices=["auto", "on", "off"])
    speculative_draft_process: str = doc(
        "auto", "run a CPU draft model in its own process (own threads and cores, no shared "
        "GIL): auto (when the target is on a GPU), on, off (ours)",
        choices=["auto", "on", "off"])
    speculative_draft_cpus: Optional[str] = doc(
        None, "cores of the draft process, e.g. '2-15' (default: with a GPU target and 4+ "
        "cores, all but the first two; else unpinned) (ours)")
    speculative_draft_timeout: float = doc(
        30.0, "seconds the engine waits for the draft process's drafts before it restarts "
        "it and decodes without speculation meanwhile (ours)")
    speculative_config: Optional[dict] = doc(None, "JSON: {method, model, "
                                             "num_speculative_tokens, draft_device, ...}")

    def resolve(self) -> None:
        """Folds speculative_config (the modern form) into the flat fields and checks them."""
        sc = dict(self.speculative_config or {})
        if sc:
            method = sc.pop("method", None)
            model = sc.pop("model", None)
            if method in ("ngram", "[ngram]") or model == "[ngram]":
                model = "[ngram]"
            elif method not in (None, "draft_model", "eagle") and model is None:
                raise ValueError(f"speculative_config method {method!r} is not supported "
                                 "(draft_model or ngram)")
            self.speculative_model = model or self.speculative_model
            device = sc.pop("draft_device", None)
            if device not in (None, "cpu", "cuda", "auto"):
                raise ValueError(f"speculative_config draft_device must be cpu or cuda, got "
                                 f"{device!r}")
            self.cpu_draft_worker = self.cpu_draft_worker or device == "cpu"
            renames = {"prompt_lookup_max": "ngram_prompt_lookup_max",
                       "prompt_lookup_min": "ngram_prompt_lookup_min",
                       "max_model_len": "speculative_max_model_len",
                       "disable_by_batch_size": "speculative_disable_by_batch_size",
                       "acceptance_method": "spec_decoding_acceptance_method"}
            for key, value in sc.items():
                name = renames.get(key, key)
                if name not in {f.name for f in dataclasses.fields(self)}:
                    raise ValueError(f"unknown speculative_config key {key!r}")
                setattr(self, name, value)
        if self.speculative_model is None:
            if self.num_speculative_tokens is not None:
                raise ValueError("num_speculative_tokens needs speculative_model")
            return
        k = self.num_speculative_tokens
        if k is None or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1 when "
                             f"speculative_model is set, got {k!r}")
        if self.speculative_draft_tensor_parallel_size not in (None, 1):
            raise ValueError("speculative_draft_tensor_parallel_size must be 1")
        if self.is_ngram:
            hi = self.ngram_prompt_lookup_max or 4
            lo = self.ngram_prompt_lookup_min or 1
            if not 1 <= lo <= hi:
                raise ValueError(f"need 1 <= ngram_prompt_lookup_min ({lo}) <= "
                                 f"ngram_prompt_lookup_max ({hi})")
            self.ngram_prompt_lookup_max, self.ngram_prompt_lookup_min = hi, lo
        if self.speculative_adaptive not in ("on", "off"):
            raise ValueError(f"speculative_adaptive must be on or off, got "
                             f"{self.speculative_adaptive!r}")
        if self.speculative_draft_ahead not in ("auto", "on", "off"):
            raise ValueError(f"speculative_draft_ahead must be auto, on or off, got "
                             f"{self.speculative_draft_ahead!r}")
        if self.speculative_batch_split not in ("auto", "on", "off"):
            raise ValueError(f"speculative_batch_split must be auto, on or off, got "
                             f"{self.speculative_batch_split!r}")
        if self.speculative_draft_timeout <= 0:
            raise ValueError(f"speculative_draft_timeout must be > 0, got "
                             f"{self.speculative_draft_timeout}")
        if self.speculative_draft_process == "on" and self.is_ngram:
            raise ValueError("speculative_draft_process=on needs a draft model, not [ngram]")
        if (self.speculative_disable_by_batch_size is not None
                and self.speculative_disable_by_batch_size < 2):
            raise ValueError("speculative_disable_by_batch_size must be >= 2")
        if self.speculative_draft_threads < 0:
            raise ValueError(f"speculative_draft_threads must be >= 0 (0: measure), got "
                             f"{self.speculative_draft_threads}")

    @property
    def enabled(self) -> bool:
        return self.speculative_model is not None

    @property
    def is_ngram(self) -> bool:
        return self.speculative_model == "[ngram]"


CONFIG_CLASSES = (ModelConfig, CacheConfig, SchedulerConfig, DeviceConfig, ParallelConfig,
                  SpeculativeConfig)

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
    speculative_config: SpeculativeConfig = field(default_factory=SpeculativeConfig)
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
        pc = self.parallel_config
        if not isinstance(pc.tensor_parallel_size, int) or pc.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got "
                             f"{pc.tensor_parallel_size!r}")
        if pc.distributed_executor_backend not in (None, "mp", "ray"):
            raise ValueError(f"distributed_executor_backend={pc.distributed_executor_backend!r} "
                             "is invalid; choose mp or ray")
        if self.parallel_config.pipeline_parallel_size != 1:
            raise ValueError("pipeline_parallel_size must be 1")
        if sc.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {sc.max_num_seqs}")
        if not 0 < self.cache_config.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.cache_config.gpu_memory_utilization}")
        if mc.max_model_len is not None and mc.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {mc.max_model_len}")
        self.speculative_config.resolve()

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
        self._check_tensor_parallel()
        sc = self.scheduler_config
        if sc.max_num_batched_tokens is None:
            sc.max_num_batched_tokens = max(2048, sc.max_num_seqs)
        if sc.max_num_batched_tokens < sc.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({sc.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({sc.max_num_seqs})")
        if not sc.scheduler_delay_factor >= 0:  # NaN too
            raise ValueError(f"scheduler_delay_factor must be >= 0, got "
                             f"{sc.scheduler_delay_factor}")


    def _check_tensor_parallel(self) -> None:
        """The split must be possible: heads (and the MLP) divisible by the ranks, KV heads
        divisible or dividing, and on one host no more GPU ranks than GPUs."""
        tp = self.parallel_config.tensor_parallel_size
        if tp == 1:
            return
        hf = self.hf_config
        num_heads = hf.num_attention_heads
        num_kv_heads = getattr(hf, "num_key_value_heads", None) or num_heads
        if num_heads % tp:
            raise ValueError(f"tensor_parallel_size={tp} does not divide the model's "
                             f"num_attention_heads={num_heads}")
        if num_kv_heads % tp and tp % num_kv_heads:
            raise ValueError(f"tensor_parallel_size={tp} and the model's num_key_value_heads="
                             f"{num_kv_heads}: one must divide the other")
        if hf.intermediate_size % tp:
            raise ValueError(f"tensor_parallel_size={tp} does not divide the model's "
                             f"intermediate_size={hf.intermediate_size}")
        if (self.device.type == "cuda" and self.parallel_config.distributed_executor_backend
                != "ray" and tp > torch.cuda.device_count()):
            raise ValueError(f"tensor_parallel_size={tp} needs {tp} GPUs; this host has "
                             f"{torch.cuda.device_count()} (use the ray backend across hosts)")


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

