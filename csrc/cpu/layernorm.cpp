// rms_norm and fused_add_rms_norm on the CPU: one pass for the sum of squares, one to scale.
#include "core/checks.h"
#include "cpu/team.h"
#include "cpu/vec.h"
#include "ops.h"

namespace vllm_cpu {
namespace {

// Normalises one row x into out (which may alias x), matching
// (x.float() * rsqrt(mean(x^2) + eps)).to(T) * weight in T arithmetic.
template <typename T>
inline void rms_norm_row(T* out, const T* x, const T* weight, int64_t hidden, float epsilon) {
  fVec sum_sq(0.f);
  for_each_vec(hidden, [&](int64_t i, int w) {
    fVec v = load_any(x + i, w);
    sum_sq = at::vec::fmadd(v, v, sum_sq);
  });
  const float variance = at::vec::vec_reduce_all<float>(
      [](const fVec& a, const fVec& b) { return a + b; }, sum_sq);
  const fVec inv_rms(1.f / std::sqrt(variance / static_cast<float>(hidden) + epsilon));
  for_each_vec(hidden, [&](int64_t i, int w) {
    fVec normed = round_to<T>(load_any(x + i, w) * inv_rms);
    store_any(out + i, normed * load_any(weight + i, w), w);
  });
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight, double epsilon) {
  vllm::check_rms_norm_args(out, input, weight);
  const int64_t hidden = input.size(-1);
  const int64_t num_tokens = input.numel() / std::max<int64_t>(hidden, 1);
  const int64_t in_stride = input.dim() == 2 ? input.stride(0) : hidden;
  VLLM_CPU_DISPATCH_FLOAT_TYPES(input.scalar_type(), "rms_norm", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    const scalar_t* x = input.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    parallel_for(0, num_tokens, grain_for(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        rms_norm_row(o + t * hidden, x + t * in_stride, w, hidden, static_cast<float>(epsilon));
      }
    });
  });
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  vllm::check_rms_norm_args(residual, input, weight);
  TORCH_CHECK(input.is_contiguous(), "input must be contiguous");
  const int64_t hidden = input.size(-1);
  const int64_t num_tokens = input.numel() / std::max<int64_t>(hidden, 1);
  VLLM_CPU_DISPATCH_FLOAT_TYPES(input.scalar_type(), "fused_add_rms_norm", [&] {
    scalar_t* x = input.data_ptr<scalar_t>();
    scalar_t* r = residual.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    parallel_for(0, num_tokens, grain_for(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        scalar_t* xr = x + t * hidden;
        scalar_t* rr = r + t * hidden;
        for_each_vec(hidden, [&](int64_t i, int w) {
          store_any(rr + i, load_any(xr + i, w) + load_any(rr + i, w), w);
        });
        rms_norm_row(xr, rr, w, hidden, static_cast<float>(epsilon));
      }
    });
  });
}

}  // namespace vllm_cpu
