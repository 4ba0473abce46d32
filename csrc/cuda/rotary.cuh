// One rotary pair of a head, shared by rotary_embedding and rotary_embedding_and_cache so both
// rotate alike: pair p of rot_dim / 2 = half, neox pairing (p, p + half) or gpt-j (2p, 2p + 1),
// in fp32, rounded to T once.
#pragma once

// The two elements of pair p.
__device__ __forceinline__ int2 pair_indices(int p, int half, bool is_neox) {
  return is_neox ? make_int2(p, p + half) : make_int2(2 * p, 2 * p + 1);
}

template <typename T>
__device__ __forceinline__ void rotate_pair(T* x, const T* cos, const T* sin, int p, int half,
                                            bool is_neox) {
  const int2 i = pair_indices(p, half, is_neox);
  const float c = static_cast<float>(cos[p]), s = static_cast<float>(sin[p]);
  const float x1 = static_cast<float>(x[i.x]), x2 = static_cast<float>(x[i.y]);
  x[i.x] = static_cast<T>(x1 * c - x2 * s);
  x[i.y] = static_cast<T>(x2 * c + x1 * s);
}
