// rotary_embedding on the CPU: rotates query and key heads in place, neox or gpt-j pairing.
#include "core/checks.h"
#include "cpu/new_tokens.h"
#include "cpu/team.h"
#include "ops.h"

namespace vllm_cpu {

void rotary_embedding(const at::Tensor& positions, at::Tensor& query, at::Tensor& key,
                      int64_t head_size, const at::Tensor& cos_sin_cache, bool is_neox) {
  auto [num_heads, num_kv_heads] =
      vllm::check_rotary_embedding_args(positions, query, key, head_size, cos_sin_cache);
  const int64_t num_tokens = positions.size(0);
  const int64_t rot_dim = cos_sin_cache.size(1);
  const int64_t max_position = cos_sin_cache.size(0);
  const int64_t q_stride = query.dim() == 2 ? query.stride(0) : num_heads * head_size;
  const int64_t k_stride = key.dim() == 2 ? key.stride(0) : num_kv_heads * head_size;
  const int64_t* pos = positions.data_ptr<int64_t>();
  check_positions(pos, num_tokens, max_position);
  VLLM_CPU_DISPATCH_FLOAT_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    scalar_t* q = query.data_ptr<scalar_t>();
    scalar_t* k = key.data_ptr<scalar_t>();
    const scalar_t* cache = cos_sin_cache.data_ptr<scalar_t>();
    parallel_for(0, num_tokens, grain_for((num_heads + num_kv_heads) * rot_dim), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* cos = cache + pos[t] * rot_dim;
        const scalar_t* sin = cos + rot_dim / 2;
        for (int64_t h = 0; h < num_heads; ++h) {
          rotate_head(q + t * q_stride + h * head_size, cos, sin, rot_dim, is_neox);
        }
        for (int64_t h = 0; h < num_kv_heads; ++h) {
          rotate_head(k + t * k_stride + h * head_size, cos, sin, rot_dim, is_neox);
        }
      }
    });
  });
}

}  // namespace vllm_cpu
