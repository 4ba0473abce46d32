// A step's new tokens on the CPU: the rotary embedding of one head (pos_encoding.cpp) and the
// checks of the positions and cache slots (cache.cpp), shared with the attention that rotates
// its own queries and writes its own new keys and values (attention.cpp, decode_layers), so
// that both give the same bits and the same errors.
#pragma once

#include "cpu/vec.h"

namespace vllm_cpu {

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

// Every position inside the cos_sin_cache's max_position rows.
inline void check_positions(const int64_t* pos, int64_t num_tokens, int64_t max_position) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_position, "positions[", t, "] = ", pos[t],
                " is outside cos_sin_cache's ", max_position, " positions");
  }
}

// Every slot inside the cache's num_slots (a negative slot: a padding token, not written).
inline void check_slots(const int64_t* slots, int64_t num_tokens, int64_t num_slots) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK(slots[t] < num_slots, "slot_mapping[", t, "] = ", slots[t],
                " is past the cache's ", num_slots, " slots");
  }
}

}  // namespace vllm_cpu
