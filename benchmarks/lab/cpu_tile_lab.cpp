// Lab (not part of the extension): the bf16 linear of a few rows, out[m][n] = x[m] . w[n], two
// ways on AVX512_BF16, to predict what prepacking the weights at load would buy.
//   rowmajor: the extension's register tiles (csrc/cpu/linear.cpp, tile_bf16): 4 weight rows x
//     6 input rows, each accumulator a 16-lane partial of one output, reduced at the tile's end.
//   packed: the weights stored as [N / 16][K / 2][16][2] (each vector: 16 weight rows x 2
//     columns), 2 such vectors x 12 input rows; an input's column pair broadcast to every lane,
//     so each accumulator holds 16 finished outputs: no horizontal sums, one sequential stream.
// GFLOP/s per shape and row count, the two in turns, best of the passes; 2 OpenMP threads unless
// OMP_NUM_THREADS says otherwise.
//   g++ -O3 -fopenmp -mavx512f -mavx512bw -mavx512vl -mavx512bf16 cpu_tile_lab.cpp -o tile_lab
// (-O3 as the extension builds: at -O2 GCC keeps the accumulator arrays in memory)
//   ./tile_lab
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

using bf16 = uint16_t;

static bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<bf16>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

template <int NR, int MR>
static void rowmajor_tile(float* out, int64_t n_dim, const bf16* x, const bf16* w, int64_t k_dim,
                          int64_t n0, int64_t m0) {
  __m512 acc[NR * MR];
  for (int a = 0; a < NR * MR; ++a) acc[a] = _mm512_setzero_ps();
  const bf16* wr = w + n0 * k_dim;
  const bf16* next = wr + NR * k_dim;
  for (int64_t k = 0; k < k_dim; k += 32) {
    if (m0 == 0) {
      for (int r = 0; r < NR; ++r) __builtin_prefetch(next + k * NR + r * 32, 0, 1);
    }
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(wr + r * k_dim + k);
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + i) * k_dim + k);
      for (int r = 0; r < NR; ++r) acc[i * NR + r] = _mm512_dpbf16_ps(acc[i * NR + r], wv[r], xv);
    }
  }
  float sums[NR * MR];
  for (int a = 0; a < NR * MR; ++a) sums[a] = _mm512_reduce_add_ps(acc[a]);
  for (int i = 0; i < MR; ++i) {
    for (int r = 0; r < NR; ++r) out[(m0 + i) * n_dim + n0 + r] = sums[i * NR + r];
  }
}

// f(std::integral_constant<int, rows>) for the rows (1 .. R) left over after the full tiles.
template <int R, typename F>
static void with_rows(int64_t rows, F&& f) {
  if constexpr (R > 0) {
    if (rows == R) {
      f(std::integral_constant<int, R>{});
    } else {
      with_rows<R - 1>(rows, f);
    }
  }
}

static void rowmajor(float* out, const bf16* x, const bf16* w, int64_t m_dim, int64_t n_dim,
                     int64_t k_dim) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_dim; n += 4) {
    int64_t m = 0;
    for (; m + 6 <= m_dim; m += 6) rowmajor_tile<4, 6>(out, n_dim, x, w, k_dim, n, m);
    with_rows<5>(m_dim - m, [&](auto r) { rowmajor_tile<4, r()>(out, n_dim, x, w, k_dim, n, m); });
  }
}

// w [n_dim, k_dim] -> [n_dim / 16][k_dim / 2][16][2]
static std::vector<bf16> pack(const std::vector<bf16>& w, int64_t n_dim, int64_t k_dim) {
  std::vector<bf16> p(n_dim * k_dim);
  for (int64_t n = 0; n < n_dim; ++n) {
    for (int64_t k = 0; k < k_dim; ++k) {
      p[((n / 16) * (k_dim / 2) + k / 2) * 32 + (n % 16) * 2 + k % 2] = w[n * k_dim + k];
    }
  }
  return p;
}

template <int NB, int MR>
static void packed_tile(float* out, int64_t n_dim, const bf16* x, const bf16* p, int64_t k_dim,
                        int64_t nb0, int64_t m0) {
  __m512 acc[NB * MR];
  for (int a = 0; a < NB * MR; ++a) acc[a] = _mm512_setzero_ps();
  const int64_t panel = k_dim * 16;  // elements of one 16-row panel
  const bf16* pr = p + nb0 * panel;
  for (int64_t kp = 0; kp < k_dim / 2; ++kp) {
    __m512bh wv[NB];
    for (int b = 0; b < NB; ++b) {
      if (m0 == 0) __builtin_prefetch(pr + b * panel + kp * 32 + 1024, 0, 1);
      wv[b] = (__m512bh)_mm512_loadu_si512(pr + b * panel + kp * 32);
    }
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, x + (m0 + i) * k_dim + 2 * kp, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < NB; ++b) acc[i * NB + b] = _mm512_dpbf16_ps(acc[i * NB + b], wv[b], xv);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(out + (m0 + i) * n_dim + (nb0 + b) * 16, acc[i * NB + b]);
  }
}

static void packed(float* out, const bf16* x, const bf16* p, int64_t m_dim, int64_t n_dim,
                   int64_t k_dim) {
#pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < n_dim / 16; nb += 2) {
    int64_t m = 0;
    for (; m + 12 <= m_dim; m += 12) packed_tile<2, 12>(out, n_dim, x, p, k_dim, nb, m);
    with_rows<11>(m_dim - m, [&](auto r) { packed_tile<2, r()>(out, n_dim, x, p, k_dim, nb, m); });
  }
}

int main() {
  struct Shape { const char* name; int64_t n, k; };
  const Shape shapes[] = {{"qwen1.5b gate_up (55 MB)", 17920, 1536},
                          {"qwen1.5b logits (467 MB)", 151936, 1536},
                          {"qwen0.5b gate_up (17 MB)", 9728, 896},
                          {"cache-resident 1024 x 1536", 1024, 1536}};
  std::mt19937 gen(0);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (const Shape& s : shapes) {
    std::vector<bf16> w(s.n * s.k);
    for (auto& v : w) v = to_bf16(dist(gen) * 0.05f);
    const std::vector<bf16> p = pack(w, s.n, s.k);
    for (int64_t m : {4, 8, 16, 20}) {
      std::vector<bf16> x(m * s.k);
      for (auto& v : x) v = to_bf16(dist(gen));
      std::vector<float> a(m * s.n), b(m * s.n);
      double best[2] = {1e9, 1e9};
      for (int pass = 0; pass < 7; ++pass) {
        for (int which = 0; which < 2; ++which) {
          const auto t0 = std::chrono::steady_clock::now();
          if (which == 0) {
            rowmajor(a.data(), x.data(), w.data(), m, s.n, s.k);
          } else {
            packed(b.data(), x.data(), p.data(), m, s.n, s.k);
          }
          const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (pass > 0 && t < best[which]) best[which] = t;
        }
      }
      double err = 0, ref = 0;  // the two agree (fp32 sums of the same products, other orders)
      for (int64_t i = 0; i < m * s.n; ++i) {
        err = std::max(err, static_cast<double>(std::abs(a[i] - b[i])));
        ref = std::max(ref, static_cast<double>(std::abs(a[i])));
      }
      const double flop = 2.0 * m * s.n * s.k;
      std::printf("%-28s m=%2ld  rowmajor %6.1f  packed %6.1f GFLOP/s  (%.2fx; rel. diff %.1e)\n",
                  s.name, static_cast<long>(m), flop / best[0] / 1e9, flop / best[1] / 1e9,
                  best[0] / best[1], err / ref);
    }
  }
  return 0;
}
