"""Read a GGUF checkpoint (llama.cpp's file format) into Hugging Face parameter names.

    ckpt = load_gguf(path)
    ckpt.config              # transformers LlamaConfig / Qwen2Config, as AutoConfig gives it
    ckpt.load_tokenizer()    # transformers fast tokenizer built from the GGUF's vocabulary
    for name, tensor in ckpt.iter_weights():   # ("model.layers.0.self_attn.q_proj.weight", fp32)
        ...

The tensors are read with the `gguf` package (`GGUFReader`, a memory map) and dequantised one at a
time with `gguf.quants.dequantize`, so the peak memory is the consumer's plus one tensor. For the
`llama` architecture llama.cpp's converter reorders the rows of attn_q / attn_k within each head
(interleaved rotary pairs); they are put back in the rotate-half order that Hugging Face models
(and this engine) use. `qwen2` files are stored in Hugging Face order.

Building the config and tokenizer from the GGUF metadata takes a few seconds (transformers walks
the whole vocabulary); the results are saved with `save_pretrained` into a side directory next to
the file (`<name>-hf/`: config.json, tokenizer.json, tokenizer_config.json, chat template) and
reloaded from there afterwards. The side directory is rebuilt when the GGUF's size or mtime
changes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

GGUF_MAGIC = b"GGUF"

# architectures whose tensors we know how to name; value: rows of attn_q/attn_k are permuted
SUPPORTED_ARCHITECTURES = {"llama": True, "qwen2": False}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# tensors some converters add that carry nothing a Hugging Face model needs
_IGNORED = {"rope_freqs.weight"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")

_SIDECAR_STAMP = "gguf_source.json"


class GGUFError(ValueError):
    """The file is not a readable GGUF checkpoint (or holds something this loader cannot map)."""


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor name; None for tensors to skip."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name in _IGNORED:
        return None
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        raise KeyError(gguf_name)
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's row order for q/k projections (weight [out, in] or bias [out]).

    Within each head llama.cpp stores the rotary pairs interleaved: its row (h, i, j) for
    i < head_dim / 2, j in {0, 1} is the Hugging Face row (h, j, i) (first half / second half of
    the head for rotate-half RoPE). Viewing the rows as [n_heads, head_dim/2, 2] and swapping the
    last two axes puts them back."""
    out = w.shape[0]
    if out % (2 * n_heads):
        raise GGUFError(f"cannot unpermute {w.shape} rows over {n_heads} heads")
    half = out // n_heads // 2
    rest = w.shape[1:]
    return np.ascontiguousarray(
        w.reshape(n_heads, half, 2, *rest).swapaxes(1, 2).reshape(w.shape))


def _open_reader(path: Path):
    """gguf.GGUFReader over `path`, made ~3x faster to open.

    GGUFReader walks every vocabulary entry as a slice of its np.memmap, and numpy's memmap
    subclass bookkeeping on each slice dominates (several seconds for a 151k-token vocabulary).
    The subclass below keeps the memmap alive but hands the reader a plain ndarray view of it,
    so the slices are ordinary views of the same mapped bytes: identical fields and tensors."""
    import gguf

    class _PlainViewReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value):
            self._memmap = value
            self._plain_data = value.view(np.ndarray)

    try:
        return _PlainViewReader(path, "r")
    except AttributeError:  # a gguf release that no longer sets `data` in __init__
        return gguf.GGUFReader(path, "r")


def _sidecar_dir(path: Path) -> Path:
    stem = path.name[:-len(".gguf")] if path.name.endswith(".gguf") else path.name
    return path.with_name(stem + "-hf")


def _source_stamp(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"file": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class GGUFCheckpoint:
    """One GGUF file: metadata, config, tokenizer and the weights under Hugging Face names."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser().resolve()
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path} is not a GGUF file (starts with {magic!r}, "
                            f"expected {GGUF_MAGIC!r})")
        try:
            self._reader = _open_reader(self.path)
        except Exception as e:  # truncated/corrupt headers fail deep inside numpy
            raise GGUFError(f"cannot read GGUF file {self.path} (truncated or corrupt?): "
                            f"{type(e).__name__}: {e}") from e
        self._check_tensor_extents()

        self.architecture = self.metadata("general.architecture")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise GGUFError(f"{self.path}: architecture {self.architecture!r} is not supported "
                            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._names: dict[str, str] = {}
        for name in self._tensors:
            try:
                mapped = hf_name(name)
            except KeyError:
                raise GGUFError(f"{self.path}: tensor {name!r} has no Hugging Face name in the "
                                f"{self.architecture} mapping") from None
            if mapped is not None:
                self._names[name] = mapped

    # ------------------------------------------------------------------------------------------
    # metadata

    def _check_tensor_extents(self) -> None:
        size = self.path.stat().st_size
        for t in self._reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size or t.data.nbytes != t.n_bytes:
                raise GGUFError(f"GGUF file {self.path} is truncated or corrupt: tensor {t.name!r} "
                                f"needs bytes up to {end}, the file has {size}")

    def metadata(self, key: str, default: Any = KeyError) -> Any:
        """One metadata value (str, number, or list), e.g. 'llama.block_count'."""
        field = self._reader.get_field(key)
        if field is None:
            if default is KeyError:
                raise GGUFError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return field.contents()

    def arch_metadata(self, key: str, default: Any = KeyError) -> Any:
        return self.metadata(f"{self.architecture}.{key}", default)

    @property
    def num_heads(self) -> int:
        return int(self.arch_metadata("attention.head_count"))

    @property
    def num_kv_heads(self) -> int:
        return int(self.arch_metadata("attention.head_count_kv", self.num_heads))

    @property
    def tie_word_embeddings(self) -> bool:
        """True when the file has no separate output matrix (lm_head shares the embedding)."""
        return "output.weight" not in self._tensors

    # ------------------------------------------------------------------------------------------
    # config and tokenizer (cached in a side directory)

    @property
    def sidecar_dir(self) -> Path:
        return _sidecar_dir(self.path)

    def _sidecar_valid(self, directory: Path) -> bool:
        try:
            stamp = json.loads((directory / _SIDECAR_STAMP).read_text())
        except (OSError, ValueError):
            return False
        return (stamp == _source_stamp(self.path) and (directory / "config.json").is_file()
                and (directory / "tokenizer.json").is_file())

    def _build_sidecar(self, directory: Path) -> None:
        from transformers import AutoConfig, AutoTokenizer

        logger.info("building config and tokenizer from %s (once; cached in %s)",
                    self.path, directory)
        config = AutoConfig.from_pretrained(self.path.parent, gguf_file=self.path.name)
        tokenizer = AutoTokenizer.from_pretrained(self.path.parent, gguf_file=self.path.name)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".tmp-", dir=directory.parent))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the GGUF next to it is not
            config.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / _SIDECAR_STAMP).write_text(json.dumps(_source_stamp(self.path)) + "\n")
            if directory.exists():
                shutil.rmtree(directory, ignore_errors=True)
            try:
                os.replace(tmp, directory)
            except OSError:
                if not self._sidecar_valid(directory):  # lost a race to a broken one
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @cached_property
    def tokenizer_dir(self) -> Path:
        """A directory with config.json and the tokenizer files (save_pretrained output), usable
        as `AutoTokenizer.from_pretrained(dir)` / `AutoConfig.from_pretrained(dir)`."""
        directory = self.sidecar_dir
        if self._sidecar_valid(directory):
            return directory
        try:
            self._build_sidecar(directory)
        except OSError as e:  # e.g. a read-only cache: build it somewhere private instead
            fallback = Path(tempfile.mkdtemp(prefix="vllm-gguf-hf-")) / directory.name
            logger.warning("cannot write %s (%s); using %s", directory, e, fallback)
            self._build_sidecar(fallback)
            directory = fallback
        return directory

    @cached_property
    def config(self):
        """The transformers config, equal to AutoConfig.from_pretrained(dir, gguf_file=file)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.tokenizer_dir, local_files_only=True)
        # what AutoConfig records when it reads the GGUF itself, so the two compare equal
        config._name_or_path = str(self.path.parent)
        config.transformers_version = None
        if bool(getattr(config, "tie_word_embeddings", False)) != self.tie_word_embeddings:
            logger.warning("%s: config.tie_word_embeddings=%s but the file %s an output matrix",
                           self.path, config.tie_word_embeddings,
                           "lacks" if self.tie_word_embeddings else "has")
        return config

    def load_tokenizer(self):
        """A transformers fast tokenizer built from the GGUF's vocabulary and chat template."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.tokenizer_dir, local_files_only=True)

    # ------------------------------------------------------------------------------------------
    # weights

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Hugging Face name -> shape ([out_features, in_features] for matrices), no reads."""
        return {hf: tuple(int(d) for d in reversed(self._tensors[g].shape.tolist()))
                for g, hf in self._names.items()}

    def _dequantize(self, gguf_name: str) -> np.ndarray:
        import gguf

        t = self._tensors[gguf_name]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise GGUFError(f"{self.path}: tensor {gguf_name!r}: {e}") from e
        w = np.asarray(w, dtype=np.float32).reshape(shape)
        if SUPPORTED_ARCHITECTURES[self.architecture]:
            if gguf_name.endswith((".attn_q.weight", ".attn_q.bias")):
                w = unpermute_rotary_rows(w, self.num_heads)
            elif gguf_name.endswith((".attn_k.weight", ".attn_k.bias")):
                w = unpermute_rotary_rows(w, self.num_kv_heads)
        if not w.flags.writeable:
            w = np.array(w)  # F32 tensors come back as views of the read-only memory map
        return w

    def iter_weights(self, dtype: torch.dtype = torch.float32
                     ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (Hugging Face name, tensor) for every weight, dequantised, in file order. No
        lm_head.weight when the embedding is tied (the file has no output matrix)."""
        for gguf_name, name in self._names.items():
            tensor = torch.from_numpy(self._dequantize(gguf_name))
            if dtype != torch.float32:
                tensor = tensor.to(dtype)
            yield name, tensor

    def __repr__(self) -> str:
        return (f"GGUFCheckpoint({str(self.path)!r}, arch={self.architecture}, "
                f"tensors={len(self._names)})")


def load_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Open a GGUF checkpoint: validates the header and tensor extents, reads nothing else."""
    return GGUFCheckpoint(path)
