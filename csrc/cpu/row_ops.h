// One row of the CPU's norms and of silu_and_mul (layernorm.cpp, activation.cpp), shared with
// what decode_layers folds into its linears' loops (layer_folds.h), so both give the same bits.
#pragma once

#include "cpu/vec.h"

namespace vllm_cpu {

// out = x * inv_rms (rounded to T) * weight over one row, out may alias x.
template <typename T>
inline void scale_row(T* out, const T* x, const T* weight, int64_t hidden, const fVec& inv_rms) {
  for_each_vec(hidden, [&](int64_t i, int w) {
    fVec normed = round_to<T>(load_any(x + i, w) * inv_rms);
    store_any(out + i, normed * load_any(weight + i, w), w);
  });
}

// 1 / sqrt(mean + epsilon) from the vector of partial sums of squares of a row of `hidden`.
inline fVec inv_rms_of(const fVec& sum_sq, int64_t hidden, float epsilon) {
  const float variance = at::vec::vec_reduce_all<float>(
      [](const fVec& a, const fVec& b) { return a + b; }, sum_sq);
  return fVec(1.f / std::sqrt(variance / static_cast<float>(hidden) + epsilon));
}

// Normalises one row x into out (which may alias x), matching
// (x.float() * rsqrt(mean(x^2) + eps)).to(T) * weight in T arithmetic.
template <typename T>
inline void rms_norm_row(T* out, const T* x, const T* weight, int64_t hidden, float epsilon) {
  fVec sum_sq(0.f);
  for_each_vec(hidden, [&](int64_t i, int w) {
    fVec v = load_any(x + i, w);
    sum_sq = at::vec::fmadd(v, v, sum_sq);
  });
  scale_row(out, x, weight, hidden, inv_rms_of(sum_sq, hidden, epsilon));
}

// sum = x + residual in T (sum may alias either), then out = rms_norm(sum): one row of
// fused_add_rms_norm. The squares are summed in the adding pass, from the sums rounded to T
// (the values stored), in rms_norm_row's order: the same bits, one pass over the row fewer.
template <typename T>
inline void add_rms_norm_row(T* out, T* sum, const T* x, const T* residual, const T* weight,
                             int64_t hidden, float epsilon) {
  fVec sum_sq(0.f);
  for_each_vec(hidden, [&](int64_t i, int w) {
    const fVec s = store_rounded(sum + i, load_any(x + i, w) + load_any(residual + i, w), w);
    sum_sq = at::vec::fmadd(s, s, sum_sq);
  });
  scale_row(out, sum, weight, hidden, inv_rms_of(sum_sq, hidden, epsilon));
}

// out[i] = silu(gate[i]) * up[i] for i < n; silu rounded to T before the product, as torch's
// silu(gate) * up is.
template <typename T>
inline void silu_mul_span(T* out, const T* gate, const T* up, int64_t n) {
  const fVec one(1.f);
  for_each_vec(n, [&](int64_t i, int w) {
    fVec g = load_any(gate + i, w);
    fVec silu = round_to<T>(g / (one + g.neg().exp()));
    store_any(out + i, silu * load_any(up + i, w), w);
  });
}

}  // namespace vllm_cpu
