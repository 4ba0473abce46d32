// rms_norm and fused_add_rms_norm on CUDA: one thread block per token row.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "core/checks.h"
#include "cuda/dispatch.h"
#include "cuda/launch.cuh"
#include "ops.h"

namespace vllm_cuda {
namespace {

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Sum of v over the block; every thread gets the result. shared holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (blockDim.x + 31) / 32 ? shared[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// out[row] = T(T(x * inv_rms) * weight), in packs of N elements; hidden % N == 0.
// x/out may alias (fused_add_rms_norm); each thread rewrites only the packs it read.
template <typename T, int N>
__device__ __forceinline__ void scale_row(T* out, const T* x, const T* weight, int hidden,
                                          float inv_rms) {
  using P = Pack<T, N>;
  for (int i = threadIdx.x; i < hidden / N; i += blockDim.x) {
    const P xv = reinterpret_cast<const P*>(x)[i];
    const P wv = reinterpret_cast<const P*>(weight)[i];
    P o;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      // the normalised value is rounded to T before the weight, as torch's (x * r).to(T) * w
      const float normed = static_cast<float>(static_cast<T>(static_cast<float>(xv.v[e]) * inv_rms));
      o.v[e] = static_cast<T>(normed * static_cast<float>(wv.v[e]));
    }
    reinterpret_cast<P*>(out)[i] = o;
  }
}

// grid (num_tokens); input rows are in_stride elements apart, out [num_tokens, hidden].
template <typename T, int N>
__global__ void rms_norm_kernel(T* out, const T* input,
                                const T* __restrict__ weight, int64_t in_stride, int hidden,
                                float epsilon) {
  __shared__ float shared[32];
  using P = Pack<T, N>;
  chain_in();
  const T* x = input + blockIdx.x * in_stride;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < hidden / N; i += blockDim.x) {
    const P xv = reinterpret_cast<const P*>(x)[i];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float f = static_cast<float>(xv.v[e]);
      sum_sq += f * f;
    }
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, shared) / hidden + epsilon);
  scale_row<T, N>(out + static_cast<int64_t>(blockIdx.x) * hidden, x, weight, hidden, inv_rms);
}

// grid (num_tokens); residual = T(input + residual), then input = rms_norm(residual).
template <typename T, int N>
__global__ void fused_add_rms_norm_kernel(T* __restrict__ input, T* __restrict__ residual,
                                          const T* __restrict__ weight, int hidden,
                                          float epsilon) {
  __shared__ float shared[32];
  using P = Pack<T, N>;
  chain_in();
  T* x = input + static_cast<int64_t>(blockIdx.x) * hidden;
  T* r = residual + static_cast<int64_t>(blockIdx.x) * hidden;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < hidden / N; i += blockDim.x) {
    const P xv = reinterpret_cast<const P*>(x)[i];
    P rv = reinterpret_cast<const P*>(r)[i];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      rv.v[e] = static_cast<T>(static_cast<float>(xv.v[e]) + static_cast<float>(rv.v[e]));
      const float f = static_cast<float>(rv.v[e]);  // the rounded sum, as stored
      sum_sq += f * f;
    }
    reinterpret_cast<P*>(r)[i] = rv;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, shared) / hidden + epsilon);
  // the same thread reads back the residual packs it wrote above
  scale_row<T, N>(x, r, weight, hidden, inv_rms);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int threads_for(int64_t packs) {
  return static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (packs + 31) / 32 * 32)));
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight, double epsilon) {
  vllm::check_rms_norm_args(out, input, weight);
  const int64_t hidden = input.size(-1);
  const int64_t num_tokens = input.numel() / std::max<int64_t>(hidden, 1);
  if (num_tokens == 0 || hidden == 0) return;
  const int64_t in_stride = input.dim() == 2 ? input.stride(0) : hidden;
  const c10::cuda::OptionalCUDAGuard guard(device_of(input));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  VLLM_CUDA_DISPATCH_FLOAT_TYPES(input.scalar_type(), "rms_norm", [&] {
    constexpr int N = 16 / sizeof(scalar_t);
    const bool vec = hidden % N == 0 && in_stride % N == 0 && aligned16(input.data_ptr()) &&
                     aligned16(out.data_ptr()) && aligned16(weight.data_ptr());
    auto kernel = vec ? rms_norm_kernel<scalar_t, N> : rms_norm_kernel<scalar_t, 1>;
    launch_kernel(kernel, dim3(num_tokens), dim3(threads_for(vec ? hidden / N : hidden)), 0, stream,
                  out.data_ptr<scalar_t>(), input.data_ptr<scalar_t>(),
                  weight.data_ptr<scalar_t>(), in_stride, static_cast<int>(hidden),
                  static_cast<float>(epsilon));
  });
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  vllm::check_rms_norm_args(residual, input, weight);
  TORCH_CHECK(input.is_contiguous(), "input must be contiguous");
  const int64_t hidden = input.size(-1);
  const int64_t num_tokens = input.numel() / std::max<int64_t>(hidden, 1);
  if (num_tokens == 0 || hidden == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(device_of(input));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  VLLM_CUDA_DISPATCH_FLOAT_TYPES(input.scalar_type(), "fused_add_rms_norm", [&] {
    constexpr int N = 16 / sizeof(scalar_t);
    const bool vec = hidden % N == 0 && aligned16(input.data_ptr()) &&
                     aligned16(residual.data_ptr()) && aligned16(weight.data_ptr());
    auto kernel = vec ? fused_add_rms_norm_kernel<scalar_t, N> : fused_add_rms_norm_kernel<scalar_t, 1>;
    launch_kernel(kernel, dim3(num_tokens), dim3(threads_for(vec ? hidden / N : hidden)), 0, stream,
                  input.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(),
                  weight.data_ptr<scalar_t>(), static_cast<int>(hidden),
                  static_cast<float>(epsilon));
  });
}

}  // namespace vllm_cuda
