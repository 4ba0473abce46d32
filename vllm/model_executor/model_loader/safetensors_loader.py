"""Read a Hugging Face checkpoint directory: config.json and *.safetensors weights.

    config = load_hf_config(model_dir)
    for name, tensor in iter_safetensors_weights(model_dir):
        ...

A directory holds either one or more `*.safetensors` files, or shards listed by
`model.safetensors.index.json` (its "weight_map": tensor name -> shard file). Tensors are read one
at a time through safetensors' memory-mapped `safe_open`, so the peak memory is the consumer's
plus one tensor.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import torch

INDEX_FILE = "model.safetensors.index.json"


def _model_dir(model_dir: str | os.PathLike) -> Path:
    path = Path(model_dir).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"model path {path} is not a directory (expected a Hugging Face "
                                 f"checkpoint directory with config.json and *.safetensors)")
    return path


def _read_index(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{index_path} is not a valid safetensors index (expected JSON with a "
                         f"'weight_map' of tensor name -> shard file): {e}") from e
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index_path}: 'weight_map' is empty or not an object")
    return weight_map


def safetensors_files(model_dir: str | os.PathLike) -> list[Path]:
    """The weight files of a checkpoint directory, in reading order; raises FileNotFoundError
    naming the directory and what was expected when they are not all there."""
    path = _model_dir(model_dir)
    index_path = path / INDEX_FILE
    if index_path.is_file():
        weight_map = _read_index(index_path)
        shards = list(dict.fromkeys(weight_map.values()))  # first-appearance order, unique
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(
                f"model directory {path}: {INDEX_FILE} lists {len(shards)} shard(s) but "
                f"{len(missing)} are missing: {', '.join(missing)}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        present = sorted(p.name for p in path.iterdir())[:20]
        raise FileNotFoundError(
            f"model directory {path} has no weights: expected model.safetensors, several "
            f"*.safetensors files, or {INDEX_FILE} with its shards (found: {present or 'nothing'})")
    return files


def iter_safetensors_weights(model_dir: str | os.PathLike,
                             dtype: torch.dtype | None = None
                             ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the checkpoint in `model_dir` (as stored, or
    converted to `dtype`). With an index, only the names it lists, each from its shard."""
    from safetensors import SafetensorError, safe_open

    path = _model_dir(model_dir)
    index_path = path / INDEX_FILE
    weight_map = _read_index(index_path) if index_path.is_file() else None
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                names = list(f.keys())
                if weight_map is not None:
                    wanted = [n for n, shard in weight_map.items() if shard == file.name]
                    absent = sorted(set(wanted) - set(names))
                    if absent:
                        raise ValueError(f"{file}: {INDEX_FILE} places {len(absent)} tensor(s) in "
                                         f"this shard that it does not hold, e.g. {absent[:5]}")
                    names = wanted
                for name in names:
                    tensor = f.get_tensor(name)
                    if dtype is not None and tensor.dtype != dtype:
                        tensor = tensor.to(dtype)
                    yield name, tensor
        except SafetensorError as e:
            raise ValueError(f"cannot read safetensors file {file} (truncated or corrupt?): "
                             f"{e}") from e


def load_hf_config(model_dir: str | os.PathLike):
    """The transformers config of a local checkpoint directory (never goes to a hub)."""
    from transformers import AutoConfig

    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise ValueError(f"model directory {path} does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise ValueError(f"model directory {path} has no config.json (expected a Hugging Face "
                         f"checkpoint directory: config.json plus *.safetensors)")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load the config of {path}: {e}") from e
