// rotary_embedding on CUDA: rotates query and key heads in place, neox or gpt-j pairing.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "core/checks.h"
#include "cuda/dispatch.h"
#include "cuda/launch.cuh"
#include "cuda/rotary.cuh"
#include "ops.h"

namespace vllm_cuda {
namespace {

// grid (num_tokens); each thread rotates (head, pair) items of query then key.
// query rows are q_stride elements apart with heads contiguous inside ([num_heads, head_size]),
// likewise key; cos_sin_cache [max_position, rot_dim] = [cos (rot_dim / 2) | sin (rot_dim / 2)].
template <typename T>
__global__ void rotary_embedding_kernel(const int64_t* __restrict__ positions, T* __restrict__ query,
                                        T* __restrict__ key, const T* __restrict__ cos_sin_cache,
                                        int64_t q_stride, int64_t k_stride, int num_heads,
                                        int num_kv_heads, int head_size, int rot_dim,
                                        int64_t max_position, bool is_neox) {
  chain_in();
  const int64_t t = blockIdx.x;
  const int64_t pos = positions[t];
  // The CPU rejects such positions on the host; checking here would need a host sync, so the
  // token is left unrotated instead of reading outside the cache.
  if (pos < 0 || pos >= max_position) return;
  const int half = rot_dim / 2;
  const T* cos = cos_sin_cache + pos * rot_dim;
  const T* sin = cos + half;
  const int q_items = num_heads * half;
  const int items = q_items + num_kv_heads * half;
  for (int i = threadIdx.x; i < items; i += blockDim.x) {
    const bool is_q = i < q_items;
    const int j = is_q ? i : i - q_items;
    const int head = j / half, p = j % half;
    T* x = (is_q ? query + t * q_stride : key + t * k_stride) + static_cast<int64_t>(head) * head_size;
    rotate_pair(x, cos, sin, p, half, is_neox);
  }
}

}  // namespace

void rotary_embedding(const at::Tensor& positions, at::Tensor& query, at::Tensor& key,
                      int64_t head_size, const at::Tensor& cos_sin_cache, bool is_neox) {
  const std::pair<int64_t, int64_t> heads =
      vllm::check_rotary_embedding_args(positions, query, key, head_size, cos_sin_cache);
  const int64_t num_heads = heads.first, num_kv_heads = heads.second;
  const int64_t num_tokens = positions.size(0);
  const int64_t rot_dim = cos_sin_cache.size(1);
  if (num_tokens == 0 || rot_dim == 0) return;
  const int64_t q_stride = query.dim() == 2 ? query.stride(0) : num_heads * head_size;
  const int64_t k_stride = key.dim() == 2 ? key.stride(0) : num_kv_heads * head_size;
  const int64_t items = (num_heads + num_kv_heads) * (rot_dim / 2);
  const int threads = static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(32, (items + 31) / 32 * 32)));
  const c10::cuda::OptionalCUDAGuard guard(device_of(query));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  VLLM_CUDA_DISPATCH_FLOAT_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    launch_kernel(
        rotary_embedding_kernel<scalar_t>, dim3(num_tokens), dim3(threads), 0, stream,
        positions.data_ptr<int64_t>(), query.data_ptr<scalar_t>(), key.data_ptr<scalar_t>(),
        cos_sin_cache.data_ptr<scalar_t>(), q_stride, k_stride, static_cast<int>(num_heads),
        static_cast<int>(num_kv_heads), static_cast<int>(head_size), static_cast<int>(rot_dim),
        cos_sin_cache.size(0), is_neox);
  });
}

}  // namespace vllm_cuda
