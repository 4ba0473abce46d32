// silu_and_mul on the CPU: out = silu(gate) * up in one pass over [num_tokens, 2 * d].
#include "core/checks.h"
#include "cpu/row_ops.h"
#include "cpu/team.h"
#include "ops.h"

namespace vllm_cpu {

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  vllm::check_silu_and_mul_args(out, input);
  const int64_t d = out.size(-1);
  const int64_t num_tokens = out.numel() / std::max<int64_t>(d, 1);
  VLLM_CPU_DISPATCH_FLOAT_TYPES(input.scalar_type(), "silu_and_mul", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    const scalar_t* x = input.data_ptr<scalar_t>();
    parallel_for(0, num_tokens, grain_for(2 * d), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        silu_mul_span(o + t * d, x + t * 2 * d, x + t * 2 * d + d, d);
      }
    });
  });
}

}  // namespace vllm_cpu
