// Shape, dtype and device checks for every op (see checks.h).
#include "core/checks.h"

namespace vllm {

void check_rms_norm_args(const at::Tensor& out, const at::Tensor& input, const at::Tensor& weight) {
  VLLM_CHECK_SAME_DEVICE(input, out);
  VLLM_CHECK_SAME_DEVICE(input, weight);
  VLLM_CHECK_SAME_DTYPE(input, out);
  VLLM_CHECK_SAME_DTYPE(input, weight);
  VLLM_CHECK_SHAPE(input, out);
  VLLM_CHECK_CONTIGUOUS(out);
  VLLM_CHECK_CONTIGUOUS(weight);
  VLLM_CHECK_LAST_DIM_CONTIGUOUS(input);
  TORCH_CHECK(input.dim() >= 1 && weight.dim() == 1 && weight.size(0) == input.size(-1),
              "weight must have shape [hidden_size] = [", input.size(-1), "], got ",
              weight.sizes());
  TORCH_CHECK(input.dim() <= 2 || input.is_contiguous(),
              "input with more than 2 dimensions must be contiguous");
}

void check_silu_and_mul_args(const at::Tensor& out, const at::Tensor& input) {
  VLLM_CHECK_SAME_DEVICE(input, out);
  VLLM_CHECK_SAME_DTYPE(input, out);
  VLLM_CHECK_CONTIGUOUS(input);
  VLLM_CHECK_CONTIGUOUS(out);
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) % 2 == 0,
              "input's last dimension must be even (gate and up halves), got shape ",
              input.sizes());
  auto expected = input.sizes().vec();
  expected.back() /= 2;
  TORCH_CHECK(out.sizes() == at::IntArrayRef(expected), "out must have shape ", at::IntArrayRef(expected),
              ", got ", out.sizes());
}

std::pair<int64_t, int64_t> check_rotary_embedding_args(const at::Tensor& positions,
                                                       const at::Tensor& query,
                                                       const at::Tensor& key, int64_t head_size,
                                                       const at::Tensor& cos_sin_cache) {
  VLLM_CHECK_SAME_DEVICE(query, positions);
  VLLM_CHECK_SAME_DEVICE(query, key);
  VLLM_CHECK_SAME_DEVICE(query, cos_sin_cache);
  VLLM_CHECK_SAME_DTYPE(query, key);
  VLLM_CHECK_SAME_DTYPE(query, cos_sin_cache);
  VLLM_CHECK_DTYPE(positions, at::kLong);
  VLLM_CHECK_DIM(positions, 1);
  VLLM_CHECK_DIM(cos_sin_cache, 2);
  VLLM_CHECK_CONTIGUOUS(cos_sin_cache);
  VLLM_CHECK_CONTIGUOUS(positions);
  const int64_t num_tokens = positions.size(0);
  TORCH_CHECK(head_size > 0, "head_size must be positive, got ", head_size);
  const int64_t rot_dim = cos_sin_cache.size(1);
  TORCH_CHECK(rot_dim % 2 == 0 && rot_dim <= head_size,
              "cos_sin_cache's last dimension (rot_dim) must be even and at most head_size (",
              head_size, "), got ", rot_dim);
  for (const at::Tensor* t : {&query, &key}) {
    const char* name = t == &query ? "query" : "key";
    TORCH_CHECK(t->dim() >= 2 && t->size(0) == num_tokens, name,
                " must have num_tokens = ", num_tokens, " rows, got shape ", t->sizes());
    TORCH_CHECK(t->stride(-1) == 1, name, " must be contiguous in its last dimension");
    const int64_t row = t->numel() / std::max<int64_t>(num_tokens, 1);
    TORCH_CHECK(row % head_size == 0, name, "'s row of ", row,
                " elements is not a whole number of heads of head_size ", head_size);
    TORCH_CHECK(t->dim() == 2 || t->is_contiguous(), name,
                " with more than 2 dimensions must be contiguous");
  }
  const int64_t denom = std::max<int64_t>(num_tokens, 1);
  return {query.numel() / denom / head_size, key.numel() / denom / head_size};
}

void check_reshape_and_cache_args(const at::Tensor& key, const at::Tensor& value,
                                  const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& slot_mapping) {
  VLLM_CHECK_SAME_DEVICE(key, value);
  VLLM_CHECK_SAME_DEVICE(key, key_cache);
  VLLM_CHECK_SAME_DEVICE(key, value_cache);
  VLLM_CHECK_SAME_DEVICE(key, slot_mapping);
  VLLM_CHECK_SAME_DTYPE(key, value);
  VLLM_CHECK_SAME_DTYPE(key, key_cache);
  VLLM_CHECK_SAME_DTYPE(key, value_cache);
  VLLM_CHECK_DTYPE(slot_mapping, at::kLong);
  VLLM_CHECK_DIM(key, 3);
  VLLM_CHECK_DIM(key_cache, 4);
  VLLM_CHECK_SHAPE(key, value);
  VLLM_CHECK_SHAPE(key_cache, value_cache);
  VLLM_CHECK_CONTIGUOUS(key_cache);
  VLLM_CHECK_CONTIGUOUS(value_cache);
  VLLM_CHECK_CONTIGUOUS(slot_mapping);
  TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1,
              "key and value must be contiguous in their last dimension");
  TORCH_CHECK(key_cache.size(1) == key.size(1) && key_cache.size(3) == key.size(2),
              "key_cache [num_blocks, num_kv_heads, block_size, head_size] has shape ",
              key_cache.sizes(), ", which does not match key [num_tokens, num_kv_heads, head_size] ",
              key.sizes());
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0),
              "slot_mapping must have shape [num_tokens] = [", key.size(0), "], got ",
              slot_mapping.sizes());
}

int64_t check_rotary_embedding_and_cache_args(const at::Tensor& positions, const at::Tensor& query,
                                              const at::Tensor& key, const at::Tensor& value,
                                              int64_t head_size, const at::Tensor& cos_sin_cache,
                                              const at::Tensor& key_cache,
                                              const at::Tensor& value_cache,
                                              const at::Tensor& slot_mapping) {
  check_reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping);
  TORCH_CHECK(key.size(2) == head_size, "key [num_tokens, num_kv_heads, head_size] has shape ",
              key.sizes(), ", not head_size ", head_size);
  TORCH_CHECK(key.size(1) <= 1 || key.stride(1) == head_size,
              "key's heads must be adjacent in each row (stride ", head_size, "), got stride ",
              key.stride(1));
  return check_rotary_embedding_args(positions, query, key.flatten(1), head_size,
                                     cos_sin_cache).first;
}

void check_copy_blocks_args(const std::vector<at::Tensor>& key_caches,
                            const std::vector<at::Tensor>& value_caches,
                            const at::Tensor& block_mapping) {
  TORCH_CHECK(key_caches.size() == value_caches.size(), "key_caches has ", key_caches.size(),
              " layers but value_caches has ", value_caches.size());
  VLLM_CHECK_DTYPE(block_mapping, at::kLong);
  TORCH_CHECK(block_mapping.dim() == 2 && block_mapping.size(1) == 2,
              "block_mapping must have shape [num_pairs, 2], got ", block_mapping.sizes());
  VLLM_CHECK_CONTIGUOUS(block_mapping);
  for (size_t i = 0; i < key_caches.size(); ++i) {
    const at::Tensor& k = key_caches[i];
    const at::Tensor& v = value_caches[i];
    TORCH_CHECK(k.sizes() == key_caches[0].sizes() && v.sizes() == k.sizes(),
                "every key_caches/value_caches entry must have the shape of key_caches[0] ",
                key_caches[0].sizes(), "; layer ", i, " has ", k.sizes(), " and ", v.sizes());
    TORCH_CHECK(k.scalar_type() == key_caches[0].scalar_type() &&
                    v.scalar_type() == k.scalar_type(),
                "every cache must have the dtype of key_caches[0]; layer ", i, " differs");
    TORCH_CHECK(k.device() == block_mapping.device() && v.device() == block_mapping.device(),
                "cache of layer ", i, " is on ", k.device(), " but block_mapping is on ",
                block_mapping.device());
    TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "cache of layer ", i,
                " must be contiguous");
  }
}

void check_paged_attention_args(const at::Tensor& out, const at::Tensor& query,
                                const at::Tensor& key_cache, const at::Tensor& value_cache,
                                const at::Tensor& block_tables, const at::Tensor& context_lens,
                                const at::Tensor& query_start_loc) {
  for (const at::Tensor* t : {&out, &key_cache, &value_cache, &block_tables, &context_lens,
                              &query_start_loc}) {
    TORCH_CHECK(t->device() == query.device(), "every paged_attention tensor must be on ",
                query.device(), " (query's device); one is on ", t->device());
  }
  VLLM_CHECK_SAME_DTYPE(query, out);
  VLLM_CHECK_SAME_DTYPE(query, key_cache);
  VLLM_CHECK_SAME_DTYPE(query, value_cache);
  VLLM_CHECK_DTYPE(block_tables, at::kInt);
  VLLM_CHECK_DTYPE(context_lens, at::kInt);
  VLLM_CHECK_DTYPE(query_start_loc, at::kInt);
  VLLM_CHECK_DIM(query, 3);
  VLLM_CHECK_DIM(key_cache, 4);
  VLLM_CHECK_DIM(block_tables, 2);
  VLLM_CHECK_DIM(context_lens, 1);
  VLLM_CHECK_DIM(query_start_loc, 1);
  VLLM_CHECK_SHAPE(query, out);
  VLLM_CHECK_SHAPE(key_cache, value_cache);
  for (const at::Tensor* t : {&out, &key_cache, &value_cache, &block_tables, &context_lens,
                              &query_start_loc}) {
    TORCH_CHECK(t->is_contiguous(), "every paged_attention tensor but query must be contiguous");
  }
  // query's tokens may be rows of a wider tensor (the q part of a fused qkv projection's output,
  // read in place): its heads contiguous within a token, tokens any stride apart
  TORCH_CHECK(query.stride(2) == 1 && query.stride(1) == query.size(2) &&
                  (query.size(0) <= 1 || query.stride(0) >= query.size(1) * query.size(2)),
              "paged_attention's query must have contiguous heads within each token (strides [T, ",
              "head_size, 1] with T >= num_heads * head_size), got strides ", query.strides());
  const int64_t num_heads = query.size(1), num_kv_heads = key_cache.size(1);
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "query's num_heads (",
              num_heads, ") must be a multiple of key_cache's num_kv_heads (", num_kv_heads, ")");
  TORCH_CHECK(key_cache.size(3) == query.size(2), "key_cache's head_size (", key_cache.size(3),
              ") does not match query's (", query.size(2), ")");
  const int64_t num_seqs = context_lens.size(0);
  TORCH_CHECK(block_tables.size(0) == num_seqs, "block_tables has ", block_tables.size(0),
              " rows but context_lens has ", num_seqs, " sequences");
  TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1, "query_start_loc must have num_seqs + 1 = ",
              num_seqs + 1, " entries, got ", query_start_loc.size(0));
}

void check_linear_small_args(const at::Tensor& out, const at::Tensor& input,
                             const at::Tensor& weight, const at::Tensor* bias) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && out.dim() == 2,
              "linear_small takes 2-d input, weight and out");
  VLLM_CHECK_SAME_DEVICE(input, weight);
  VLLM_CHECK_SAME_DEVICE(input, out);
  TORCH_CHECK(weight.is_contiguous() && input.stride(1) == 1 && out.stride(1) == 1,
              "linear_small needs a contiguous weight and unit-stride input/out rows");
  TORCH_CHECK(input.size(1) == weight.size(1), "input has ", input.size(1),
              " features, weight expects ", weight.size(1));
  TORCH_CHECK(out.size(0) == input.size(0) && out.size(1) == weight.size(0), "out has shape ",
              out.sizes(), ", expected [", input.size(0), ", ", weight.size(0), "]");
  TORCH_CHECK(input.scalar_type() == weight.scalar_type() &&
                  out.scalar_type() == weight.scalar_type(),
              "linear_small needs one dtype for input, weight and out; got input ",
              input.scalar_type(), ", weight ", weight.scalar_type(), ", out ", out.scalar_type());
  if (bias != nullptr) {
    TORCH_CHECK(bias->device() == input.device(), "bias is on ", bias->device(),
                " but input is on ", input.device());
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->is_contiguous() &&
                    bias->scalar_type() == weight.scalar_type(),
                "bias must be a contiguous [", weight.size(0), "] tensor of the weight's dtype");
  }
}

}  // namespace vllm
