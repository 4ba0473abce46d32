#!/usr/bin/env bash
# On the lent GPU machine (its own python3 with a CUDA torch, no internet): build vllm._C with CPU
# and CUDA kernels against that torch, run the whole kernel suite (the `cuda`-marked tests
# included, dispatch shown in one process), then the kernel benchmark on CPU and CUDA.
#   bash scripts/gpu_check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-out}}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export VLLM_TARGET_DEVICE=cuda MAX_JOBS="${MAX_JOBS:-16}" PYTHONUNBUFFERED=1

echo "== environment"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
nvcc --version | tail -1

echo "== build"
start=$(date +%s)
"$PY" -m pip install --no-build-isolation --no-deps --no-index -e . 2>&1 | tail -3 | tee "$OUT_DIR/build.log"
echo "build took $(( $(date +%s) - start )) s"
"$PY" -c "import torch, vllm._C as C; print('vllm._C', C.__file__, 'cpu_isa', C.cpu_isa, 'cuda', C.cuda_enabled); assert C.cuda_enabled"

echo "== tests (CPU and CUDA in one process)"
set +e
"$PY" -m pytest tests -q -rs -s -p no:cacheprovider ${PYTEST_ARGS:-} > "$OUT_DIR/tests.log" 2>&1
status=$?
set -e
grep "CUDA kernels" "$OUT_DIR/tests.log" | cut -c1-150 || true
tail -25 "$OUT_DIR/tests.log"
if [ "$status" -ne 0 ]; then echo "tests failed ($status)"; grep -E "^(FAILED|ERROR)" "$OUT_DIR/tests.log" | head -30; fi

echo "== benchmarks"
"$PY" benchmarks/benchmark_kernels.py --device all --dtype bfloat16 --output-json "$OUT_DIR/kernels_bf16.json"
"$PY" benchmarks/benchmark_kernels.py --device cuda --dtype float16 --output-json "$OUT_DIR/kernels_fp16.json"
exit "$status"
