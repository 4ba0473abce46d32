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
// ops run on the calling thread.
inline int64_t grain_for(int64_t elems_per_item, int64_t min_elems = 1 << 15) {
  return std::max<int64_t>(1, min_elems / std::max<int64_t>(elems_per_item, 1));
}

#define VLLM_CPU_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                                         \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__)          \
                                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))

}  // namespace vllm_cpu
