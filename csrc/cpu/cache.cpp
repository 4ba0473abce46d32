// reshape_and_cache and copy_blocks on the CPU: row copies into and between paged KV blocks.
#include <cstring>

#include "core/checks.h"
#include "cpu/new_tokens.h"
#include "cpu/team.h"
#include "ops.h"

namespace vllm_cpu {

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  vllm::check_reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping);
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1), head_size = key.size(2);
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(2);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  check_slots(slots, num_tokens, num_blocks * block_size);
  const int64_t elem = key.element_size();
  const int64_t row_bytes = head_size * elem;
  auto* k_src = static_cast<const char*>(key.data_ptr());
  auto* v_src = static_cast<const char*>(value.data_ptr());
  auto* k_dst = static_cast<char*>(key_cache.data_ptr());
  auto* v_dst = static_cast<char*>(value_cache.data_ptr());
  parallel_for(0, num_tokens, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(num_kv_heads * row_bytes, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;  // padding token
      const int64_t block = slot / block_size, offset = slot % block_size;
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        // cache index [block, h, offset, :]
        const int64_t dst = ((block * num_kv_heads + h) * block_size + offset) * row_bytes;
        std::memcpy(k_dst + dst, k_src + (t * key.stride(0) + h * key.stride(1)) * elem,
                    row_bytes);
        std::memcpy(v_dst + dst, v_src + (t * value.stride(0) + h * value.stride(1)) * elem,
                    row_bytes);
      }
    }
  });
}

void copy_blocks(const std::vector<at::Tensor>& key_caches,
                 const std::vector<at::Tensor>& value_caches, const at::Tensor& block_mapping) {
  vllm::check_copy_blocks_args(key_caches, value_caches, block_mapping);
  const int64_t num_layers = key_caches.size(), num_pairs = block_mapping.size(0);
  if (num_layers == 0 || num_pairs == 0) return;
  const int64_t num_blocks = key_caches[0].size(0);
  const int64_t block_bytes = key_caches[0].numel() / num_blocks * key_caches[0].element_size();
  const int64_t* mapping = block_mapping.data_ptr<int64_t>();
  for (int64_t p = 0; p < 2 * num_pairs; ++p) {
    TORCH_CHECK(mapping[p] >= 0 && mapping[p] < num_blocks, "block_mapping holds block ",
                mapping[p], ", outside the cache's ", num_blocks, " blocks");
  }
  parallel_for(0, num_layers * num_pairs, std::max<int64_t>(1, (1 << 17) / std::max<int64_t>(block_bytes, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t layer = i / num_pairs, pair = i % num_pairs;
      const int64_t src = mapping[2 * pair] * block_bytes, dst = mapping[2 * pair + 1] * block_bytes;
      for (const at::Tensor* cache : {&key_caches[layer], &value_caches[layer]}) {
        char* base = static_cast<char*>(cache->data_ptr());
        std::memcpy(base + dst, base + src, block_bytes);
      }
    }
  });
}

}  // namespace vllm_cpu
