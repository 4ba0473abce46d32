// Lab (not part of the extension): how fast the threads of a many-core host stream bf16 weights
// from memory through each way this engine multiplies a few input rows by them, to tell apart
// what limits the AMX tiles at batch 8 (measured 1.1-1.8x the one-row GEMV's time over the same
// bytes inside a step on the H100's host): the tile loads from memory, the prefetching, or
// neither (the parallel split and the step around the linears).
//
// One buffer of weights far larger than the caches, split into contiguous shares, one a thread
// (OpenMP, one region a pass, a barrier before and after the timed part), each share read once a
// pass in address order; GB/s of weight bytes, the median of the passes, the kernels in turns.
// The same bytes read as row-major rows of K (the GEMVs) or as the packed copy's panels (16
// weight rows x K, 1 KB a k-step of 32 columns: the AMX B tile as it lies) (the rest):
//   read          AVX-512 loads only (what a thread can pull)
//   gemv m        the one-stream GEMV over row-major rows: m input rows a weight row (m = 1:
//                 linear.cpp's batch-1 path; 8: one pass for 8 rows, dot products and sums)
//   bcast m       the packed AVX512_BF16 tiles: an input pair broadcast against a panel's vector
//   amx m pfX     AMX, one panel a pass (one stream), the B tile loaded from memory; pf: none,
//                 t1:D (L2, D bytes ahead, one line a 64 B of tile), t0:D (L1)
//   amx4 m        AMX, 4 panels a pass side by side (the extension's kernel), pf t1 2 KB
//   amxst m       AMX, each 1 KB B tile read with 16 vector loads into an L1 buffer first
//   amxl1 m       AMX from an L1-resident tile only (the tile unit's own ceiling; no streaming)
// With a third argument P (bursts): the buffer read as a sequence of linears of P panels a
// thread, a barrier after each, as a decode step's (us a burst too); there also amx up16K (16 KB
// of the share requested up front) and amx4 cfg / cfg+rel (the tile configuration loaded before,
// and the tiles released after, each burst, as the extension does once a linear a thread), and
// amx4 x own / shared / normed (8 rows: a step's hand-off of the input rows, amx4_handoff).
//     g++ -O3 -fopenmp -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mamx-tile -mamx-bf16
//       cpu_stream_lab.cpp -o stream_lab   (one line)
//     OMP_NUM_THREADS=16 ./stream_lab [K=576] [MB=1024] [P]
// (results: benchmarks/RESULTS.md, twenty-seventh session; the tile configuration struct is
// the extension's own layout, restated so the lab builds alone)
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using bf16 = uint16_t;

namespace {

int64_t K = 576;  // a weight row's bf16 columns (a multiple of 32)

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// tiles 0-3: accumulators (m rows x 16 fp32), 4: the input rows (m x 32 bf16), 5-7: B (16 pair
// rows x 16 columns of pairs)
void amx_configure(int m) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 5; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(m);
    cfg.colsb[t] = 64;
  }
  for (int t = 5; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

struct Share {
  const bf16* begin;  // the thread's weights: [begin, end)
  const bf16* end;
  const bf16* x;  // its input rows: m x K, row-major (in L1)
  float* out;     // scratch output
};

uint64_t sink_bits = 0;

void read_only(const Share& s) {
  __m512i acc = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  for (const bf16* p = s.begin; p < s.end; p += 64) {
    acc = _mm512_xor_si512(acc, _mm512_load_si512(p));
    acc1 = _mm512_xor_si512(acc1, _mm512_load_si512(p + 32));
  }
  alignas(64) uint64_t v[8];
  _mm512_store_si512(v, _mm512_xor_si512(acc, acc1));
  __atomic_fetch_xor(&sink_bits, v[0], __ATOMIC_RELAXED);
}

// gemv: each weight row once, against M input rows, two accumulators a row
template <int M>
void gemv(const Share& s) {
  const int64_t rows = (s.end - s.begin) / K;
  for (int64_t n = 0; n < rows; ++n) {
    const bf16* w = s.begin + n * K;
    __m512 a0[M], a1[M];
    for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 64) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
      for (int m = 0; m < M; ++m) {
        a0[m] = _mm512_dpbf16_ps(a0[m], w0, (__m512bh)_mm512_loadu_si512(s.x + m * K + k));
        a1[m] = _mm512_dpbf16_ps(a1[m], w1, (__m512bh)_mm512_loadu_si512(s.x + m * K + k + 32));
      }
    }
    for (int m = 0; m < M; ++m) s.out[m * 16 + (n & 15)] = _mm512_reduce_add_ps(_mm512_add_ps(a0[m], a1[m]));
  }
}

// bcast: a panel's k-pair vectors (16 weight rows x 2 columns) against each input row's pair
template <int M>
void bcast(const Share& s) {
  const int64_t panel = 16 * K;
  const uint32_t* x32 = reinterpret_cast<const uint32_t*>(s.x);
  for (const bf16* p = s.begin; p + panel <= s.end; p += panel) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < K / 2; ++j) {
      const __m512bh w = (__m512bh)_mm512_load_si512(p + 32 * j);
      for (int m = 0; m < M; ++m) {
        acc[m] = _mm512_dpbf16_ps(acc[m], w, (__m512bh)_mm512_set1_epi32(x32[m * K / 2 + j]));
      }
    }
    for (int m = 0; m < M; ++m) _mm512_storeu_ps(s.out + 16 * m, acc[m]);
  }
}

// pf: 0 none, 1 T1 (L2), 2 T0 (L1); dist bytes ahead of the k-step being loaded
__attribute__((target("amx-tile,amx-bf16,avx512f"))) inline void prefetch_tile(const bf16* b,
                                                                               int pf,
                                                                               int64_t dist) {
  const char* q = reinterpret_cast<const char*>(b) + dist;
  if (pf == 1) {
    for (int l = 0; l < 16; ++l) _mm_prefetch(q + 64 * l, _MM_HINT_T1);
  } else if (pf == 2) {
    for (int l = 0; l < 16; ++l) _mm_prefetch(q + 64 * l, _MM_HINT_T0);
  }
}

// one panel a pass: k-steps in address order, so one stream a thread; upfront: bytes of the
// share requested (L2) before the first tile load
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx1(const Share& s, int pf,
                                                               int64_t dist,
                                                               int64_t upfront = 0) {
  const int64_t panel = 16 * K, steps = K / 32;
  const char* first = reinterpret_cast<const char*>(s.begin);
  const int64_t bytes = (s.end - s.begin) * 2;
  for (int64_t o = 0; o < std::min(upfront, bytes); o += 64) _mm_prefetch(first + o, _MM_HINT_T1);
  const bf16* last = s.end - 512;  // the share's last k-step: nothing past it is requested
  for (const bf16* p = s.begin; p + panel <= s.end; p += panel) {
    _tile_zero(0);
    for (int64_t st = 0; st < steps; ++st) {
      const bf16* b = p + st * 512;
      if (b + dist / 2 <= last) prefetch_tile(b, pf, dist);
      _tile_loadd(4, s.x + st * 32, K * 2);
      _tile_loadd(5, b, 64);
      _tile_dpbf16ps(0, 4, 5);
    }
    _tile_stored(0, s.out, 64);
  }
}

// four panels a pass, side by side (the extension's packed_panels_amx<4>), L2 prefetch 2 KB on
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx4(const Share& s) {
  const int64_t panel = 16 * K, steps = K / 32;
  for (const bf16* p = s.begin; p + 4 * panel <= s.end; p += 4 * panel) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t st = 0; st < steps; ++st) {
      const bf16* b = p + st * 512;
      for (int t = 0; t < 4; ++t) prefetch_tile(b + t * panel, 1, 2048);
      _tile_loadd(4, s.x + st * 32, K * 2);
      _tile_loadd(5, b, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, b + panel, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, b + 2 * panel, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, b + 3 * panel, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, s.out, 64);
    _tile_stored(1, s.out + 256, 64);
    _tile_stored(2, s.out + 512, 64);
    _tile_stored(3, s.out + 768, 64);
  }
  const int64_t whole = (s.end - s.begin) / (4 * panel) * 4 * panel;
  if (s.begin + whole < s.end) amx1(Share{s.begin + whole, s.end, s.x, s.out}, 1, 2048);
}

// each B tile through 16 vector loads into an L1 buffer (double-buffered), then the tile load
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx_staged(const Share& s) {
  alignas(64) bf16 buf[2][512];
  const int64_t panel = 16 * K, steps = K / 32;
  int which = 0;
  for (const bf16* p = s.begin; p + panel <= s.end; p += panel) {
    _tile_zero(0);
    for (int64_t st = 0; st < steps; ++st) {
      const bf16* b = p + st * 512;
      for (int l = 0; l < 16; ++l) {
        _mm512_store_si512(buf[which] + 32 * l, _mm512_load_si512(b + 32 * l));
      }
      _tile_loadd(4, s.x + st * 32, K * 2);
      _tile_loadd(5, buf[which], 64);
      _tile_dpbf16ps(0, 4, 5);
      which ^= 1;
    }
    _tile_stored(0, s.out, 64);
  }
}

// the tile unit alone: the same k-step count, B from one L1-resident tile
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx_l1(const Share& s) {
  alignas(64) static thread_local bf16 buf[512];
  const int64_t panel = 16 * K, steps = K / 32;
  for (const bf16* p = s.begin; p + panel <= s.end; p += panel) {
    _tile_zero(0);
    for (int64_t st = 0; st < steps; ++st) {
      _tile_loadd(4, s.x + st * 32, K * 2);
      _tile_loadd(5, buf, 64);
      _tile_dpbf16ps(0, 4, 5);
    }
    _tile_stored(0, s.out, 64);
  }
}

// amx4 as the extension calls it once a linear a thread: the tile configuration loaded first,
// and (release) the tiles released after
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx4_configured(const Share& s, int m,
                                                                          bool release) {
  amx_configure(m);
  amx4(s);
  if (release) _tile_release();
}

// A step's hand-off between linears (burst mode, 8 rows): every thread's share of the 8 input
// rows (8 x K bf16) was written by the other threads after the last burst, and after this one
// (a barrier apart, once all have read them) each thread writes its slice of the next rows.
// from: 0 the thread's own copy (the lab's default, with the same barrier and writes), 1 the
// shared rows as they lie (o and down), 2 the shared rows normalised by every thread into its
// own copy first (the fold of an RMS norm into qkv and gate/up).
bf16* g_shared = nullptr;  // 8 x K, written by all threads
float to_float(bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bf16 to_bf16_truncated(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<bf16>(u >> 16);
}
float rms_scale(const bf16* row) {
  float sum = 0.f;
  for (int64_t k = 0; k < K; ++k) sum += to_float(row[k]) * to_float(row[k]);
  return 1.f / std::sqrt(sum / static_cast<float>(K) + 1e-5f);
}
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx4_handoff(const Share& s, int from) {
  constexpr int kRows = 8;
  bf16* local = const_cast<bf16*>(s.x);
  if (from == 2) {
    for (int r = 0; r < kRows; ++r) {
      const bf16* row = g_shared + r * K;
      const float scale = rms_scale(row);
      for (int64_t k = 0; k < K; ++k) local[r * K + k] = to_bf16_truncated(to_float(row[k]) * scale);
    }
  }
  amx4(Share{s.begin, s.end, from == 1 ? g_shared : s.x, s.out});
#pragma omp barrier
  const int t = omp_get_thread_num(), n = omp_get_num_threads();
  const int64_t c0 = K * t / n, c1 = K * (t + 1) / n;
  for (int r = 0; r < kRows; ++r) {
    for (int64_t k = c0; k < c1; ++k) g_shared[r * K + k] = static_cast<bf16>(0x3c00 + ((k + r) & 0x3f));
  }
}

struct Kernel {
  std::string name;
  int rows;
  bool amx;
  std::function<void(const Share&)> run;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) K = std::atoll(argv[1]);
  const int64_t mb = argc > 2 ? std::atoll(argv[2]) : 1024;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0) {
    std::printf("no AMX permission\n");
    return 1;
  }
  const int threads = omp_get_max_threads();
  const int64_t panel = 16 * K;
  // each thread a whole number of 4-panel groups
  const int64_t groups = (mb << 20) / (2 * 4 * panel * threads);
  const int64_t per_thread = groups * 4 * panel;  // elements
  const int64_t total = per_thread * threads;
  bf16* w = static_cast<bf16*>(std::aligned_alloc(4096, total * 2));
  std::vector<bf16*> xs(threads);
  std::vector<float*> outs(threads);
#pragma omp parallel
  {  // first touch by the thread that reads the share
    const int t = omp_get_thread_num();
    for (int64_t i = 0; i < per_thread; ++i) {
      w[t * per_thread + i] = static_cast<bf16>(0x3c00 + ((i * 2654435761u) >> 24 & 0x7f));
    }
    xs[t] = static_cast<bf16*>(std::aligned_alloc(64, 16 * K * 2));
    for (int64_t i = 0; i < 16 * K; ++i) xs[t][i] = static_cast<bf16>(0x3c00 + (i & 0x3f));
    outs[t] = static_cast<float*>(std::aligned_alloc(64, 4096 * 4));
  }
  // burst mode (a third argument, panels a thread): the buffer read as a sequence of linears,
  // each the threads' shares of `burst` panels apiece with a barrier after it, as a decode
  // step's linears are (SmolLM2 at 16 threads: 2-4 panels a thread for qkv, o and down, 12 for
  // gate/up, ~200 for the LM head)
  const int64_t burst = argc > 3 ? std::atoll(argv[3]) : 0;
  g_shared = static_cast<bf16*>(std::aligned_alloc(64, 16 * K * 2));
  for (int64_t i = 0; i < 16 * K; ++i) g_shared[i] = static_cast<bf16>(0x3c00 + (i & 0x3f));
  std::vector<Kernel> ks;
  ks.push_back({"read", 0, false, [](const Share& s) { read_only(s); }});
  ks.push_back({"gemv", 1, false, [](const Share& s) { gemv<1>(s); }});
  ks.push_back({"gemv", 8, false, [](const Share& s) { gemv<8>(s); }});
  if (burst == 0) {
    ks.push_back({"bcast", 1, false, [](const Share& s) { bcast<1>(s); }});
    ks.push_back({"bcast", 8, false, [](const Share& s) { bcast<8>(s); }});
  }
  for (int m : {1, 8}) {
    if (burst == 0) ks.push_back({"amx pf-", m, true, [](const Share& s) { amx1(s, 0, 0); }});
    ks.push_back({"amx t1:2K", m, true, [](const Share& s) { amx1(s, 1, 2048); }});
    ks.push_back({"amx t1:8K", m, true, [](const Share& s) { amx1(s, 1, 8192); }});
    if (burst == 0) {
      ks.push_back({"amx t0:1K", m, true, [](const Share& s) { amx1(s, 2, 1024); }});
      ks.push_back({"amx t0:4K", m, true, [](const Share& s) { amx1(s, 2, 4096); }});
    } else {
      ks.push_back({"amx up16K t1:8K", m, true, [](const Share& s) { amx1(s, 1, 8192, 16384); }});
    }
    ks.push_back({"amx4 t1:2K", m, true, [](const Share& s) { amx4(s); }});
    if (burst > 0) {
      ks.push_back({"amx4 cfg", m, true, [m](const Share& s) { amx4_configured(s, m, false); }});
      ks.push_back({"amx4 cfg+rel", m, true, [m](const Share& s) { amx4_configured(s, m, true); }});
      if (m == 8) {
        ks.push_back({"amx4 x own", m, true, [](const Share& s) { amx4_handoff(s, 0); }});
        ks.push_back({"amx4 x shared", m, true, [](const Share& s) { amx4_handoff(s, 1); }});
        ks.push_back({"amx4 x normed", m, true, [](const Share& s) { amx4_handoff(s, 2); }});
      }
    }
    if (burst == 0) {
      ks.push_back({"amxst", m, true, [](const Share& s) { amx_staged(s); }});
      ks.push_back({"amxl1", m, true, [](const Share& s) { amx_l1(s); }});
    }
  }
  const int64_t share = burst > 0 ? burst * panel : per_thread;  // elements a thread a burst
  const int64_t bursts = per_thread / share;
  constexpr int kPasses = 9;
  std::vector<std::vector<double>> ms(ks.size());
  for (int pass = 0; pass < kPasses; ++pass) {
    for (size_t i = 0; i < ks.size(); ++i) {
      const Kernel& k = ks[i];
      double start = 0, stop = 0;
#pragma omp parallel
      {
        const int t = omp_get_thread_num();
        if (k.amx) amx_configure(k.rows);
#pragma omp barrier
#pragma omp master
        start = omp_get_wtime();
#pragma omp barrier
        for (int64_t b = 0; b < bursts; ++b) {
          const bf16* base = w + b * share * threads + t * share;
          k.run(Share{base, base + share, xs[t], outs[t]});
#pragma omp barrier
        }
#pragma omp master
        stop = omp_get_wtime();
        if (k.amx) _tile_release();
      }
      if (pass > 0) ms[i].push_back((stop - start) * 1e3);
    }
  }
  std::printf("threads %d, K %lld, %.0f MB of weights a pass, %d passes (median; best)", threads,
              static_cast<long long>(K), total * 2 / 1048576.0, kPasses - 1);
  if (burst > 0) {
    std::printf(", in %lld bursts of %lld panels (%lld KB) a thread: us a burst",
                static_cast<long long>(bursts), static_cast<long long>(burst),
                static_cast<long long>(share * 2 / 1024));
  }
  std::printf("\n");
  for (size_t i = 0; i < ks.size(); ++i) {
    std::vector<double> v = ms[i];
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2], best = v.front();
    std::printf("%-16s m=%d  %8.3f ms  %7.1f GB/s  (best %7.1f)", ks[i].name.c_str(), ks[i].rows,
                med, total * 2 / med / 1e6, total * 2 / best / 1e6);
    if (burst > 0) std::printf("  %7.2f us a burst", med * 1e3 / bursts);
    std::printf("\n");
  }
  std::printf("(sink %llu)\n", static_cast<unsigned long long>(sink_bits));
  return 0;
}
