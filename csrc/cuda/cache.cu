// reshape_and_cache and copy_blocks on CUDA: row copies into and between paged KV blocks.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "core/checks.h"
#include "cuda/launch.cuh"
#include "ops.h"

namespace vllm_cuda {
namespace {

// Both ops copy raw bytes, so they serve every dtype; U is the widest unit (16, 8, 4, 2 or 1
// bytes) that divides every row length, stride and base address involved.
template <int BYTES>
struct Unit;
template <> struct Unit<16> { using type = uint4; };
template <> struct Unit<8> { using type = uint2; };
template <> struct Unit<4> { using type = uint32_t; };
template <> struct Unit<2> { using type = uint16_t; };
template <> struct Unit<1> { using type = uint8_t; };

int unit_bytes(std::initializer_list<int64_t> quantities) {
  int unit = 16;
  for (int64_t q : quantities) {
    while (q % unit != 0) unit /= 2;
  }
  return unit;
}

#define VLLM_DISPATCH_UNIT(UNIT, ...)                  \
  switch (UNIT) {                                      \
    case 16: { using U = Unit<16>::type; __VA_ARGS__(); break; } \
    case 8: { using U = Unit<8>::type; __VA_ARGS__(); break; }   \
    case 4: { using U = Unit<4>::type; __VA_ARGS__(); break; }   \
    case 2: { using U = Unit<2>::type; __VA_ARGS__(); break; }   \
    default: { using U = Unit<1>::type; __VA_ARGS__(); break; }  \
  }

// grid (num_tokens); key/value rows [num_tokens, num_kv_heads, row] at byte strides
// (stride0, stride1); caches [num_blocks, num_kv_heads, block_size, row]; row in units of U.
template <typename U>
__global__ void reshape_and_cache_kernel(const char* __restrict__ key, const char* __restrict__ value,
                                         char* __restrict__ key_cache, char* __restrict__ value_cache,
                                         const int64_t* __restrict__ slot_mapping, int64_t k_stride0,
                                         int64_t k_stride1, int64_t v_stride0, int64_t v_stride1,
                                         int num_kv_heads, int row_units, int block_size,
                                         int64_t num_slots) {
  chain_in();
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  // negative slots are padding; slots past the cache (which the CPU rejects on the host, a
  // check that would need a sync here) are skipped rather than written out of bounds
  if (slot < 0 || slot >= num_slots) return;
  const int64_t block = slot / block_size, offset = slot % block_size;
  const int64_t row_bytes = static_cast<int64_t>(row_units) * sizeof(U);
  for (int i = threadIdx.x; i < num_kv_heads * row_units; i += blockDim.x) {
    const int h = i / row_units, u = i % row_units;
    // cache index [block, h, offset, :]
    const int64_t dst = ((block * num_kv_heads + h) * block_size + offset) * row_bytes;
    reinterpret_cast<U*>(key_cache + dst)[u] =
        reinterpret_cast<const U*>(key + t * k_stride0 + h * k_stride1)[u];
    reinterpret_cast<U*>(value_cache + dst)[u] =
        reinterpret_cast<const U*>(value + t * v_stride0 + h * v_stride1)[u];
  }
}

// grid (num_pairs, num_layers); cache_ptrs [2 * num_layers] = key caches then value caches;
// block_mapping [num_pairs, 2] = (src, dst); each cache block is block_units units of U.
template <typename U>
__global__ void copy_blocks_kernel(const int64_t* __restrict__ cache_ptrs,
                                   const int64_t* __restrict__ block_mapping, int num_layers,
                                   int64_t block_units, int64_t num_blocks) {
  const int64_t src = block_mapping[2 * blockIdx.x], dst = block_mapping[2 * blockIdx.x + 1];
  // out-of-range blocks (rejected by the CPU on the host) are skipped without a sync
  if (src < 0 || src >= num_blocks || dst < 0 || dst >= num_blocks) return;
  for (int kv = 0; kv < 2; ++kv) {
    U* base = reinterpret_cast<U*>(cache_ptrs[kv * num_layers + blockIdx.y]);
    const U* from = base + src * block_units;
    U* to = base + dst * block_units;
    for (int64_t i = threadIdx.x; i < block_units; i += blockDim.x) to[i] = from[i];
  }
}

}  // namespace

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  vllm::check_reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping);
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1), head_size = key.size(2);
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(2);
  if (num_tokens == 0 || num_kv_heads == 0 || head_size == 0) return;
  const int64_t elem = key.element_size();
  const int64_t row_bytes = head_size * elem;
  const int unit = unit_bytes({row_bytes, key.stride(0) * elem, key.stride(1) * elem,
                               value.stride(0) * elem, value.stride(1) * elem,
                               reinterpret_cast<int64_t>(key.data_ptr()),
                               reinterpret_cast<int64_t>(value.data_ptr()),
                               reinterpret_cast<int64_t>(key_cache.data_ptr()),
                               reinterpret_cast<int64_t>(value_cache.data_ptr())});
  const int64_t row_units = row_bytes / unit;
  const int threads = static_cast<int>(
      std::min<int64_t>(512, std::max<int64_t>(32, (num_kv_heads * row_units + 31) / 32 * 32)));
  const c10::cuda::OptionalCUDAGuard guard(device_of(key));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  VLLM_DISPATCH_UNIT(unit, [&] {
    launch_kernel(
        reshape_and_cache_kernel<U>, dim3(num_tokens), dim3(threads), 0, stream,
        static_cast<const char*>(key.data_ptr()), static_cast<const char*>(value.data_ptr()),
        static_cast<char*>(key_cache.data_ptr()), static_cast<char*>(value_cache.data_ptr()),
        slot_mapping.data_ptr<int64_t>(), key.stride(0) * elem, key.stride(1) * elem,
        value.stride(0) * elem, value.stride(1) * elem, static_cast<int>(num_kv_heads),
        static_cast<int>(row_units), static_cast<int>(block_size), num_blocks * block_size);
  });
}

void copy_blocks(const std::vector<at::Tensor>& key_caches,
                 const std::vector<at::Tensor>& value_caches, const at::Tensor& block_mapping) {
  vllm::check_copy_blocks_args(key_caches, value_caches, block_mapping);
  const int64_t num_layers = key_caches.size(), num_pairs = block_mapping.size(0);
  if (num_layers == 0 || num_pairs == 0) return;
  const int64_t num_blocks = key_caches[0].size(0);
  if (num_blocks == 0) return;
  const int64_t block_bytes = key_caches[0].numel() / num_blocks * key_caches[0].element_size();
  TORCH_CHECK(num_pairs <= INT32_MAX && num_layers <= 65535, "copy_blocks: too many pairs or layers");
  // The caches' addresses travel as one small int64 tensor, staged in pinned memory so the
  // host-to-device copy is asynchronous (the pinned allocator keeps it alive until it is done).
  at::Tensor ptrs = at::empty({2 * num_layers}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* p = ptrs.data_ptr<int64_t>();
  std::vector<int64_t> quantities{block_bytes};
  for (int64_t l = 0; l < num_layers; ++l) {
    p[l] = reinterpret_cast<int64_t>(key_caches[l].data_ptr());
    p[num_layers + l] = reinterpret_cast<int64_t>(value_caches[l].data_ptr());
    quantities.push_back(p[l]);
    quantities.push_back(p[num_layers + l]);
  }
  int unit = 16;
  for (int64_t q : quantities) unit = std::min(unit, unit_bytes({q}));
  const c10::cuda::OptionalCUDAGuard guard(device_of(block_mapping));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor ptrs_dev = ptrs.to(block_mapping.device(), /*non_blocking=*/true);
  const dim3 grid(static_cast<unsigned>(num_pairs), static_cast<unsigned>(num_layers));
  VLLM_DISPATCH_UNIT(unit, [&] {
    copy_blocks_kernel<U><<<grid, 256, 0, stream>>>(ptrs_dev.data_ptr<int64_t>(),
                                                    block_mapping.data_ptr<int64_t>(),
                                                    static_cast<int>(num_layers),
                                                    block_bytes / unit, num_blocks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace vllm_cuda
