// silu_and_mul on CUDA: out = silu(gate) * up, elementwise over [num_tokens, 2 * d].
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

constexpr int kThreads = 256;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// grid (num_tokens, ceil(d / N / kThreads)); each thread handles one pack of N elements.
// input [num_tokens, 2 * d] (gate then up), out [num_tokens, d]; d % N == 0.
template <typename T, int N>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ input, int64_t d) {
  using P = Pack<T, N>;
  chain_in();
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (i >= d / N) return;
  const T* gate = input + static_cast<int64_t>(blockIdx.x) * 2 * d;
  const P g = reinterpret_cast<const P*>(gate)[i];
  const P u = reinterpret_cast<const P*>(gate + d)[i];
  P o;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const float x = static_cast<float>(g.v[e]);
    // silu is rounded to T before the product, as torch's silu(gate) * up is
    const float silu = static_cast<float>(static_cast<T>(x / (1.f + __expf(-x))));
    o.v[e] = static_cast<T>(silu * static_cast<float>(u.v[e]));
  }
  reinterpret_cast<P*>(out + static_cast<int64_t>(blockIdx.x) * d)[i] = o;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
void launch(at::Tensor& out, const at::Tensor& input, int64_t d, int64_t num_tokens,
            cudaStream_t stream) {
  constexpr int N = 16 / sizeof(T);
  const bool vec = d % N == 0 && aligned16(input.data_ptr()) && aligned16(out.data_ptr());
  const int64_t packs = vec ? d / N : d;
  const int64_t chunks = (packs + kThreads - 1) / kThreads;
  TORCH_CHECK(chunks <= 65535, "silu_and_mul: d = ", d, " is too large");
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(chunks));
  auto kernel = vec ? silu_and_mul_kernel<T, N> : silu_and_mul_kernel<T, 1>;
  launch_kernel(kernel, grid, dim3(kThreads), 0, stream, out.data_ptr<T>(), input.data_ptr<T>(), d);
}

}  // namespace

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  vllm::check_silu_and_mul_args(out, input);
  const int64_t d = out.size(-1);
  const int64_t num_tokens = out.numel() / std::max<int64_t>(d, 1);
  if (num_tokens == 0 || d == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(device_of(input));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  VLLM_CUDA_DISPATCH_FLOAT_TYPES(input.scalar_type(), "silu_and_mul", [&] {
    launch<scalar_t>(out, input, d, num_tokens, stream);
  });
}

}  // namespace vllm_cuda
