// How this extension's CUDA kernels are launched: programmatic dependent launch (PDL, sm_90+).
//
// A decode step at batch 1 is a chain of ~9 kernels a layer, each waiting for the one before:
// at the Llama-2-7B shape on the H200 the GEMVs stream the weights at the HBM rate (3.12 of
// the 3.84 ms step), and the rest is the small kernels between them (norms, rotary + cache
// write, silu, attention's fixed cost) and the gaps around each launch, during which HBM idles.
// With VLLM_CUDA_PDL=1 every kernel here is launched with programmatic stream serialization:
// each kernel first lets its successor launch (griddepcontrol.launch_dependents: the successor
// starts once every block of this grid has started), then waits for its predecessor to
// complete (griddepcontrol.wait) before it reads or writes anything another kernel touches.
// A linear_small launch, before waiting, requests its blocks' weight rows into L2 (weights are
// written once, at load, never by a kernel it could overlap), so the weights of the next
// projection stream while the small kernels run. Off (0, the default) the launches are plain
// <<<>>> launches and the two instructions do nothing; a kernel of torch's between ours is
// launched without the attribute and so waits for ours to complete, as always. Measured on the
// H100 (run 25, profile_step.py, graph replay): no gain (7B batch 1 5.107 -> 5.199 ms, batches
// 1x5 to 32 within 1%), so it stays off; the small kernels did overlap (their measured spans
// grew by the time they waited), but the step did not shorten.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace vllm_cuda {

// The successor grid may launch once every block of this grid has executed this (or exited).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the grids this one depends on have completed and their writes are visible; at
// once where it was not launched with PDL.
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The kernels' first statement: let the next kernel launch, then wait for the previous one.
__device__ __forceinline__ void chain_in() {
  launch_dependents();
  wait_for_predecessor();
}

// `bytes` (a multiple of 16) at p (16-byte aligned) towards L2, one instruction (sm_90+).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// VLLM_CUDA_PDL (read at every launch): 1 on sm_90+ devices, else off.
bool pdl_enabled();

// A cudaLaunchKernelEx configuration of n attributes (attrs must outlive it).
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                        cudaLaunchAttribute* attrs, int n) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = static_cast<unsigned>(n);
  return config;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization where
// pdl_enabled(); extra: further launch attributes (a cluster dimension), n_extra of them (<= 3).
template <typename... Params, typename... Args>
void launch_kernel_ex(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, const cudaLaunchAttribute* extra, int n_extra,
                      Args&&... args) {
  cudaLaunchAttribute attrs[4];
  int n = 0;
  for (int i = 0; i < n_extra && n < 3; ++i) attrs[n++] = extra[i];
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (n == 0) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const cudaLaunchConfig_t config = launch_config(grid, block, smem, stream, attrs, n);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  launch_kernel_ex(kernel, grid, block, smem, stream, nullptr, 0, std::forward<Args>(args)...);
}

}  // namespace vllm_cuda
