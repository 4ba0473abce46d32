// linear_argmax on the CPU: each row's first maximal index of input @ weight^T (a NaN counting as
// the maximum, as numpy's argmax), for a greedy draft's next tokens without its fp32 logits: the
// logits are made in the weights' dtype by linear_rows (the same values linear_small and
// linear_packed give), and each thread of the linear's loop finds its chunk's maximum while
// the columns are in its cache (a LinearFold; on the packed tiles), or a loop over column chunks
// does (elsewhere); the chunks' maxima are merged in column order. Where the logits went to fp32 and
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
#elif defined(CPU_CAPABILITY_AVX2)
  // the same in 8 lanes (a batch-1 LM head's argmax runs on the calling thread: draft-20m's
  // 32K columns took 26 us a forward in scalar code on the 2-core AVX2 machine)
  if (n1 - n0 >= 8) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256i vidx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(n0)), lanes);
    for (; i + 8 <= n1; i += 8) {
      const __m256 v = load_float(x + (i - n0));
      const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      if (nan != 0) return {std::numeric_limits<float>::quiet_NaN(), i + __builtin_ctz(nan)};
      const __m256 gt = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ);
      vmax = _mm256_blendv_ps(vmax, v, gt);
      vidx = _mm256_blendv_epi8(
          vidx, _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(i)), lanes),
          _mm256_castps_si256(gt));
    }
    // each lane kept its first maximum: the least index among the lanes at the maximum
    alignas(32) float maxima[8];
    alignas(32) int32_t indices[8];
    _mm256_store_ps(maxima, vmax);
    _mm256_store_si256(reinterpret_cast<__m256i*>(indices), vidx);
    best = {maxima[0], indices[0]};
    for (int lane = 1; lane < 8; ++lane) {
      if (maxima[lane] > best.value ||
          (maxima[lane] == best.value && indices[lane] < best.index)) {
        best = {maxima[lane], indices[lane]};
      }
    }
  }
#endif
  for (; i < n1; ++i) {
    const float v = static_cast<float>(x[i - n0]);
    if (std::isnan(v)) return {v, i};
    if (v > best.value) best = {v, i};
  }
  return best;
}

// Each row's first maximum of logits' columns [n0, n1) (a chunk of a parallel loop), into
// partial[p * rows + r] where the chunk starts at panel p (kPackRows columns), and the panel
// after the chunk into next[p] (n0 a multiple of kPackRows).
template <typename T>
void chunk_max(const T* logits, int64_t ld, int64_t rows, int64_t n0, int64_t n1,
               std::vector<Best>& partial, std::vector<int64_t>& next) {
  const int64_t p = n0 / kPackRows;
  for (int64_t r = 0; r < rows; ++r) {
    partial[p * rows + r] = span_max(logits + r * ld + n0, n0, n1);
  }
  next[p] = (n1 + kPackRows - 1) / kPackRows;
}

// chunk_max of each thread's chunk of the packed linear's loop, after its tasks, from its
// cache. Not a maximum a task: a batch-8 step's merge of a 32K vocabulary's 2000 panels x 8
// rows on the calling thread cost ~0.1 ms, more than the LM head's AMX pass itself on a
// 16-core host (benchmarks/lab/cpu_lm_head_rows.py).
template <typename T>
class ArgmaxFold final : public LinearFold {
 public:
  ArgmaxFold(const T* logits, int64_t ld, int64_t rows, std::vector<Best>& partial,
             std::vector<int64_t>& next)
      : logits_(logits), ld_(ld), rows_(rows), partial_(partial), next_(next) {}
  void chunk_done(int64_t n0, int64_t n1) const override {
    chunk_max(logits_, ld_, rows_, n0, n1, partial_, next_);
  }

 private:
  const T* logits_;
  int64_t ld_, rows_;
  std::vector<Best>& partial_;
  std::vector<int64_t>& next_;
};

// The rows' maxima merged over the chunks in column order, into out: the chunks at panels 0,
// next[0], next[next[0]], ... before `panels` (chunk_max's).
void merge(const std::vector<Best>& partial, const std::vector<int64_t>& next, int64_t rows,
           int64_t panels, int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    Best best{0.f, -1};
    for (int64_t c = 0; c < panels; c = next[c]) {
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
    // the calling thread's, kept between calls: written where the chunks start, and read only
    // there (a fresh 256 KB a call, filled, cost more than the chunks' maxima)
    // (references: a lambda naming a thread_local reads the running thread's own)
    thread_local std::vector<Best> partial_kept;
    thread_local std::vector<int64_t> next_kept;
    std::vector<Best>& partial = partial_kept;
    std::vector<int64_t>& next = next_kept;
    if (static_cast<int64_t>(partial.size()) < panels * rows) partial.resize(panels * rows);
    if (static_cast<int64_t>(next.size()) < panels) next.resize(panels);
    if (packed.numel() > 0 && linear_rows_folds(input.scalar_type(), rows)) {
      const ArgmaxFold<scalar_t> fold(l, n_dim, rows, partial, next);
      linear_rows(logits, input, weight, nullptr, &packed, &fold);
    } else {
      linear_rows(logits, input, weight, nullptr, packed.numel() > 0 ? &packed : nullptr);
      // chunks of 4096 columns, at least 64K logits a thread: a row of a 32K-49K vocabulary
      // on the calling thread (12-49 us beside 63-360 us of logits on a 16-core host,
      // benchmarks/lab/cpu_lm_head_rows.py; split over all threads as the linear splits its
      // columns instead, the step measured even: RESULTS.md, run 50)
      constexpr int64_t kChunk = 4096;
      const int64_t chunks = (n_dim + kChunk - 1) / kChunk;
      const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (kChunk * rows));
      parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          chunk_max(l, n_dim, rows, c * kChunk, std::min(n_dim, (c + 1) * kChunk), partial,
                    next);
        }
      });
    }
    merge(partial, next, rows, panels, o);
  });
}

}  // namespace vllm_cpu
