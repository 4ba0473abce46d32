// rms_norm and fused_add_rms_norm on the CPU: one pass for the sum of squares, one to scale.
#include "core/checks.h"
#include "cpu/row_ops.h"
#include "cpu/team.h"
#include "ops.h"

namespace vllm_cpu {

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
        add_rms_norm_row(xr, rr, xr, rr, w, hidden, static_cast<float>(epsilon));
      }
    });
  });
}

}  // namespace vllm_cpu
