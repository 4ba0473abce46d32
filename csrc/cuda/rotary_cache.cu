// rotary_embedding_and_cache on CUDA: the rotary embedding of a step's queries and keys and the
// write of its keys and values into the paged cache in one launch (two before: the profile of a
// 7B decode step on the H200 spent 0.12 ms in 32 rotary kernels and 0.03 ms in 32 cache writes,
// for a few kilobytes each).
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

// grid (num_tokens, num_heads + num_kv_heads): a block per (token, head), so that a decode
// step's few tokens still spread over many SMs and each thread does one or two elements (the
// separate rotary kernel's block per token looped 8 times at the 7B shape: 3.8 us a launch).
// Query rows are q_stride elements apart, key and value rows k_stride and v_stride, heads
// head_size apart inside a row; cos_sin_cache as for rotary_embedding; caches [num_blocks,
// num_kv_heads, block_size, head_size]. A query head's block rotates it in place; a key head's
// block rotates it in place and writes the rotated key, the unrotated tail and the value into
// the cache. Out-of-range positions leave the token unrotated and out-of-range slots skip its
// cache write, as the two separate kernels do.
template <typename T>
__global__ void rotary_embedding_and_cache_kernel(
    const int64_t* __restrict__ positions, T* __restrict__ query, T* __restrict__ key,
    const T* __restrict__ value, const T* __restrict__ cos_sin_cache, T* __restrict__ key_cache,
    T* __restrict__ value_cache, const int64_t* __restrict__ slot_mapping, int64_t q_stride,
    int64_t k_stride, int64_t v_stride, int num_heads, int num_kv_heads, int head_size,
    int rot_dim, int64_t max_position, int block_size, int64_t num_slots, bool is_neox) {
  chain_in();
  const int64_t t = blockIdx.x;
  const bool is_q = static_cast<int>(blockIdx.y) < num_heads;
  const int head = is_q ? blockIdx.y : blockIdx.y - num_heads;
  const int64_t pos = positions[t];
  const bool rotate = pos >= 0 && pos < max_position;
  const int64_t slot = is_q ? -1 : slot_mapping[t];
  const bool cached = slot >= 0 && slot < num_slots;
  T* x = (is_q ? query + t * q_stride : key + t * k_stride) + static_cast<int64_t>(head) * head_size;
  // the cache rows [block, head, offset, :]
  const int64_t row = cached ? ((slot / block_size * num_kv_heads + head) * block_size +
                                slot % block_size) * head_size : 0;
  const int half = rot_dim / 2;
  if (rotate) {
    const T* cos = cos_sin_cache + pos * rot_dim;
    const T* sin = cos + half;
    for (int p = threadIdx.x; p < half; p += blockDim.x) {
      rotate_pair(x, cos, sin, p, half, is_neox);
      if (cached) {  // the pair this thread just wrote, into the cache as well
        const int2 i = pair_indices(p, half, is_neox);
        key_cache[row + i.x] = x[i.x];
        key_cache[row + i.y] = x[i.y];
      }
    }
  }
  if (!cached) return;
  // the key elements no pair above wrote (all of them when unrotated), and the value
  const int k_from = rotate ? rot_dim : 0;
  const T* v = value + t * v_stride + static_cast<int64_t>(head) * head_size;
  for (int e = threadIdx.x; e < head_size; e += blockDim.x) {
    if (e >= k_from) key_cache[row + e] = x[e];
    value_cache[row + e] = v[e];
  }
}

}  // namespace

void rotary_embedding_and_cache(const at::Tensor& positions, at::Tensor& query, at::Tensor& key,
                                const at::Tensor& value, int64_t head_size,
                                const at::Tensor& cos_sin_cache, bool is_neox,
                                at::Tensor& key_cache, at::Tensor& value_cache,
                                const at::Tensor& slot_mapping) {
  const int64_t num_heads = vllm::check_rotary_embedding_and_cache_args(
      positions, query, key, value, head_size, cos_sin_cache, key_cache, value_cache, slot_mapping);
  const int64_t num_tokens = positions.size(0), num_kv_heads = key.size(1);
  if (num_tokens == 0 || num_kv_heads == 0) return;
  const int64_t rot_dim = cos_sin_cache.size(1);
  const int64_t q_stride = query.dim() == 2 ? query.stride(0) : num_heads * head_size;
  const int threads = static_cast<int>(std::min<int64_t>(256, (head_size + 31) / 32 * 32));
  TORCH_CHECK(num_heads + num_kv_heads <= 65535, "rotary_embedding_and_cache: too many heads");
  const c10::cuda::OptionalCUDAGuard guard(device_of(query));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(num_heads + num_kv_heads));
  VLLM_CUDA_DISPATCH_FLOAT_TYPES(query.scalar_type(), "rotary_embedding_and_cache", [&] {
    launch_kernel(
        rotary_embedding_and_cache_kernel<scalar_t>, grid, dim3(threads), 0, stream,
        positions.data_ptr<int64_t>(), query.data_ptr<scalar_t>(), key.data_ptr<scalar_t>(),
        value.data_ptr<scalar_t>(), cos_sin_cache.data_ptr<scalar_t>(),
        key_cache.data_ptr<scalar_t>(), value_cache.data_ptr<scalar_t>(),
        slot_mapping.data_ptr<int64_t>(), q_stride, key.stride(0), value.stride(0),
        static_cast<int>(num_heads), static_cast<int>(num_kv_heads), static_cast<int>(head_size),
        static_cast<int>(rot_dim), cos_sin_cache.size(0), static_cast<int>(key_cache.size(2)),
        key_cache.size(0) * key_cache.size(2), is_neox);
  });
}

}  // namespace vllm_cuda
