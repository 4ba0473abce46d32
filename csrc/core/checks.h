// Argument checks shared by the CPU and CUDA launchers: each failure names the argument.
#pragma once

#include <torch/all.h>

#define VLLM_CHECK_CONTIGUOUS(t) TORCH_CHECK((t).is_contiguous(), #t " must be contiguous")
#define VLLM_CHECK_LAST_DIM_CONTIGUOUS(t) \
  TORCH_CHECK((t).stride(-1) == 1, #t " must be contiguous in its last dimension")
#define VLLM_CHECK_DIM(t, n) \
  TORCH_CHECK((t).dim() == (n), #t " must have ", (n), " dimensions, got shape ", (t).sizes())
#define VLLM_CHECK_SAME_DEVICE(a, b)                                                    \
  TORCH_CHECK((a).device() == (b).device(), #b " is on ", (b).device(), " but " #a " is on ", \
              (a).device())
#define VLLM_CHECK_SAME_DTYPE(a, b)                                                     \
  TORCH_CHECK((a).scalar_type() == (b).scalar_type(), #b " has dtype ", (b).scalar_type(), \
              " but " #a " has dtype ", (a).scalar_type())
#define VLLM_CHECK_DTYPE(t, dtype)                                                       \
  TORCH_CHECK((t).scalar_type() == (dtype), #t " must have dtype ", (dtype), ", got ", \
              (t).scalar_type())
#define VLLM_CHECK_SHAPE(a, b) \
  TORCH_CHECK((a).sizes() == (b).sizes(), #a " has shape ", (a).sizes(), " but " #b " has shape ", (b).sizes())

namespace vllm {

// The checks each op makes before any kernel runs, identical on every device.
void check_rms_norm_args(const at::Tensor& out, const at::Tensor& input, const at::Tensor& weight);
void check_silu_and_mul_args(const at::Tensor& out, const at::Tensor& input);
// Returns {num_heads, num_kv_heads}.
std::pair<int64_t, int64_t> check_rotary_embedding_args(const at::Tensor& positions,
                                                       const at::Tensor& query,
                                                       const at::Tensor& key, int64_t head_size,
                                                       const at::Tensor& cos_sin_cache);
void check_reshape_and_cache_args(const at::Tensor& key, const at::Tensor& value,
                                  const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& slot_mapping);
// key/value as for reshape_and_cache, with key's heads adjacent (its rows rotate in place as
// [num_tokens, num_kv_heads * head_size]); returns num_heads.
int64_t check_rotary_embedding_and_cache_args(const at::Tensor& positions, const at::Tensor& query,
                                              const at::Tensor& key, const at::Tensor& value,
                                              int64_t head_size, const at::Tensor& cos_sin_cache,
                                              const at::Tensor& key_cache,
                                              const at::Tensor& value_cache,
                                              const at::Tensor& slot_mapping);
void check_copy_blocks_args(const std::vector<at::Tensor>& key_caches,
                            const std::vector<at::Tensor>& value_caches,
                            const at::Tensor& block_mapping);
void check_paged_attention_args(const at::Tensor& out, const at::Tensor& query,
                                const at::Tensor& key_cache, const at::Tensor& value_cache,
                                const at::Tensor& block_tables, const at::Tensor& context_lens,
                                const at::Tensor& query_start_loc);
// bias: null when there is none.
void check_linear_small_args(const at::Tensor& out, const at::Tensor& input,
                             const at::Tensor& weight, const at::Tensor* bias);

}  // namespace vllm
