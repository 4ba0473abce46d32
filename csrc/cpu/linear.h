// The small-row linear of linear.cpp, for the other CPU kernels (decode_layers.cpp).
#pragma once

#include <torch/all.h>

namespace vllm_cpu {

// out[m * ldo + n] = sum_k input[m * ldi + k] * weight[n * k_dim + k] (+ bias[n]), fp32 sums.
template <typename T>
void linear_small_impl(T* out, int64_t ldo, const T* input, int64_t ldi, const T* weight,
                       const T* bias, int64_t m_dim, int64_t n_dim, int64_t k_dim);

}  // namespace vllm_cpu
