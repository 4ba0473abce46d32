// Vector helpers for the CPU kernels, over PyTorch's header-only at::vec::Vectorized<float>, which
// compiles to AVX-512, AVX2 or scalar code by the CPU_CAPABILITY macros (cmake/cpu_isa.cmake).
// Kernels compute in fp32 and load/store fp32 or bf16.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/all.h>

#include <algorithm>

namespace vllm_cpu {

using fVec = at::vec::Vectorized<float>;
constexpr int kVecSize = fVec::size();

// Loads kVecSize elements as floats.
inline fVec load_float(const float* p) { return fVec::loadu(p); }
inline fVec load_float(const c10::BFloat16* p) {
  fVec out;
  at::vec::load_to_float<c10::BFloat16>(p, out);
  return out;
}

// Loads n < kVecSize elements as floats, zero-filling the rest.
template <typename T>
inline fVec load_float(const T* p, int n) {
  float tmp[kVecSize] = {};
  for (int i = 0; i < n; ++i) tmp[i] = static_cast<float>(p[i]);
  return fVec::loadu(tmp);
}

inline void store_float(float* p, const fVec& v) { v.store(p); }
inline void store_float(c10::BFloat16* p, const fVec& v) {
  at::vec::convert_from_float<c10::BFloat16>(v, v).store(p, kVecSize);
}
template <typename T>
inline void store_float(T* p, const fVec& v, int n) {
  float tmp[kVecSize];
  v.store(tmp);
  for (int i = 0; i < n; ++i) p[i] = static_cast<T>(tmp[i]);
}

// Rounds v to T's precision and back, so fp32 math reproduces a chain of T-typed torch ops.
template <typename T>
inline fVec round_to(const fVec& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    auto [lo, hi] = at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v, v));
    (void)hi;
    return lo;
  }
}

// Stores v's first `width` lanes to p in T and returns v rounded to T (round_to), converting once.
inline fVec store_rounded(float* p, const fVec& v, int width) {
  v.store(p, width);
  return v;
}
inline fVec store_rounded(c10::BFloat16* p, const fVec& v, int width) {
  const auto b = at::vec::convert_from_float<c10::BFloat16>(v, v);
  b.store(p, width);
  auto [lo, hi] = at::vec::convert_to_float<c10::BFloat16>(b);
  (void)hi;
  return lo;
}

// Calls fn(offset, width) over [0, n) in vector-wide steps; width < kVecSize only at the tail.
template <typename Fn>
inline void for_each_vec(int64_t n, Fn&& fn) {
  int64_t i = 0;
  for (; i + kVecSize <= n; i += kVecSize) fn(i, kVecSize);
  if (i < n) fn(i, static_cast<int>(n - i));
}

template <typename T>
inline fVec load_any(const T* p, int width) {
  return width == kVecSize ? load_float(p) : load_float(p, width);
}
template <typename T>
inline void store_any(T* p, const fVec& v, int width) {
  if (width == kVecSize) {
    store_float(p, v);
  } else {
    store_float(p, v, width);
  }
}

// Work items per thread below which a parallel region costs more than it saves: OpenMP teams
// handing over to MKL's matmul threads and back cost ~0.1-1 ms on few cores, so small decode-time
// ops run on the calling thread (32K elements a thread). decode_layers, whose linears are this
// extension's own parallel loops (no MKL team between them), lowers it for its step
// (small_op_min_elems, SmallOpSplit in decode_layers.cpp).
inline int64_t& small_op_min_elems() {
  thread_local int64_t min_elems = 1 << 15;
  return min_elems;
}
inline int64_t grain_for(int64_t elems_per_item, int64_t min_elems) {
  return std::max<int64_t>(1, min_elems / std::max<int64_t>(elems_per_item, 1));
}
inline int64_t grain_for(int64_t elems_per_item) {
  return grain_for(elems_per_item, small_op_min_elems());
}

#define VLLM_CPU_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                                         \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__)          \
                                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))

#ifdef CPU_CAPABILITY_AVX512
// The 16 lanes of each of d[0..15] added, as one vector of the 16 sums (in order): a
// transposed tree of 30 shuffles, where a reduction apiece takes 4 each (64).
inline __m512 reduce16(const __m512* d) {
  __m512 t[8];  // per 128-bit lane: partials of rows 2p, 2p + 1, interleaved
  for (int p = 0; p < 8; ++p) {
    t[p] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * p], d[2 * p + 1]),
                         _mm512_unpackhi_ps(d[2 * p], d[2 * p + 1]));
  }
  __m512 w[4];  // per lane: one partial of each of rows 4h .. 4h + 3
  for (int h = 0; h < 4; ++h) {
    w[h] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * h], t[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * h], t[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 z[2];  // lanes: rows 8g .. 8g + 3 twice (halves), rows 8g + 4 .. 8g + 7 twice
  for (int g = 0; g < 2; ++g) {
    z[g] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * g], w[2 * g + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(w[2 * g], w[2 * g + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

}  // namespace vllm_cpu
