// linear_argmax on the CPU: each row's first maximal index of input @ weight^T (a NaN counting as
// the maximum, as numpy's argmax), for a greedy draft's next tokens without its fp32 logits: the
// logits are made in the weights' dtype by linear_rows (the same values linear_small and
// linear_packed give), and each task of the linear's loop finds its own columns' maximum while
// they are in its cache (a LinearFold; on the packed tiles) or a loop over column chunks does
// (elsewhere); the chunks' maxima are merged in column order. Where the logits went to fp32 and
// numpy's argmax on the calling thread, a batch of 8 rows of a 49K vocabulary was a 1.5 MB pass
// on one core.
#include <cmath>
#include <limits>
#include <vector>

#include "core/checks.h"
#include "cpu/linear.h"
#include "cpu/team.h"
#include "cpu/vec.h"
#include "ops.h"

namespace vllm_cpu {
namespace {

struct Best {
  float value;
  int64_t index;  // -1: no columns seen
};

// The first maximum of a chunk a (columns before b's) and one of b.
inline Best first_max(const Best& a, const Best& b) {
  if (a.index < 0) return b;
  if (b.index < 0 || std::isnan(a.value)) return a;
  if (std::isnan(b.value)) return b;
  return b.value > a.value ? b : a;
}

// The first maximum of x[n0 .. n1) (index n0 + i of x[i]), the first NaN where there is one.
template <typename T>
Best span_max(const T* x, int64_t n0, int64_t n1) {
  Best best{-std::numeric_limits<float>::infinity(), n1 > n0 ? n0 : -1};
  int64_t i = n0;
#ifdef CPU_CAPABILITY_AVX512
  if (n1 - n0 >= 16) {
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512i vidx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(n0)), lanes);
    for (; i + 16 <= n1; i += 16) {
      const __m512 v = load_float(x + (i - n0));
      const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      if (nan != 0) return {std::numeric_limits<float>::quiet_NaN(), i + __builtin_ctz(nan)};
      const __mmask16 gt = _mm512_cmp_ps_mask(v, vmax, _CMP_GT_OQ);
      vmax = _mm512_mask_blend_ps(gt, vmax, v);
      vidx = _mm512_mask_blend_epi32(
          gt, vidx, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i)), lanes));
    }
    // each lane kept its first maximum: the least index among the lanes at the maximum
    const float m = _mm512_reduce_max_ps(vmax);
    const __mmask16 at = _mm512_cmp_ps_mask(vmax, _mm512_set1_ps(m), _CMP_EQ_OQ);
    best = {m, _mm512_mask_reduce_min_epi32(at, vidx)};
  }
#endif
  for (; i < n1; ++i) {
    const float v = static_cast<float>(x[i - n0]);
    if (std::isnan(v)) return {v, i};
    if (v > best.value) best = {v, i};
  }
  return best;
}

// Each row's first maximum of the columns each task of the linear's loop wrote: chunk c
// (columns from kPackRows * c) in partial[c * rows + r].
template <typename T>
class ArgmaxFold final : public LinearFold {
 public:
  ArgmaxFold(const T* logits, int64_t ld, int64_t rows, std::vector<Best>& partial)
      : logits_(logits), ld_(ld), rows_(rows), partial_(partial) {}
  void output(int64_t n0, int64_t n1) const override {
    for (int64_t r = 0; r < rows_; ++r) {
      partial_[(n0 / kPackRows) * rows_ + r] = span_max(logits_ + r * ld_ + n0, n0, n1);
    }
  }

 private:
  const T* logits_;
  int64_t ld_, rows_;
  std::vector<Best>& partial_;
};

// The rows' maxima merged over the chunks in column order, into out.
void merge(const std::vector<Best>& partial, int64_t rows, int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    Best best{0.f, -1};
    for (size_t c = 0; c * rows + r < partial.size(); ++c) {
      best = first_max(best, partial[c * rows + r]);
    }
    out[r] = best.index;
  }
}

}  // namespace

void linear_argmax(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                   const at::Tensor& packed) {
  TORCH_CHECK(input.dim() == 2, "input must be [rows, features], got ", input.sizes());
  const int64_t rows = input.size(0), n_dim = weight.dim() == 2 ? weight.size(0) : 0;
  at::Tensor logits = at::empty({rows, n_dim}, input.options());
  vllm::check_linear_small_args(logits, input, weight, nullptr);
  TORCH_CHECK(out.dim() == 1 && out.size(0) == rows && out.scalar_type() == at::kLong &&
                  out.is_contiguous() && out.device().is_cpu(),
              "out must be a contiguous CPU int64 tensor of the ", rows, " rows, got ",
              out.sizes(), " ", out.scalar_type());
  TORCH_CHECK(n_dim > 0, "weight must have at least one row");
  check_packed(packed, weight);
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t panels = (n_dim + kPackRows - 1) / kPackRows;
  VLLM_CPU_DISPATCH_FLOAT_TYPES(input.scalar_type(), "linear_argmax", [&] {
    const scalar_t* l = logits.data_ptr<scalar_t>();
    if (packed.numel() > 0 && linear_rows_folds(input.scalar_type(), rows)) {
      std::vector<Best> partial(panels * rows, Best{0.f, -1});
      const ArgmaxFold<scalar_t> fold(l, n_dim, rows, partial);
      linear_rows(logits, input, weight, nullptr, &packed, &fold);
      merge(partial, rows, o);
      return;
    }
    linear_rows(logits, input, weight, nullptr, packed.numel() > 0 ? &packed : nullptr);
    // chunks of 4096 columns, at least 64K logits a thread: a row of a 49K vocabulary is a
    // few us on the calling thread, less than opening a parallel region costs
    constexpr int64_t kChunk = 4096;
    const int64_t chunks = (n_dim + kChunk - 1) / kChunk;
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (kChunk * rows));
    std::vector<Best> partial(chunks * rows, Best{0.f, -1});
    parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t n0 = c * kChunk, n1 = std::min(n_dim, n0 + kChunk);
        for (int64_t r = 0; r < rows; ++r) {
          partial[c * rows + r] = span_max(l + r * n_dim + n0, n0, n1);
        }
      }
    });
    merge(partial, rows, o);
  });
}

}  // namespace vllm_cpu
