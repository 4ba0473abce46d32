// rotary_embedding_and_cache on the CPU: the two ops in turn (the CPU's decode steps of few rows
// run them inside decode_layers; this op gives the layers one call on either device).
#include "core/checks.h"
#include "ops.h"

namespace vllm_cpu {

void rotary_embedding_and_cache(const at::Tensor& positions, at::Tensor& query, at::Tensor& key,
                                const at::Tensor& value, int64_t head_size,
                                const at::Tensor& cos_sin_cache, bool is_neox,
                                at::Tensor& key_cache, at::Tensor& value_cache,
                                const at::Tensor& slot_mapping) {
  vllm::check_rotary_embedding_and_cache_args(positions, query, key, value, head_size,
                                              cos_sin_cache, key_cache, value_cache, slot_mapping);
  at::Tensor key_rows = key.flatten(1);  // a view: the checks ask for adjacent heads
  rotary_embedding(positions, query, key_rows, head_size, cos_sin_cache, is_neox);
  reshape_and_cache(key, value, key_cache, value_cache, slot_mapping);
}

}  // namespace vllm_cpu
