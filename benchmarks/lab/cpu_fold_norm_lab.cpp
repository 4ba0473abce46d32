// What the folded norm costs each thread of a decode step's qkv and gate/up linears
// (layer_folds.h: every thread adds and normalises the step's rows for itself), apart from the
// linear (cpu_fold_norm_lab.py). One OpenMP region; each iteration is a step's hand-off: every
// thread writes its slice of the columns of x (rows x hidden bf16, as a linear's threads write
// its output) and the last thread the whole residual (as the fold's first thread writes the
// stream), a barrier, the mode's work on every thread, a barrier. Modes:
//   0 nothing (the writes and barriers alone: the baseline the others are read against),
//   1 the fold as it is: add_rms_norm_row (row_ops.h) of every row, from the shared rows,
//   2 the same from the thread's own copy of the rows (L1: the arithmetic alone),
//   3 every line of the shared x and residual read once (the hand-off alone),
//   4 add_norm_row_fused below from the shared rows, 5 the same from the thread's own copy,
//   6 add_norm_row_fast below (its rounding in the fp32 domain) from the shared rows, 7 own.
// Returns microseconds per iteration.
#include <torch/extension.h>

#include <omp.h>

#include <chrono>
#include <vector>

#include "cpu/row_ops.h"

namespace {

using T = c10::BFloat16;
using vllm_cpu::fVec;

// add_rms_norm_row's result in two passes over the row instead of three: the sum's rounded
// value squared into the same accumulator, in the same order, as it is stored (the same bits).
void add_norm_row_fused(T* out, T* sum, const T* x, const T* residual, const T* weight,
                        int64_t hidden, float epsilon) {
  using namespace vllm_cpu;
  fVec sum_sq(0.f);
  for_each_vec(hidden, [&](int64_t i, int w) {
    const fVec s = round_to<T>(load_any(x + i, w) + load_any(residual + i, w));
    store_any(sum + i, s, w);
    sum_sq = at::vec::fmadd(s, s, sum_sq);
  });
  const float variance = at::vec::vec_reduce_all<float>(
      [](const fVec& a, const fVec& b) { return a + b; }, sum_sq);
  const fVec inv_rms(1.f / std::sqrt(variance / static_cast<float>(hidden) + epsilon));
  for_each_vec(hidden, [&](int64_t i, int w) {
    const fVec normed = round_to<T>(load_any(sum + i, w) * inv_rms);
    store_any(out + i, normed * load_any(weight + i, w), w);
  });
}

// The bf16 rounding in the fp32 domain (the bits' round to nearest even, NaN to 0xffff as
// at::vec's converter does), without packing to 16 bits and back; a store takes the high halves.
#if defined(CPU_CAPABILITY_AVX512)
inline fVec round_bf16(const fVec& v) {
  const __m512i b = _mm512_castps_si512(v);
  __m512i t = _mm512_add_epi32(
      _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  t = _mm512_and_si512(_mm512_add_epi32(t, b), _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  t = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q),
                              _mm512_set1_epi32(static_cast<int>(0xffff0000u)), t);
  return _mm512_castsi512_ps(t);
}
inline void store_rounded(T* p, const fVec& r) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(r), 16)));
}
#else
inline fVec round_bf16(const fVec& v) {
  const __m256i b = _mm256_castps_si256(v);
  __m256i t = _mm256_add_epi32(
      _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  t = _mm256_and_si256(_mm256_add_epi32(t, b), _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  const __m256i ord = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q));
  t = _mm256_blendv_epi8(_mm256_set1_epi32(static_cast<int>(0xffff0000u)), t, ord);
  return _mm256_castsi256_ps(t);
}
inline void store_rounded(T* p, const fVec& r) {
  const __m256i h = _mm256_srli_epi32(_mm256_castps_si256(r), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}
#endif

// add_norm_row_fused with round_bf16 (hidden a multiple of the vector width).
void add_norm_row_fast(T* out, T* sum, const T* x, const T* residual, const T* weight,
                       int64_t hidden, float epsilon) {
  using namespace vllm_cpu;
  fVec sum_sq(0.f);
  for (int64_t i = 0; i < hidden; i += kVecSize) {
    const fVec s = round_bf16(load_float(x + i) + load_float(residual + i));
    store_rounded(sum + i, s);
    sum_sq = at::vec::fmadd(s, s, sum_sq);
  }
  const float variance = at::vec::vec_reduce_all<float>(
      [](const fVec& a, const fVec& b) { return a + b; }, sum_sq);
  const fVec inv_rms(1.f / std::sqrt(variance / static_cast<float>(hidden) + epsilon));
  for (int64_t i = 0; i < hidden; i += kVecSize) {
    const fVec normed = round_bf16(load_float(sum + i) * inv_rms);
    store_rounded(out + i, round_bf16(normed * load_float(weight + i)));
  }
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

double run(int64_t mode, int64_t iters, int64_t rows, int64_t hidden, int64_t threads) {
  const int64_t n = rows * hidden;
  std::vector<T> x(n, T(0.5f)), res(n, T(0.25f)), weight(hidden, T(1.f));
  double elapsed = 0;
  volatile float sink = 0;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t c0 = hidden * t / nt, c1 = hidden * (t + 1) / nt;
    std::vector<T> own_x(x), own_res(res), normed(n), sums(n);
    float acc = 0;
#pragma omp barrier
    const double t0 = now_us();
    for (int64_t it = 0; it < iters; ++it) {
      const T v(0.5f + static_cast<float>(it & 7) * 0.125f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = c0; c < c1; ++c) x[r * hidden + c] = v;
      }
      if (t == nt - 1) {
        for (int64_t i = 0; i < n; ++i) res[i] = v;
      }
#pragma omp barrier
      const bool own = mode == 2 || mode == 5 || mode == 7;
      const T* xs = own ? own_x.data() : x.data();
      const T* rs = own ? own_res.data() : res.data();
      if (mode == 1 || mode == 2) {
        for (int64_t r = 0; r < rows; ++r) {
          vllm_cpu::add_rms_norm_row(normed.data() + r * hidden, sums.data() + r * hidden,
                                     xs + r * hidden, rs + r * hidden, weight.data(), hidden,
                                     1e-5f);
        }
      } else if (mode == 4 || mode == 5) {
        for (int64_t r = 0; r < rows; ++r) {
          add_norm_row_fused(normed.data() + r * hidden, sums.data() + r * hidden,
                             xs + r * hidden, rs + r * hidden, weight.data(), hidden, 1e-5f);
        }
      } else if (mode == 6 || mode == 7) {
        for (int64_t r = 0; r < rows; ++r) {
          add_norm_row_fast(normed.data() + r * hidden, sums.data() + r * hidden,
                            xs + r * hidden, rs + r * hidden, weight.data(), hidden, 1e-5f);
        }
      } else if (mode == 3) {
        for (int64_t i = 0; i < n; i += 32) acc += static_cast<float>(xs[i]) + static_cast<float>(rs[i]);
      }
      acc += static_cast<float>(normed[it % n]);
#pragma omp barrier
    }
    if (t == 0) elapsed = (now_us() - t0) / static_cast<double>(iters);
    sink = sink + acc;
  }
  return elapsed;
}

// 1 where the fused and fast rows give add_rms_norm_row's bits on random rows (with NaN, inf
// and values at rounding ties among them).
bool same_bits(int64_t rows, int64_t hidden) {
  at::Tensor x = at::randn({rows, hidden}).to(at::kBFloat16);
  at::Tensor r = at::randn({rows, hidden}).to(at::kBFloat16);
  at::Tensor w = at::randn({hidden}).to(at::kBFloat16);
  x.view(-1).index_put_({at::arange(0, x.numel(), 97)}, at::tensor(1.f / 0.f).to(at::kBFloat16));
  x.view(-1).index_put_({at::arange(5, x.numel(), 211)}, at::tensor(0.f / 0.f).to(at::kBFloat16));
  at::Tensor a = at::empty_like(x), b = at::empty_like(x), sa = at::empty_like(x),
             sb = at::empty_like(x), c = at::empty_like(x), sc = at::empty_like(x);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t o = i * hidden;
    vllm_cpu::add_rms_norm_row(a.data_ptr<T>() + o, sa.data_ptr<T>() + o, x.data_ptr<T>() + o,
                               r.data_ptr<T>() + o, w.data_ptr<T>(), hidden, 1e-5f);
    add_norm_row_fused(b.data_ptr<T>() + o, sb.data_ptr<T>() + o, x.data_ptr<T>() + o,
                       r.data_ptr<T>() + o, w.data_ptr<T>(), hidden, 1e-5f);
    add_norm_row_fast(c.data_ptr<T>() + o, sc.data_ptr<T>() + o, x.data_ptr<T>() + o,
                      r.data_ptr<T>() + o, w.data_ptr<T>(), hidden, 1e-5f);
  }
  const auto bits = [](const at::Tensor& t) { return t.view(at::kShort); };
  return at::equal(bits(a), bits(b)) && at::equal(bits(sa), bits(sb)) &&
         at::equal(bits(a), bits(c)) && at::equal(bits(sa), bits(sc));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run);
  m.def("same_bits", &same_bits);
}
