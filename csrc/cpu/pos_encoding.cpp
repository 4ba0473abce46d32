// rotary_embedding on the CPU: rotates query and key heads in place, neox or gpt-j pairing.
#include "core/checks.h"
#include "cpu/team.h"
#include "cpu/vec.h"
#include "ops.h"

namespace vllm_cpu {
namespace {

// Rotates the first rot_dim elements of one head x; cos/sin [rot_dim / 2].
template <typename T>
inline void rotate_head(T* x, const T* cos, const T* sin, int64_t rot_dim, bool is_neox) {
  const int64_t half = rot_dim / 2;
  if (is_neox) {  // pairs (x[i], x[i + half])
    for_each_vec(half, [&](int64_t i, int w) {
      fVec x1 = load_any(x + i, w), x2 = load_any(x + half + i, w);
      fVec c = load_any(cos + i, w), s = load_any(sin + i, w);
      store_any(x + i, x1 * c - x2 * s, w);
      store_any(x + half + i, x2 * c + x1 * s, w);
    });
  } else {  // pairs (x[2i], x[2i + 1])
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = static_cast<float>(x[2 * i]), x2 = static_cast<float>(x[2 * i + 1]);
      const float c = static_cast<float>(cos[i]), s = static_cast<float>(sin[i]);
      x[2 * i] = static_cast<T>(x1 * c - x2 * s);
      x[2 * i + 1] = static_cast<T>(x2 * c + x1 * s);
    }
  }
}

}  // namespace

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
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_position, "positions[", t, "] = ", pos[t],
                " is outside cos_sin_cache's ", max_position, " positions");
  }
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
