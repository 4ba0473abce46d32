"""get_tokenizer: the HF fast tokenizer of a checkpoint directory, a GGUF file, or --tokenizer."""
import os
from typing import Any, Optional

from vllm.config import ModelConfig


def get_tokenizer(model_config: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    path: Optional[str] = model_config.tokenizer
    if path is None and model_config.model.endswith(".gguf"):
        from vllm.model_executor.model_loader.loader import open_gguf
        return open_gguf(model_config.model).load_tokenizer()
    path = path or model_config.model
    if not os.path.exists(path):
        raise ValueError(f"tokenizer path {path!r} does not exist")
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {path!r}: {e}") from e
