// The small-row linear of linear.cpp, for the other CPU kernels (decode_layers.cpp).
#pragma once

#include <torch/all.h>

namespace vllm_cpu {

// out[m * ldo + n] = sum_k input[m * ldi + k] * weight[n * k_dim + k] (+ bias[n]), fp32 sums.
template <typename T>
void linear_small_impl(T* out, int64_t ldo, const T* input, int64_t ldi, const T* weight,
                       const T* bias, int64_t m_dim, int64_t n_dim, int64_t k_dim);

// out = input @ weight^T (+ bias) for [rows, in] tensors of contiguous rows: linear_small_impl
// where it pays, torch's GEMM elsewhere. What the linear_small op and decode_layers run.
void linear_rows(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                 const at::Tensor* bias);

// The same for bf16 on AMX tiles (linear_amx.cpp), where the CPU has them and the shape suits
// (VLLM_CPU_AMX: off by default; K a multiple of 32); false where it did nothing.
bool linear_amx_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* input, int64_t ldi,
                     const c10::BFloat16* weight, const c10::BFloat16* bias, int64_t m_dim,
                     int64_t n_dim, int64_t k_dim);

}  // namespace vllm_cpu
