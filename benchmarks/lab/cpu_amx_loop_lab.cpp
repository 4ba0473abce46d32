// Lab (not part of the extension): what one thread's share of a short linear costs inside a
// decode step, where a batch-8 draft-20m loop took each thread ~4-5 us for 8-24 KB of packed
// panels and a batch-1 loop ~1.8 us for 32 KB of row-major rows (RESULTS.md, thirty-seventh and
// thirty-ninth sessions), while the stream lab (cpu_stream_lab.cpp) found the AMX tiles
// streaming at the read rate. Here each thread runs its share of a "linear" between two
// barriers, over and over, under the conditions a step has and the stream lab did not:
//   input   local: the M input rows are the thread's own, written by it before the barrier;
//           fresh: one shared copy, each thread writing its slice of the columns before the
//           barrier (a linear's input is the last loop's output, written by every core)
//   weights hot: the same share every round (in L1/L2); l2, l3, mem: the round's share one of
//           sets that together fill ~1 MB, ~4 MB (64 MB at 16 threads) or ~24 MB a thread
//   gap     the thread spins (no tile or vector work) G us after the barrier before its share
//           (a step's norms, attention and waits between two linears)
// for each kernel:
//   amx     the packed copy's panels on AMX tiles, up to 4 panels a pass, the inputs the A
//           tile (linear_amx.cpp's packed_panels_amx), tiles configured once a thread;
//           amx_ahead, amx_twoa, amx_upfront, amx_copy: the A tile's rows another way (AMode)
//   bcast   the same panels through AVX512_BF16 broadcasts (linear_packed.cpp's tiles)
//   gemv1   ONE input row against the same bytes as row-major rows (the batch-1 path's kind)
// Printed: median over rounds of the threads' mean us for their share (rdtsc around the
// kernel alone), the slowest thread's median beside it, per (kernel, input, weights) x gap.
//   g++ -O3 -fopenmp -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mamx-tile -mamx-bf16 \
//     cpu_amx_loop_lab.cpp -o amx_loop_lab
//   OMP_NUM_THREADS=16 OMP_PROC_BIND=close OMP_PLACES=cores ./amx_loop_lab [ROUNDS] [M]
// Without AMX or AVX512_BF16 (checked at run time) those kernels' rows are skipped.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cpuid.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using bf16 = uint16_t;

namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool has_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if ((d & (1u << 22)) == 0 || (d & (1u << 24)) == 0) return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

bool has_bf16_dot() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a & (1u << 5)) != 0;
}

// tiles 0-4 m rows (sums, A), 5-7 16 (B); two_a: tile 6 m rows too (amx_twoa's second A)
__attribute__((target("amx-tile"))) void amx_configure(int m, bool two_a) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(t < 5 || (two_a && t == 6) ? m : 16);
    cfg.colsb[t] = 64;
  }
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}

// a thread's share: P panels of 16 weight rows x K (packed: 1 KB a k-step of 32 columns), or
// the same bytes as 16 P row-major rows
struct Share {
  const bf16* w;
  const bf16* x;  // M rows, row stride ldx
  int64_t ldx, K, P;
  float* out;
  int M;
};

// How a pass treats its A tile (the input rows, 8 lines a k-step): kBase as the extension;
// kAhead prefetches them (T0) kAheadSteps k-steps ahead; kTwoA loads them into tiles 4 and 6 by
// turns and B into 5 and 7 (NB <= 2), so that a k-step's loads need not wait for the last
// k-step's multiply to free its tile; kUpfront prefetches every row of the share's input before
// the first k-step; kCopy copies them into a buffer of the thread's first (vector loads).
enum AMode { kBase, kAhead, kTwoA, kUpfront, kCopy };
constexpr int64_t kAheadSteps = 4;

template <int NB, AMode A>
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx_pass(const Share& s,
                                                                   const bf16* p) {
  const int64_t panel = 16 * s.K, steps = s.K / 32;
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
  for (int64_t st = 0; st < steps; ++st) {
    const bf16* b = p + st * 512;
    for (int t = 0; t < NB; ++t) {
      const char* q = reinterpret_cast<const char*>(b + t * panel) + 2048;
      for (int l = 0; l < 16; ++l) _mm_prefetch(q + 64 * l, _MM_HINT_T0);
    }
    if constexpr (A == kAhead) {
      if (st + kAheadSteps < steps) {
        for (int m = 0; m < s.M; ++m) {
          const bf16* line = s.x + m * s.ldx + (st + kAheadSteps) * 32;
          _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
        }
      }
    }
    if constexpr (A == kTwoA) {
      static_assert(NB <= 2, "tiles 0-1 sums, 4/6 A, 5/7 B");
      // the tile intrinsics take their tiles as literals: one k-step with A tile TA, the two
      // panels' B tiles TB0 and TB1
#define LAB_TWO_A_STEP(TA, TB0, TB1)                  \
  _tile_loadd(TA, s.x + st * 32, s.ldx * 2);          \
  _tile_loadd(TB0, b, 64);                            \
  _tile_dpbf16ps(0, TA, TB0);                         \
  if constexpr (NB > 1) {                             \
    _tile_loadd(TB1, b + panel, 64);                  \
    _tile_dpbf16ps(1, TA, TB1);                       \
  }
      if (st & 1) {
        LAB_TWO_A_STEP(6, 7, 5)
      } else {
        LAB_TWO_A_STEP(4, 5, 7)
      }
#undef LAB_TWO_A_STEP
      continue;
    }
    _tile_loadd(4, s.x + st * 32, s.ldx * 2);
    _tile_loadd(5, b, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (NB > 1) {
      _tile_loadd(6, b + panel, 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (NB > 2) {
      _tile_loadd(7, b + 2 * panel, 64);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (NB > 3) {
      _tile_loadd(5, b + 3 * panel, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, s.out, 64);
  if constexpr (NB > 1) _tile_stored(1, s.out + 256, 64);
  if constexpr (NB > 2) _tile_stored(2, s.out + 512, 64);
  if constexpr (NB > 3) _tile_stored(3, s.out + 768, 64);
}

template <AMode A>
void amx_passes(const Share& s) {
  const int64_t panel = 16 * s.K;
  int64_t p = 0;
  if constexpr (A == kTwoA) {
    for (; p + 2 <= s.P; p += 2) amx_pass<2, A>(s, s.w + p * panel);
    if (p < s.P) amx_pass<1, A>(s, s.w + p * panel);
    return;
  } else {
    for (; p + 4 <= s.P; p += 4) amx_pass<4, A>(s, s.w + p * panel);
    switch (s.P - p) {
      case 3: amx_pass<3, A>(s, s.w + p * panel); break;
      case 2: amx_pass<2, A>(s, s.w + p * panel); break;
      case 1: amx_pass<1, A>(s, s.w + p * panel); break;
      default: break;
    }
  }
}

__attribute__((target("avx512f"))) void amx(const Share& s, const std::string& kernel,
                                            bf16* copy) {
  if (kernel == "amx") {
    amx_passes<kBase>(s);
  } else if (kernel == "amx_ahead") {
    amx_passes<kAhead>(s);
  } else if (kernel == "amx_twoa") {
    amx_passes<kTwoA>(s);
  } else if (kernel == "amx_upfront") {
    for (int m = 0; m < s.M; ++m) {
      const char* row = reinterpret_cast<const char*>(s.x + m * s.ldx);
      for (int64_t o = 0; o < s.K * 2; o += 64) _mm_prefetch(row + o, _MM_HINT_T0);
    }
    amx_passes<kBase>(s);
  } else {  // amx_copy
    for (int m = 0; m < s.M; ++m) {
      for (int64_t k = 0; k < s.K; k += 32) {
        _mm512_storeu_si512(copy + m * s.K + k, _mm512_loadu_si512(s.x + m * s.ldx + k));
      }
    }
    Share local = s;
    local.x = copy;
    local.ldx = s.K;
    amx_passes<kBase>(local);
  }
}

template <int M>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void bcast(const Share& s) {
  const int64_t panel = 16 * s.K;
  for (int64_t p = 0; p < s.P; ++p) {
    const bf16* w = s.w + p * panel;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < s.K / 2; ++j) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + 32 * j);
      for (int m = 0; m < M; ++m) {
        int32_t pair;
        std::memcpy(&pair, s.x + m * s.ldx + 2 * j, 4);
        acc[m] = _mm512_dpbf16_ps(acc[m], wv, (__m512bh)_mm512_set1_epi32(pair));
      }
    }
    for (int m = 0; m < M; ++m) _mm512_storeu_ps(s.out + 16 * m, acc[m]);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void gemv1(const Share& s) {
  const int64_t rows = 16 * s.P;
  for (int64_t n = 0; n < rows; ++n) {
    const bf16* w = s.w + n * s.K;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t k = 0; k < s.K; k += 64) {
      a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k),
                            (__m512bh)_mm512_loadu_si512(s.x + k));
      a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + k + 32),
                            (__m512bh)_mm512_loadu_si512(s.x + k + 32));
    }
    s.out[n & 255] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
}

struct alignas(64) Flag {
  std::atomic<int64_t> v{0};
};

// a sense-free barrier: each thread's own arrival count, every thread waits for all
class Barrier {
 public:
  explicit Barrier(int n) : flags_(n) {}
  void wait(int t, int64_t gen) {
    flags_[t].v.store(gen, std::memory_order_release);
    for (auto& f : flags_) {
      while (f.v.load(std::memory_order_acquire) < gen) _mm_pause();
    }
  }

 private:
  std::vector<Flag> flags_;
};

double tsc_per_us() {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t c0 = __rdtsc();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50)) {
  }
  const uint64_t c1 = __rdtsc();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return (c1 - c0) / us;
}

void spin_cycles(uint64_t cycles) {
  const uint64_t end = __rdtsc() + cycles;
  while (__rdtsc() < end) _mm_pause();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 400;
  const int M = argc > 2 ? std::atoi(argv[2]) : 8;
  const bool amx_ok = has_amx(), dot_ok = has_bf16_dot();
  const int T = omp_get_max_threads();
  const double tpu = tsc_per_us();
  std::printf("threads %d, M %d, rounds %d, AMX %d, AVX512_BF16 %d, TSC %.0f MHz\n", T, M,
              rounds, amx_ok, dot_ok, tpu);
  // (K, panels a thread): draft-20m at 16 threads, 8 KB grain: o (256, 1), qkv (256, 3),
  // down (1024, 1), gate_up (256, 8); SmolLM2's o (576, 2)
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {256, 1}, {256, 3}, {1024, 1}, {256, 8}, {576, 2}};
  // LAB_KERNELS, LAB_WEIGHTS, LAB_GAPS (comma lists) pick a part of the table
  const auto list = [](const char* name, const char* all) {
    const char* v = std::getenv(name);
    std::string text = v != nullptr && *v != '\0' ? v : all;
    std::vector<std::string> out;
    for (size_t at = 0; at <= text.size();) {
      const size_t comma = std::min(text.find(',', at), text.size());
      out.push_back(text.substr(at, comma - at));
      at = comma + 1;
    }
    return out;
  };
  const std::vector<std::string> kernels =
      list("LAB_KERNELS", "amx,amx_ahead,amx_twoa,amx_upfront,amx_copy,bcast,gemv1");
  const std::vector<std::string> inputs = {"local", "fresh"};
  const std::vector<std::string> weights = list("LAB_WEIGHTS", "hot,l2,l3,mem");
  std::vector<double> gaps;
  for (const auto& g : list("LAB_GAPS", "0,3,20")) gaps.push_back(std::atof(g.c_str()));
  for (const auto& [K, P] : shapes) {
    const int64_t share = 16 * P * K;  // elements a thread a set
    std::printf("\nK %ld, %ld panels a thread (%ld KB)\n", K, P, share * 2 / 1024);
    std::printf("  %-6s %-6s %-4s", "kernel", "input", "w");
    for (double g : gaps) std::printf("   gap %4.0f: mean / max", g);
    std::printf("\n");
    for (const auto& kernel : kernels) {
      const bool tiles = kernel.rfind("amx", 0) == 0;
      if ((tiles && !amx_ok) || (!tiles && !dot_ok)) continue;
      for (const auto& input : inputs) {
        for (const auto& wset : weights) {
          const int64_t set_bytes = share * 2;
          const int64_t target = wset == "hot"  ? set_bytes
                                 : wset == "l2" ? (1 << 20)
                                 : wset == "l3" ? (4 << 20)
                                                : (24 << 20);
          const int64_t sets = std::max<int64_t>(1, target / set_bytes);
          std::vector<bf16> w(static_cast<size_t>(T * sets * share) + 64);
          for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<bf16>(0x3C00 + (i * 7919) % 255);
          std::vector<bf16> shared_x(static_cast<size_t>(M * K) + 64, 0x3F80);
          std::vector<std::vector<bf16>> own_x(T, std::vector<bf16>(M * K + 64, 0x3F80));
          std::printf("  %-6s %-6s %-4s", kernel.c_str(), input.c_str(), wset.c_str());
          for (double gap : gaps) {
            std::vector<std::vector<double>> us(T, std::vector<double>(rounds));
            Barrier barrier(T);
#pragma omp parallel num_threads(T)
            {
              const int t = omp_get_thread_num();
              if (tiles) amx_configure(M, kernel == "amx_twoa");
              alignas(64) float out[1024];
              std::vector<bf16> copy(static_cast<size_t>(M * K) + 64);
              const bool fresh = input == "fresh";
              bf16* x = fresh ? shared_x.data() : own_x[t].data();
              const int64_t cols = K / T > 0 ? K / T : K, c0 = std::min<int64_t>(t * cols, K);
              const int64_t c1 = std::min<int64_t>(c0 + cols, K);
              int64_t gen = 0;
              for (int r = -20; r < rounds; ++r) {
                // the last loop's output: a slice of every row (fresh) or all of the own rows
                const auto value = static_cast<bf16>(0x3F80 + (r & 7));
                for (int m = 0; m < M; ++m) {
                  for (int64_t c = fresh ? c0 : 0; c < (fresh ? c1 : K); ++c) x[m * K + c] = value;
                }
                barrier.wait(t, ++gen);
                if (gap > 0) spin_cycles(static_cast<uint64_t>(gap * tpu));
                const int64_t set = (r + 1000 * sets) % sets;
                const Share s{w.data() + (set * T + t) * share, x, K, K, P, out, M};
                const uint64_t c_start = __rdtsc();
                if (tiles) {
                  amx(s, kernel, copy.data());
                } else if (kernel == "bcast") {
                  if (M == 8) bcast<8>(s); else bcast<1>(s);
                } else {
                  gemv1(s);
                }
                const uint64_t c_end = __rdtsc();
                if (r >= 0) us[t][r] = (c_end - c_start) / tpu;
                barrier.wait(t, ++gen);
              }
              if (tiles) _tile_release();
            }
            std::vector<double> mean(rounds), worst(rounds);
            for (int r = 0; r < rounds; ++r) {
              double sum = 0, mx = 0;
              for (int t = 0; t < T; ++t) {
                sum += us[t][r];
                mx = std::max(mx, us[t][r]);
              }
              mean[r] = sum / T;
              worst[r] = mx;
            }
            std::printf("   %9.2f / %6.2f", median(mean), median(worst));
          }
          std::printf("\n");
        }
      }
    }
  }
  return 0;
}
