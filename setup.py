"""Builds vllm._C with CMake against the installed torch (install with --no-build-isolation).

VLLM_TARGET_DEVICE=auto|cpu|cuda picks the kernels: `auto` adds the CUDA sources when the
installed torch was built with CUDA and nvcc is found, otherwise builds the CPU kernels only.
The CPU kernels are compiled in every build.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()


def _find_nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def resolve_target_device() -> str:
    import torch

    target = os.environ.get("VLLM_TARGET_DEVICE", "auto").lower()
    if target not in ("auto", "cpu", "cuda"):
        raise ValueError(f"VLLM_TARGET_DEVICE must be auto, cpu or cuda, got {target!r}")
    torch_has_cuda = torch.version.cuda is not None
    if target == "cuda" and not torch_has_cuda:
        raise RuntimeError(
            f"VLLM_TARGET_DEVICE=cuda but the installed torch {torch.__version__} has no CUDA")
    if target == "cuda" and _find_nvcc() is None:
        raise RuntimeError("VLLM_TARGET_DEVICE=cuda but nvcc was not found (set CUDA_HOME)")
    if target == "auto":
        target = "cuda" if torch_has_cuda and _find_nvcc() else "cpu"
    return target


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import torch

        target = resolve_target_device()
        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = ROOT / "build" / f"cmake-{target}"
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DVLLM_TARGET_DEVICE={target}",
            f"-DVLLM_CPU_ISA={os.environ.get('VLLM_CPU_ISA', 'auto')}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('CMAKE_BUILD_TYPE', 'Release')}",
        ]
        if target == "cuda":
            args.append(f"-DCMAKE_CUDA_COMPILER={_find_nvcc()}")
            if "VLLM_CUDA_ARCHS" in os.environ:
                args.append(f"-DVLLM_CUDA_ARCHS={os.environ['VLLM_CUDA_ARCHS']}")
        if shutil.which("ninja"):
            args.append("-GNinja")
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        print(f"building vllm._C for {target} in {build_dir}", flush=True)
        subprocess.check_call(["cmake", str(ROOT), *args], cwd=build_dir)
        verbose = ["-v"] if os.environ.get("VERBOSE") else []
        subprocess.check_call(["cmake", "--build", ".", "-j", jobs, *verbose], cwd=build_dir)


setup(
    name="vllm",
    version="0.1.0",
    description="A vLLM-compatible engine with heterogeneous (CPU draft, GPU target) "
    "speculative decoding",
    packages=find_packages(include=["vllm", "vllm.*"]),
    python_requires=">=3.10",
    ext_modules=[CMakeExtension("vllm._C")],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["vllm=vllm.entrypoints.cli.main:main"]},
)
