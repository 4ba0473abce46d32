// linear_small on the CPU: out[M, N] = input[M, K] @ weight[N, K]^T (+ bias) for few rows (a
// decode step: M of 1 to a few dozen). Each weight row is streamed from memory once, in address
// order, and used for every input row while it sits in registers, so the cost is the weight
// bytes; one parallel region gives each thread a contiguous block of weight rows.
#include "cpu/linear.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "core/checks.h"
#include "cpu/switches.h"
#include "cpu/team.h"
#include "cpu/vec.h"
#include "ops.h"

namespace vllm_cpu {
namespace {

constexpr int kTileM = 4;  // input rows per pass over a weight row (accumulators in registers)
// Rows up to which the GEMV beats torch's GEMM (oneDNN) on fp32 weights and on bf16 without
// AVX512_BF16 (2-3x faster at 1-4 rows, 1.3-2.2x at 8, about even at 16; benchmarks/RESULTS.md).
constexpr int64_t kGemvMaxRows = 8;
// With 2+ input rows the dot products of a weight row take longer than its bytes, and the
// hardware prefetcher alone fell behind: a software prefetch this far ahead of the weight read
// took 4 rows x 32000 x 576 bf16 from 9.6 to 15 GB/s on one core (no change at 1 row).
constexpr int64_t kPrefetchBytes = 2048;

// Input rows from which a bf16 step with a packed copy of its weight runs the packed tiles
// (linear_packed.cpp; up to kSmallMaxRows, as the row-major tiles). Paired whole forwards,
// 2-core Zen 4: Qwen2.5-0.5B 1.01x / 0.97x the row-major tiles at 4 / 6 rows, 1.04x at 8, 1.44x
// at 20; SmolLM2-135M 1.06x at 8, 1.26-1.49x at 16-40; Qwen2.5-1.5B 1.43x at 8. 2-core AMX Xeon:
// Qwen2.5-0.5B 1.24x at 2 rows and 1.22x at 4 (its matrices alone 1.20-1.30x at 2-6 rows, 1.07x
// at 1 row: not worth a copy of every weight for a batch-1 draft).
constexpr int64_t kPackedMinRows = 2;

template <int MB>
inline void prefetch_ahead(const void* p) {
  if constexpr (MB > 1) __builtin_prefetch(static_cast<const char*>(p) + kPrefetchBytes, 0, 3);
}

// One weight row n against input rows m0..m0+MB: out[m][n] = dot(x[m], w[n]) (+ bias[n]), fp32
// sums. The row is read front to back, alone: the tile walks the weights in address order, the
// one access pattern the hardware prefetchers follow at full speed (interleaving the streams of
// 4 adjacent rows read at 6-10 GB/s on one Zen 4 core, even without the math, against ~20 for a
// plain read; 2 interleaved rows were as slow). Two accumulators per input row
// (even and odd vector steps) halve the FMA dependency chain of a row.
template <typename T, int MB>
inline void row_tile(T* out, int64_t ldo, const float* x, int64_t ldx, const T* w,
                     const T* bias, int64_t k_dim, int64_t n, int64_t m0) {
  fVec acc0[MB], acc1[MB];
  for (int i = 0; i < MB; ++i) acc0[i] = acc1[i] = fVec(0.f);
  const T* wrow = w + n * k_dim;
  const float* xrow = x + m0 * ldx;
  int64_t k = 0;
  for (; k + 2 * kVecSize <= k_dim; k += 2 * kVecSize) {
    prefetch_ahead<MB>(wrow + k);
    if constexpr (sizeof(T) * 2 * kVecSize > 64) prefetch_ahead<MB>(wrow + k + kVecSize);
    const fVec w0 = load_float(wrow + k), w1 = load_float(wrow + k + kVecSize);
    for (int i = 0; i < MB; ++i) {
      acc0[i] = at::vec::fmadd(w0, fVec::loadu(xrow + i * ldx + k), acc0[i]);
      acc1[i] = at::vec::fmadd(w1, fVec::loadu(xrow + i * ldx + k + kVecSize), acc1[i]);
    }
  }
  for (; k < k_dim; k += kVecSize) {
    const int width = static_cast<int>(std::min<int64_t>(kVecSize, k_dim - k));
    const fVec wv = load_any(wrow + k, width);
    for (int i = 0; i < MB; ++i) {
      acc0[i] = at::vec::fmadd(wv, load_any(xrow + i * ldx + k, width), acc0[i]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    float sum = at::vec::vec_reduce_all<float>(
        [](const fVec& a, const fVec& b) { return a + b; }, acc0[i] + acc1[i]);
    if (bias != nullptr) sum += static_cast<float>(bias[n]);
    out[(m0 + i) * ldo + n] = static_cast<T>(sum);
  }
}

// Input rows a weight row's last pass may take (its earlier passes take kTileM): 5 and 6 rows in
// one pass instead of 4 + 1 and 4 + 2, 9 as 4 + 5 (2-core AVX2 EPYC, Qwen2.5-1.5B's four
// matrices in bf16, in turns: 1.26x / 1.10x / 1.08x faster; 4, 7, 10-20 rows even; a batch-1
// verification of 4 drafts is 5 rows). 12 accumulators and 2 weight vectors fit AVX2's 16
// registers, the inputs read as memory operands.
constexpr int64_t kLastPassMaxRows = 6;

template <typename T>
inline void row_all(T* out, int64_t ldo, const float* x, int64_t ldx, const T* w, const T* bias,
                    int64_t m_dim, int64_t k_dim, int64_t n) {
  int64_t m = 0;
  for (; m_dim - m > kLastPassMaxRows; m += kTileM) {
    row_tile<T, kTileM>(out, ldo, x, ldx, w, bias, k_dim, n, m);
  }
  switch (m_dim - m) {
    case 6: row_tile<T, 6>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
    case 5: row_tile<T, 5>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
    case 4: row_tile<T, 4>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
    case 3: row_tile<T, 3>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
    case 2: row_tile<T, 2>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
    case 1: row_tile<T, 1>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
    default: break;
  }
}

#if defined(CPU_CAPABILITY_AVX2)
// The AVX2 build's bf16 register tiles (VLLM_CPU_AVX2_TILES, on by default): 3 weight rows x
// up to 4 input rows, one accumulator a pair (12 of AVX2's 16 registers, with the 3 weight
// vectors and an input vector), so a weight vector, converted once, serves 4 input rows and an
// input vector 3 weight rows; row_tile loads an input vector for every multiply-add and converts
// each weight vector again at every pass. The first pass prefetches the next tile's weight rows
// (3 rows read side by side fell behind the hardware prefetcher: without a prefetch, 8 rows read
// no faster than row_all). SmolLM2-135M's four matrices x 30 layers, 2-core AVX2 EPYC, bf16, in
// turns with row_all (benchmarks/lab/cpu_packed_rows.py), each row then prefetched 2 KB ahead:
// 7 rows even, 8 rows 0.85-0.88x its time, 12 rows 0.78-0.80x, 16 rows 0.66-0.67x; 4-6 rows
// 1.07-1.19x (row_all keeps those). The next tile's rows instead (the AVX2 build on a 2-core
// AVX-512 Xeon, not yet on the EPYC; SmolLM2's and Qwen2.5-0.5B's matrices): 8 rows 0.75-0.83x
// row_all's time against 0.72-1.04x, 16 rows 0.48-0.77x against 0.49-0.84x. Written with
// intrinsics: the same tile over at::vec's types spilled and ran 1.2x slower than row_all at 8
// rows.
constexpr int64_t kAvx2TileMinRows = 8;

inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// [sum of a's 8 lanes, b's, c's, d's]
inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Weight rows n0 .. n0 + 2 against input rows m0 .. m0 + MR - 1 (fp32: linear_small_impl's copy).
template <int MR>
inline void tile_avx2(c10::BFloat16* out, int64_t ldo, const float* x, int64_t ldx,
                      const c10::BFloat16* w, const c10::BFloat16* bias, int64_t k_dim,
                      int64_t n0, int64_t m0) {
  __m256 acc[3][4];
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_setzero_ps();
  }
  const c10::BFloat16* w0 = w + n0 * k_dim;
  const c10::BFloat16* w1 = w0 + k_dim;
  const c10::BFloat16* w2 = w1 + k_dim;
  const float* xr = x + m0 * ldx;
  // the first pass fetches the next tile's 3 weight rows (contiguous) in address order, 48 bytes
  // a step
  const c10::BFloat16* next = m0 == 0 ? w0 + 3 * k_dim : nullptr;
  const int64_t whole = k_dim & ~int64_t{7};
  for (int64_t k = 0; k < whole; k += 8) {
    if (next != nullptr) __builtin_prefetch(next + 3 * k, 0, 3);
    const __m256 a = load8(w0 + k), b = load8(w1 + k), c = load8(w2 + k);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(xr + i * ldx + k);
      acc[0][i] = _mm256_fmadd_ps(a, xv, acc[0][i]);
      acc[1][i] = _mm256_fmadd_ps(b, xv, acc[1][i]);
      acc[2][i] = _mm256_fmadd_ps(c, xv, acc[2][i]);
    }
  }
  for (int r = 0; r < 3; ++r) {
    alignas(16) float sums[4];
    _mm_store_ps(sums, sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    const c10::BFloat16* wr = w0 + r * k_dim;
    for (int i = 0; i < MR; ++i) {
      float sum = sums[i];
      for (int64_t k = whole; k < k_dim; ++k) sum += static_cast<float>(wr[k]) * xr[i * ldx + k];
      if (bias != nullptr) sum += static_cast<float>(bias[n0 + r]);
      out[(m0 + i) * ldo + n0 + r] = static_cast<c10::BFloat16>(sum);
    }
  }
}

// Weight rows [n, end) against all m_dim input rows on tile_avx2, 3 at a time (passes of 4
// input rows, the last of what is left); n is left at the first of the fewer than 3 rows left.
inline void tiles_avx2(c10::BFloat16* out, int64_t ldo, const float* x, int64_t ldx,
                       const c10::BFloat16* w, const c10::BFloat16* bias, int64_t m_dim,
                       int64_t k_dim, int64_t& n, int64_t end) {
  for (; n + 3 <= end; n += 3) {
    int64_t m = 0;
    for (; m + 4 <= m_dim; m += 4) tile_avx2<4>(out, ldo, x, ldx, w, bias, k_dim, n, m);
    switch (m_dim - m) {
      case 3: tile_avx2<3>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
      case 2: tile_avx2<2>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
      case 1: tile_avx2<1>(out, ldo, x, ldx, w, bias, k_dim, n, m); break;
      default: break;
    }
  }
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
// The AVX-512 build's bf16 register tiles for CPUs without AVX512_BF16 (VLLM_CPU_AVX512_TILES,
// on by default; every row count): 4 weight rows x up to 6 input rows, one accumulator a pair
// (24 of the 32 registers, with the 4 weight vectors and an input vector), so a weight vector,
// converted once, serves 6 input rows and an input vector 4 weight rows; the first pass fetches
// the next tile's rows ahead. Before them such a CPU ran its bf16 linears of 9-64 rows on torch's
// GEMM (Qwen2.5-0.5B's four matrices x 24 layers at 20 rows in 11.1x their floor) and of 1-8 on
// row_all. In turns with row_all on a 2-core AVX-512 Xeon without AVX512_BF16 (VM; its four
// matrices x layers, benchmarks/lab/cpu_packed_rows.py, SETTING=VLLM_CPU_AVX512_TILES):
// Qwen2.5-1.5B 1.32 -> 1.00x its floor at 1 row, 1.16 -> 1.04x at 4, 2.17 -> 1.62x at 8, 5.77
// -> 2.98x at 20; SmolLM2-135M's matrices each 0.7-0.95x row_all's time at 1-16 rows. Without
// the next tile's prefetch the tiles lost at 2-8 rows where K is under ~1000 (1.2-1.3x row_all's
// time on the 0.5B's gate_up). Written with GCC's unroll pragmas: without them the accumulators
// went through the stack at every step.
constexpr int kAvx512TileN = 4;
constexpr int kAvx512TileRows = 6;

inline __m512 load16(const c10::BFloat16* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// sums[i] = the 16 lanes of s[i] added, i < 8, in one transposed tree (15 shuffles for
// the 8 sums, where a reduction apiece takes 4 each): per 128-bit lane, pairs of rows
// interleaved and added, then quadruples, then the four lanes folded. (The bf16 GEMV at 8 rows,
// 2-core Zen 4, paired against the per-row reductions: 6-7% faster over draft-20m's matrices,
// K = 256, 2% over SmolLM2-135M's, K = 576 and 1536.)
inline void reduce8(const __m512* s, float* sums) {
  __m512 t[4];  // t[p] per lane: [r0 part, r1 part, r0 part, r1 part] of rows 2p, 2p + 1
  for (int p = 0; p < 4; ++p) {
    t[p] = _mm512_add_ps(_mm512_unpacklo_ps(s[2 * p], s[2 * p + 1]),
                         _mm512_unpackhi_ps(s[2 * p], s[2 * p + 1]));
  }
  __m512 w[2];  // w[h] per lane: one partial sum of each of rows 4h .. 4h + 3
  for (int h = 0; h < 2; ++h) {
    w[h] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * h], t[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * h], t[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // lanes: [w0 L0 + L2, w0 L1 + L3, w1 L0 + L2, w1 L1 + L3], then each pair of lanes added
  __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2)));
  z = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(2, 3, 0, 1)));
  _mm_storeu_ps(sums, _mm512_castps512_ps128(z));
  _mm_storeu_ps(sums + 4, _mm512_extractf32x4_ps(z, 2));
}

// One step of 16 columns: weight rows w (k_dim apart) against MR input rows x (ldx apart) into
// acc, read under mask (all 16 lanes, or the columns' tail).
template <int MR>
inline void tile_avx512_step(__m512 (&acc)[kAvx512TileN][MR], const c10::BFloat16* w,
                             int64_t k_dim, const float* x, int64_t ldx, __mmask16 mask) {
  __m512 wv[kAvx512TileN];
#pragma GCC unroll 4
  for (int r = 0; r < kAvx512TileN; ++r) wv[r] = load16(w + r * k_dim, mask);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx);
#pragma GCC unroll 4
    for (int r = 0; r < kAvx512TileN; ++r) acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
  }
}

// Weight rows n0 .. n0 + 3 against input rows m0 .. m0 + MR - 1 (fp32: linear_small_impl's copy).
template <int MR>
inline void tile_avx512(c10::BFloat16* out, int64_t ldo, const float* x, int64_t ldx,
                        const c10::BFloat16* w, const c10::BFloat16* bias, int64_t k_dim,
                        int64_t n0, int64_t m0) {
  __m512 acc[kAvx512TileN][MR];
#pragma GCC unroll 4
  for (int r = 0; r < kAvx512TileN; ++r) {
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  const c10::BFloat16* w0 = w + n0 * k_dim;
  const float* xr = x + m0 * ldx;
  // the first pass fetches the next tile's weight rows (contiguous: kAvx512TileN x k_dim) as
  // it goes, two cache lines a step, in address order
  const c10::BFloat16* next = m0 == 0 ? w0 + kAvx512TileN * k_dim : nullptr;
  const int64_t whole = k_dim & ~int64_t{15};
  for (int64_t k = 0; k < whole; k += 16) {
    if (next != nullptr) {
      __builtin_prefetch(next + kAvx512TileN * k, 0, 3);
      __builtin_prefetch(next + kAvx512TileN * k + 32, 0, 3);
    }
    tile_avx512_step<MR>(acc, w0 + k, k_dim, xr + k, ldx, __mmask16(0xffff));
  }
  if (whole < k_dim) {
    tile_avx512_step<MR>(acc, w0 + whole, k_dim, xr + whole, ldx,
                         __mmask16((1u << (k_dim - whole)) - 1));
  }
  // the 4 x MR sums, 8 accumulators a transposed tree (reduce8), the last group padded
  constexpr int kSums = kAvx512TileN * MR, kGroups = (kSums + 7) / 8;
  __m512 flat[kGroups * 8];
#pragma GCC unroll 24
  for (int j = 0; j < kGroups * 8; ++j) {
    flat[j] = j < kSums ? acc[j / MR][j % MR] : _mm512_setzero_ps();
  }
  float sums[kGroups * 8];
#pragma GCC unroll 3
  for (int g = 0; g < kGroups; ++g) reduce8(flat + 8 * g, sums + 8 * g);
  for (int r = 0; r < kAvx512TileN; ++r) {
    const float b = bias != nullptr ? static_cast<float>(bias[n0 + r]) : 0.f;
    for (int i = 0; i < MR; ++i) {
      out[(m0 + i) * ldo + n0 + r] = static_cast<c10::BFloat16>(sums[r * MR + i] + b);
    }
  }
}

// Weight rows [n, end) against all m_dim input rows on tile_avx512, kAvx512TileN at a time, in
// passes of as even a share of the rows as kAvx512TileRows allows (20 rows: 4 passes of 5); n is
// left at the first of the fewer than kAvx512TileN rows left.
inline void tiles_avx512(c10::BFloat16* out, int64_t ldo, const float* x, int64_t ldx,
                         const c10::BFloat16* w, const c10::BFloat16* bias, int64_t m_dim,
                         int64_t k_dim, int64_t& n, int64_t end) {
  const int64_t passes = (m_dim + kAvx512TileRows - 1) / kAvx512TileRows;
  const int64_t per_pass = (m_dim + passes - 1) / passes;
  for (; n + kAvx512TileN <= end; n += kAvx512TileN) {
    for (int64_t m = 0; m < m_dim; m += per_pass) {
      for_rows_left<kAvx512TileRows>(std::min(per_pass, m_dim - m), [&](auto rows) {
        tile_avx512<decltype(rows)::value>(out, ldo, x, ldx, w, bias, k_dim, n, m);
      });
    }
  }
}
#endif

#ifdef VLLM_BF16_DOT
// Input rows from which a bf16 step runs on register tiles (tile_bf16) of kTileN weight rows x
// kTileRows input rows (fewer rows left over: a tile of as many). Fewer rows take row_bf16's one
// stream a weight row (or two, row_pair_bf16). Paired on the 2-core Zen 4, SmolLM2-135M and
// Qwen2.5-0.5B forwards: 4 x 6 as fast as or faster than 3 x 8, 4 x 5, 4 x 4 and 2 x 8 at 4, 5,
// 6, 8 and 20 rows; against row_bf16 even (SmolLM2) to 1.14x (Qwen) at 4 rows, 1.2-1.4x at 6-8
// (benchmarks/RESULTS.md, "register tiles").
constexpr int kTileN = 4;
constexpr int kTileRows = 6;
constexpr int64_t kTileMinRows = 4;
// At kTileMinRows rows a tile needs K of at least this many to pay for its reductions: at 4 rows
// and K = 576 (SmolLM2) the GEMV read 1.03-1.05x faster in its forward (5 of 7 pairs), at K = 896
// (Qwen2.5-0.5B) the tiles 1.13x.
constexpr int64_t kTileMinK4 = 768;

// One weight row n against MB input rows, in address order (see row_tile): two accumulators
// per input row, over the even and odd 32-column steps.
template <int MB>
VLLM_BF16_TARGET inline void row_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                      int64_t ldx, const c10::BFloat16* w,
                                      const c10::BFloat16* bias, int64_t k_dim, int64_t n) {
  static_assert(MB >= 1 && MB <= 8, "2 x MB accumulators must fit the 32 vector registers");
  __m512 acc0[MB], acc1[MB];
  for (int i = 0; i < MB; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  const c10::BFloat16* wrow = w + n * k_dim;
  int64_t k = 0;
  for (; k + 64 <= k_dim; k += 64) {
    prefetch_ahead<MB>(wrow + k);
    prefetch_ahead<MB>(wrow + k + 32);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wrow + k);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wrow + k + 32);
    for (int i = 0; i < MB; ++i) {
      acc0[i] = _mm512_dpbf16_ps(acc0[i], w0, (__m512bh)_mm512_loadu_si512(x + i * ldx + k));
      acc1[i] = _mm512_dpbf16_ps(acc1[i], w1, (__m512bh)_mm512_loadu_si512(x + i * ldx + k + 32));
    }
  }
  for (; k < k_dim; k += 32) {
    const __mmask32 mask =
        k + 32 <= k_dim ? ~__mmask32(0) : (__mmask32(1) << (k_dim - k)) - 1;
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, wrow + k);
    for (int i = 0; i < MB; ++i) {
      acc0[i] = _mm512_dpbf16_ps(acc0[i], wv,
                                 (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * ldx + k));
    }
  }
  float sums[MB];
  if constexpr (MB == 8) {
    __m512 both[8];
    for (int i = 0; i < 8; ++i) both[i] = _mm512_add_ps(acc0[i], acc1[i]);
    reduce8(both, sums);
  } else {
    for (int i = 0; i < MB; ++i) sums[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
  }
  for (int i = 0; i < MB; ++i) {
    float sum = sums[i];
    if (bias != nullptr) sum += static_cast<float>(bias[n]);
    out[i * ldo + n] = static_cast<c10::BFloat16>(sum);
  }
}

// One weight row at a time, in address order, against up to 8 input rows per pass (more rows:
// a pass per 8, the row re-read from L1).
VLLM_BF16_TARGET void row_all_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                   int64_t ldx, const c10::BFloat16* w,
                                   const c10::BFloat16* bias, int64_t m_dim, int64_t k_dim,
                                   int64_t n) {
  for (int64_t m = 0; m < m_dim; m += 8) {
    c10::BFloat16* o = out + m * ldo;
    const c10::BFloat16* xm = x + m * ldx;
    switch (std::min<int64_t>(8, m_dim - m)) {
#define VLLM_CASE(R) \
  case R: row_bf16<R>(o, ldo, xm, ldx, w, bias, k_dim, n); break;
      VLLM_CASE(8) VLLM_CASE(7) VLLM_CASE(6) VLLM_CASE(5) VLLM_CASE(4) VLLM_CASE(3) VLLM_CASE(2)
      VLLM_CASE(1)
#undef VLLM_CASE
      default: break;
    }
  }
}

// One input row against weight rows na and nb, read side by side: two address-order streams
// (each as row_bf16 reads one), the input's loads shared.
VLLM_BF16_TARGET inline void row_pair_bf16(c10::BFloat16* out, const c10::BFloat16* x,
                                           const c10::BFloat16* w, const c10::BFloat16* bias,
                                           int64_t k_dim, int64_t na, int64_t nb) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  const c10::BFloat16* wa = w + na * k_dim;
  const c10::BFloat16* wb = w + nb * k_dim;
  int64_t k = 0;
  for (; k + 64 <= k_dim; k += 64) {
    const __m512bh x0 = (__m512bh)_mm512_loadu_si512(x + k);
    const __m512bh x1 = (__m512bh)_mm512_loadu_si512(x + k + 32);
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(wa + k), x0);
    b0 = _mm512_dpbf16_ps(b0, (__m512bh)_mm512_loadu_si512(wb + k), x0);
    a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(wa + k + 32), x1);
    b1 = _mm512_dpbf16_ps(b1, (__m512bh)_mm512_loadu_si512(wb + k + 32), x1);
  }
  for (; k < k_dim; k += 32) {
    const __mmask32 mask =
        k + 32 <= k_dim ? ~__mmask32(0) : (__mmask32(1) << (k_dim - k)) - 1;
    const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + k);
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(mask, wa + k), xv);
    b0 = _mm512_dpbf16_ps(b0, (__m512bh)_mm512_maskz_loadu_epi16(mask, wb + k), xv);
  }
  float sa = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  float sb = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1));
  if (bias != nullptr) {
    sa += static_cast<float>(bias[na]);
    sb += static_cast<float>(bias[nb]);
  }
  out[na] = static_cast<c10::BFloat16>(sa);
  out[nb] = static_cast<c10::BFloat16>(sb);
}

// MB input rows against weight rows na and nb, read side by side (row_pair_bf16's two
// streams): one accumulator per (weight row, input row), each input load used by both rows.
// Taken at 2 rows (2-core Zen 4, paired: +14-30% GB/s over row_bf16); at 4 and 8 rows it read
// 0.6-0.85x as fast as row_bf16's one stream, so those stay there.
template <int MB>
VLLM_BF16_TARGET inline void rows_pair_bf16(c10::BFloat16* out, int64_t ldo,
                                            const c10::BFloat16* x, int64_t ldx,
                                            const c10::BFloat16* w, const c10::BFloat16* bias,
                                            int64_t k_dim, int64_t na, int64_t nb) {
  static_assert(MB >= 2 && MB <= 8, "2 x MB accumulators, 16 at most");
  __m512 a[MB], b[MB];
  for (int i = 0; i < MB; ++i) a[i] = b[i] = _mm512_setzero_ps();
  const c10::BFloat16* wa = w + na * k_dim;
  const c10::BFloat16* wb = w + nb * k_dim;
  for (int64_t k = 0; k < k_dim; k += 32) {
    const __mmask32 mask =
        k + 32 <= k_dim ? ~__mmask32(0) : (__mmask32(1) << (k_dim - k)) - 1;
    const __m512bh va = (__m512bh)_mm512_maskz_loadu_epi16(mask, wa + k);
    const __m512bh vb = (__m512bh)_mm512_maskz_loadu_epi16(mask, wb + k);
    for (int i = 0; i < MB; ++i) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * ldx + k);
      a[i] = _mm512_dpbf16_ps(a[i], va, xv);
      b[i] = _mm512_dpbf16_ps(b[i], vb, xv);
    }
  }
  for (int i = 0; i < MB; ++i) {
    float sa = _mm512_reduce_add_ps(a[i]), sb = _mm512_reduce_add_ps(b[i]);
    if (bias != nullptr) {
      sa += static_cast<float>(bias[na]);
      sb += static_cast<float>(bias[nb]);
    }
    out[i * ldo + na] = static_cast<c10::BFloat16>(sa);
    out[i * ldo + nb] = static_cast<c10::BFloat16>(sb);
  }
}

// Weight rows na and nb against all m_dim (1 or 2) input rows, side by side.
VLLM_BF16_TARGET void pair_all_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                    int64_t ldx, const c10::BFloat16* w,
                                    const c10::BFloat16* bias, int64_t m_dim, int64_t k_dim,
                                    int64_t na, int64_t nb) {
  switch (m_dim) {
    case 1: row_pair_bf16(out, x, w, bias, k_dim, na, nb); break;
    case 2: rows_pair_bf16<2>(out, ldo, x, ldx, w, bias, k_dim, na, nb); break;
    default: break;
  }
}

// NR weight rows (n0 ..) against MR input rows (m0 ..), register-blocked: one accumulator per
// (weight row, input row), so a loaded weight vector serves MR input rows and an input vector NR
// weight rows. row_bf16 loads an input vector per multiply-add, and from 4 rows on those loads,
// not the weight bytes, bound it (2-core Zen 4: 155-200 GFLOP/s at 8-20 rows, where the
// multiply-adds alone would run at ~470). The first pass over these rows (m0 = 0) prefetches
// the next NR rows (the next tile's bytes, in address order) into L2, one line per weight row
// and 32 columns, so the weights stream while the tile computes; into L1 instead, they evicted
// the input rows the tile re-reads (2 x 8 tiles, 8 rows of a 467 MB matrix: 1.0x the GEMV,
// against 1.7x), and prefetching 2, 4 or 8 tiles ahead measured the same as 1.
template <int NR, int MR>
VLLM_BF16_TARGET inline void tile_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                       int64_t ldx, const c10::BFloat16* w,
                                       const c10::BFloat16* bias, int64_t k_dim, int64_t n0,
                                       int64_t m0) {
  static_assert(NR * MR <= 24, "NR x MR accumulators, NR weights and an input in 32 registers");
  __m512 acc[NR * MR];
  for (int a = 0; a < NR * MR; ++a) acc[a] = _mm512_setzero_ps();
  const c10::BFloat16* wr = w + n0 * k_dim;
  const c10::BFloat16* next = wr + NR * k_dim;
  const c10::BFloat16* xr = x + m0 * ldx;
  const bool prefetch_next = m0 == 0;
  int64_t k = 0;
  for (; k + 32 <= k_dim; k += 32) {
    if (prefetch_next) {
      for (int r = 0; r < NR; ++r) __builtin_prefetch(next + k * NR + r * 32, 0, 1);
    }
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(wr + r * k_dim + k);
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xr + i * ldx + k);
      for (int r = 0; r < NR; ++r) acc[i * NR + r] = _mm512_dpbf16_ps(acc[i * NR + r], wv[r], xv);
    }
  }
  if (k < k_dim) {
    const __mmask32 mask = (__mmask32(1) << (k_dim - k)) - 1;
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) {
      wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, wr + r * k_dim + k);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, xr + i * ldx + k);
      for (int r = 0; r < NR; ++r) acc[i * NR + r] = _mm512_dpbf16_ps(acc[i * NR + r], wv[r], xv);
    }
  }
  // the sums 16 at a time in one transposed tree (reduce16: 30 shuffles, where a reduction
  // apiece takes 4 each); the copy keeps acc out of memory inside the loop
  constexpr int kGroups = (NR * MR + 15) / 16;
  float sums[kGroups * 16];
  for (int g = 0; g < kGroups; ++g) {
    __m512 part[16];
    for (int a = 0; a < 16; ++a) {
      part[a] = g * 16 + a < NR * MR ? acc[g * 16 + a] : _mm512_setzero_ps();
    }
    _mm512_storeu_ps(sums + g * 16, reduce16(part));
  }
  for (int i = 0; i < MR; ++i) {
    for (int r = 0; r < NR; ++r) {
      float sum = sums[i * NR + r];
      if (bias != nullptr) sum += static_cast<float>(bias[n0 + r]);
      out[(m0 + i) * ldo + n0 + r] = static_cast<c10::BFloat16>(sum);
    }
  }
}

// Weight rows [n, end) against all m_dim input rows: NR weight rows at a time, each group against
// MR input rows at a time (its rows re-read from cache after the first pass); n is left at the
// first of the fewer than NR rows that remain.
template <int NR, int MR>
VLLM_BF16_TARGET void tiles_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                 int64_t ldx, const c10::BFloat16* w, const c10::BFloat16* bias,
                                 int64_t m_dim, int64_t k_dim, int64_t& n, int64_t end) {
  for (; n + NR <= end; n += NR) {
    int64_t m = 0;
    for (; m + MR <= m_dim; m += MR) {
      tile_bf16<NR, MR>(out, ldo, x, ldx, w, bias, k_dim, n, m);
    }
    for_rows_left<MR - 1>(m_dim - m, [&](auto r) {
      tile_bf16<NR, decltype(r)::value>(out, ldo, x, ldx, w, bias, k_dim, n, m);
    });
  }
}

// VLLM_CPU_GEMV_STREAMS (read at every call): 2 (default) reads the block of weight rows of a
// GEMV of 1 or 2 input rows as two streams, its two halves side by side; 1 as one.
int gemv_streams() {
  const char* v = setting_value("VLLM_CPU_GEMV_STREAMS");
  if (v == nullptr || std::string(v) == "2") return 2;
  TORCH_CHECK(std::string(v) == "1", "VLLM_CPU_GEMV_STREAMS must be 1 or 2, got '", v, "'");
  return 1;
}

void linear_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x, int64_t ldx,
                 const c10::BFloat16* w, const c10::BFloat16* bias, int64_t m_dim, int64_t n_dim,
                 int64_t k_dim) {
  // contiguous blocks of weight rows per thread, at least ~32 KB each
  const int64_t grain = std::max<int64_t>(1, (int64_t{32} << 10) / (k_dim * 2));
  const bool pairs = m_dim <= 2 && gemv_streams() == 2;
  parallel_for(0, n_dim, grain, [&](int64_t begin, int64_t end) {
    int64_t n = begin;
    if (m_dim > kTileMinRows || (m_dim == kTileMinRows && k_dim >= kTileMinK4)) {
      tiles_bf16<kTileN, kTileRows>(out, ldo, x, ldx, w, bias, m_dim, k_dim, n, end);
    }
    if (pairs) {
      const int64_t half = (end - begin) / 2;
      for (int64_t i = 0; i < half; ++i) {
        pair_all_bf16(out, ldo, x, ldx, w, bias, m_dim, k_dim, begin + i, begin + half + i);
      }
      n = begin + 2 * half;
    }
    for (; n < end; ++n) row_all_bf16(out, ldo, x, ldx, w, bias, m_dim, k_dim, n);
  });
}

#endif

// Whether linear_small_impl beats torch's GEMM at `rows` input rows of `dtype`: up to
// kGemvMaxRows (8) rows always; bf16 up to kSmallMaxRows (64) on AVX512_BF16 (register tiles)
// and in the AVX2 and AVX-512 builds without it (the GEMV, a pass per 4 rows over each weight
// row, against torch's bf16 GEMM at 3.1-4.1x its time: 2-core AVX2 EPYC, SmolLM2's and
// draft-20m's matrices at 16-64 rows, benchmarks/RESULTS.md, twenty-sixth session; on a 2-core
// AVX-512 Xeon without AVX512_BF16, Qwen2.5-0.5B's matrices at 20 rows, torch 301 ms, the GEMV
// 143-183, tile_avx512 88-89: thirty-fifth session).
bool linear_small_pays(at::ScalarType dtype, int64_t rows) {
  if (rows <= kGemvMaxRows) return true;
  if (dtype != at::kBFloat16 || rows > kSmallMaxRows) return false;
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  return true;
#else
  return false;
#endif
}

}  // namespace

bool linear_rows_folds(at::ScalarType dtype, int64_t rows) {
  return packed_weights_apply(dtype) && rows >= kPackedMinRows && rows <= kSmallMaxRows;
}

bool linear_rows_in_house(at::ScalarType dtype, int64_t rows, bool packed) {
  return (packed && linear_rows_folds(dtype, rows)) || linear_small_pays(dtype, rows);
}

bool has_bf16_dot() {
#ifdef VLLM_BF16_DOT
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

template <typename T>
void linear_small_impl(T* out, int64_t ldo, const T* input, int64_t ldi, const T* weight,
                       const T* bias, int64_t m_dim, int64_t n_dim, int64_t k_dim) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (linear_amx_bf16(out, ldo, input, ldi, weight, bias, m_dim, n_dim, k_dim)) return;
  }
#ifdef VLLM_BF16_DOT
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (has_bf16_dot()) {
      linear_bf16(out, ldo, input, ldi, weight, bias, m_dim, n_dim, k_dim);
      return;
    }
  }
#endif
  // fp32 input is read in place; bf16 (no AVX512_BF16) once in fp32 (a few KB, read from cache
  // for every weight row)
  const float* x = nullptr;
  int64_t ldx = ldi;
  std::vector<float> x_buf;
  if constexpr (std::is_same_v<T, float>) {
    x = input;
  } else {
    x_buf.resize(m_dim * k_dim);
    for (int64_t m = 0; m < m_dim; ++m) {
      for (int64_t k = 0; k < k_dim; ++k) x_buf[m * k_dim + k] = static_cast<float>(input[m * ldi + k]);
    }
    x = x_buf.data();
    ldx = k_dim;
  }
  // contiguous blocks of weight rows per thread, at least ~32 KB each: below that a thread costs
  // more than it streams
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{32} << 10) / (k_dim * static_cast<int64_t>(sizeof(T))));
#if defined(CPU_CAPABILITY_AVX2)
  const bool avx2_tiles = std::is_same_v<T, c10::BFloat16> && m_dim >= kAvx2TileMinRows &&
                          switched_on("VLLM_CPU_AVX2_TILES");
#elif defined(CPU_CAPABILITY_AVX512)
  const bool avx512_tiles =
      std::is_same_v<T, c10::BFloat16> && switched_on("VLLM_CPU_AVX512_TILES");
#endif
  parallel_for(0, n_dim, grain, [&](int64_t begin, int64_t end) {
    int64_t n = begin;
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (avx2_tiles) tiles_avx2(out, ldo, x, ldx, weight, bias, m_dim, k_dim, n, end);
    }
#elif defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (avx512_tiles) tiles_avx512(out, ldo, x, ldx, weight, bias, m_dim, k_dim, n, end);
    }
#endif
    for (; n < end; ++n) row_all<T>(out, ldo, x, ldx, weight, bias, m_dim, k_dim, n);
  });
}

template void linear_small_impl<float>(float*, int64_t, const float*, int64_t, const float*,
                                       const float*, int64_t, int64_t, int64_t);
template void linear_small_impl<c10::BFloat16>(c10::BFloat16*, int64_t, const c10::BFloat16*,
                                               int64_t, const c10::BFloat16*,
                                               const c10::BFloat16*, int64_t, int64_t, int64_t);

void linear_rows(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                 const at::Tensor* bias, const at::Tensor* packed, const LinearFold* fold) {
  const int64_t rows = input.size(0);
  const bool tiles = packed != nullptr && linear_rows_folds(weight.scalar_type(), rows);
  TORCH_CHECK(fold == nullptr || tiles,
              "linear_rows: a fold needs the packed tiles (bf16 on AVX512_BF16, packed weights, ",
              kPackedMinRows, "-", kSmallMaxRows, " rows), got ", rows, " rows of ",
              weight.scalar_type());
  if (tiles) {
    auto* o = out.data_ptr<c10::BFloat16>();
    const auto* x = input.data_ptr<c10::BFloat16>();
    const auto* b = bias != nullptr ? bias->data_ptr<c10::BFloat16>() : nullptr;
    // AMX tiles on the packed copy first where the CPU has them and VLLM_CPU_AMX takes these
    // rows (AMX on the H200's host: 0.40-0.89x the register tiles' time at 8-16 rows, where the
    // packed tiles were 0.83-0.97x)
    const auto* p = packed->data_ptr<c10::BFloat16>();
    if (linear_amx_packed_bf16(o, out.stride(0), x, input.stride(0), p, b, rows,
                               weight.size(0), weight.size(1), fold) ||
        linear_packed_bf16(o, out.stride(0), x, input.stride(0), p, b, rows, weight.size(0),
                           weight.size(1), fold)) {
      return;
    }
  }
  if (!linear_small_pays(weight.scalar_type(), input.size(0))) {
    if (bias != nullptr) {
      at::addmm_out(out, *bias, input, weight.t());
    } else {
      at::mm_out(out, input, weight.t());
    }
    return;
  }
  VLLM_CPU_DISPATCH_FLOAT_TYPES(weight.scalar_type(), "linear_small", [&] {
    linear_small_impl<scalar_t>(out.data_ptr<scalar_t>(), out.stride(0),
                                input.data_ptr<scalar_t>(), input.stride(0),
                                weight.data_ptr<scalar_t>(),
                                bias != nullptr ? bias->data_ptr<scalar_t>() : nullptr,
                                input.size(0), weight.size(0), weight.size(1));
  });
}

void linear_small(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias) {
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  vllm::check_linear_small_args(out, input, weight, b);
  linear_rows(out, input, weight, b);
}

}  // namespace vllm_cpu
