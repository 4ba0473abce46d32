"""EngineArgs: every engine flag, generated from the config dataclasses in vllm/config.py, so
LLM(...), `vllm serve` and the benchmarks accept the same names (vLLM's)."""
import argparse
import dataclasses
from typing import Any, Optional

from vllm.config import CONFIG_CLASSES, VllmConfig, _attr_name

# flags accepted for compatibility with vLLM that change nothing here
IGNORED_FLAGS = {"use_v2_block_manager", "disable_log_stats", "disable_log_requests",
                 "worker_use_ray", "enable_prefix_caching",
                 "disable_custom_all_reduce", "max_seq_len_to_capture", "quantization",
                 "kv_cache_dtype", "enable_chunked_prefill", "download_dir", "revision",
                 "tokenizer_mode", "skip_tokenizer_init"}

_FIELDS = {f.name: (cls, f) for cls in CONFIG_CLASSES for f in dataclasses.fields(cls)}
_FLAG_ALIASES = {"tensor_parallel_size": ["-tp"], "pipeline_parallel_size": ["-pp"]}


class EngineArgs:
    """Keyword arguments of the engine, checked against the config fields."""

    def __init__(self, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in _FIELDS and k not in IGNORED_FLAGS]
        if unknown:
            raise ValueError(f"unknown engine argument(s): {', '.join(sorted(unknown))}")
        self.kwargs = {k: _normalize(k, v) for k, v in kwargs.items()
                       if k in _FIELDS and not (v is None and _FIELDS[k][1].default is not None)}

    def __getattr__(self, name: str) -> Any:
        if name in _FIELDS:
            return self.kwargs.get(name, _FIELDS[name][1].default)
        raise AttributeError(name)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser,
                     skip: tuple[str, ...] = ()) -> argparse.ArgumentParser:
        for name, (_, f) in _FIELDS.items():
            if name in skip:
                continue
            flag = "--" + name.replace("_", "-")
            kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS,
                                      "help": f"{f.metadata.get('help', '')} (default: "
                                              f"{f.default})"}
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
            ftype = _field_type(f)
            if ftype is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif ftype is dict:
                import json
                kwargs["type"] = json.loads
            else:
                kwargs["type"] = ftype
            parser.add_argument(flag, *_FLAG_ALIASES.get(name, []), **kwargs)
        for name in sorted(IGNORED_FLAGS):
            parser.add_argument("--" + name.replace("_", "-"), dest=name, nargs="?", const=True,
                                default=argparse.SUPPRESS, help="accepted and ignored")
        return parser

    @staticmethod
    def field_names() -> set[str]:
        return set(_FIELDS) | IGNORED_FLAGS

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(**{k: v for k, v in vars(args).items() if k in _FIELDS or k in IGNORED_FLAGS})

    def create_engine_config(self) -> VllmConfig:
        configs = {}
        for cls in CONFIG_CLASSES:
            names = {f.name for f in dataclasses.fields(cls)}
            configs[_attr_name(cls)] = cls(**{k: v for k, v in self.kwargs.items() if k in names})
        config = VllmConfig(**configs)
        config.verify()
        return config


def _normalize(name: str, value: Any) -> Any:
    """What vLLM's Python API also accepts, in the form the config holds: a torch.dtype for a
    dtype field becomes its name ("float16"). (None for a field with a non-None default means
    unset, as in vLLM, and is dropped before this.)"""
    import torch
    if isinstance(value, torch.dtype) and name.endswith("dtype"):
        return str(value).removeprefix("torch.")
    return value


def _field_type(f: dataclasses.Field) -> Optional[type]:
    text = str(f.type)
    for t in (bool, int, float, str, dict):
        if t.__name__ in text:
            return t
    return str
