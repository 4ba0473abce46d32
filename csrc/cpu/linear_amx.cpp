// linear_small's bf16 path on AMX tiles (Sapphire Rapids and later): out[M, N] = x[M, K] @
// w[N, K]^T for a few input rows. The AVX512_BF16 GEMV's cost grows with the rows (its dot
// products outlast the weight bytes from 4 rows on: 2.3-3.7x the one-row time at 8 rows on the
// H200's host), where a tile multiply of 16 x 32 by 32 x 16 should cost about what loading its
// 1 KB of weights does, so that a batch of up to 16 rows still costs the weight bytes (on the
// H200's host: 1.06-1.22x its one-row time at 8 rows, where the GEMV took 1.7-2.5x; measured
// there first in the fifteenth session, hence on by default from 8 rows since). Its byte layout
// was checked against an emulation of the tile instructions' documented semantics.
//
// Tile roles: the weights are the A operand, 16 rows of w per tile read straight from w (row
// stride K), so nothing is repacked at load or per call; the input rows are the B operand, their
// transpose in the pair-interleaved layout the tile multiply wants, packed once per call (B[r][2m
// + j] = x[m][32 s + 2 r + j] for k-step s: each 32-bit pair of x row m lands in column m). The
// accumulator C[i][m] = sum_k w[n0 + i][k] x[m][k] = out[m][n0 + i], fp32 sums as the GEMV's.
#include "cpu/linear.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__)
#define VLLM_AMX 1
#include <ATen/Parallel.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/switches.h"
#include "cpu/team.h"
#endif

namespace vllm_cpu {

#ifdef VLLM_AMX
namespace {

constexpr int64_t kTileRows = 16;  // weight rows per A tile, input rows (at most) per B tile
constexpr int64_t kTileK = 32;     // bf16 columns per k-step (a 64-byte tile row)
constexpr int64_t kMaxRows = 16;
// Input rows (at most) a pass over the packed copies: two A tiles of 16 rows
// (packed_panels_amx2), so that a step of 17-32 rows (a batch of 4 verifying 4 drafts each: 20)
// reads each weight once on tiles too, where the packed AVX512 tiles took 4-6x as long (2-core
// AMX Xeon: Qwen2.5-1.5B's 20-row forward 354 -> 152 ms, its 16-row one 128-134 ms); 33-64 rows
// take 3-4 row groups against a panel at a time (packed_panel_groups_amx). (That kernel with 2
// groups for 17-32 rows too, one panel a pass, measured 1.2x slower at 20 and 32 rows: its A
// tiles are loaded again for every panel.)
constexpr int64_t kMaxPackedRows = 2 * kMaxRows;

#define VLLM_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))

// The 64-byte tile configuration (palette 1): tiles 0-1 accumulators (16 x 16 fp32), 2-3 weight
// tiles (16 rows x 32 bf16), 4 the packed input (16 pairs of rows x 16 columns of pairs).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx & (1u << 22)) != 0 && (edx & (1u << 24)) != 0;  // AMX-BF16, AMX-TILE
}

// The CPU has AMX-BF16 and Linux let this process use the tile registers (they are off until a
// process asks: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
bool amx_usable() {
  static const bool usable = [] {
    if (!cpu_has_amx_bf16()) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

// VLLM_CPU_AMX (read at every call): 0 never, auto (default) from 8 rows, all from 1 (to 16 on
// the row-major weight, 64 on the packed copies).
// On the H200's host (Xeon, 16 threads; benchmarks/lab/cpu_gemm_lab.py, every matrix of a draft
// step, paired against linear_small's GEMV and register tiles): 0.61-0.89x their time at 8 rows
// and 0.40-0.63x at 16 for draft-20m, llama-68m and SmolLM2-135M, but 0.93-1.23x at 4 rows and
// 1.2-1.4x at 1-2.
constexpr int64_t kAutoMinRows = 8;
int64_t amx_min_rows() {
  const char* v = setting_value("VLLM_CPU_AMX");
  if (v == nullptr || std::string(v) == "auto") return kAutoMinRows;
  if (std::string(v) == "0") return kSmallMaxRows + 1;
  TORCH_CHECK(std::string(v) == "all", "VLLM_CPU_AMX must be 0, auto or all, got '", v, "'");
  return 1;
}

// VLLM_CPU_AMX_PREFETCH (read at every call): the packed AMX tiles' weight streams prefetched
// ahead (packed_panels_amx) into L1 (l1, the default), into L2 (1), or left to the hardware
// prefetchers (0), which restart 3 of a pass's 4 streams at every pass. 1 against 0:
// SmolLM2-135M's batch-8 draft forward 0.2-3.4% faster on a 2-core AMX Xeon, 5.3-5.6% on the
// H200's and an H100's 16-core hosts (twenty-fifth session). l1 against 1, on an H100 machine's
// 16-core host, in turns: draft-20m's batch-8 forward 0.96-0.97x the time (runs 75-76; a tile
// load whose lines wait in L2 costs more than its multiply), batch 1 unchanged (it runs no AMX).
enum AmxPrefetch : int { kNoPrefetch = 0, kPrefetchL2 = 1, kPrefetchL1 = 2 };
int amx_prefetch() {
  const char* v = setting_value("VLLM_CPU_AMX_PREFETCH");
  if (v == nullptr || std::string(v) == "l1") return kPrefetchL1;
  if (std::string(v) == "1") return kPrefetchL2;
  TORCH_CHECK(std::string(v) == "0", "VLLM_CPU_AMX_PREFETCH must be 0, 1 or l1, got '", v, "'");
  return kNoPrefetch;
}

// VLLM_CPU_AMX_KEEP_TILES (read at every call): 1 leaves a packed AMX linear's thread with its
// tiles configured after its loop (no tilerelease), and its next loop skips ldtilecfg where the
// thread's configuration (read back with sttilecfg) is already the one it wants; 0 (default)
// configures at each loop's start and releases at its end (the INIT state). On H100 machines'
// 16-core hosts, in turns: with 1, draft-20m's batch-8 forward took 0.98-0.99x the time on one
// host (run 75), but on another (300 MB of L3) releasing took batch 8 0.90-1.01x the kept
// tiles' time for all three draft shapes (run 81), SmolLM2's and llama-68m's most.
bool amx_keep_tiles() { return switched_on("VLLM_CPU_AMX_KEEP_TILES", false); }

// Tiles 0 .. 7 of rows[t] rows of 64 bytes each (0: unused). keep: not where the thread's tiles
// are configured so already.
VLLM_AMX_TARGET void load_tile_config(const uint8_t (&rows)[8], bool keep = false) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = rows[t];
    cfg.colsb[t] = rows[t] > 0 ? 64 : 0;
  }
  if (keep) {
    TileConfig now;  // the INIT state (released tiles) reads back as zeros
    asm volatile("sttilecfg %0" : "=m"(now));
    if (std::memcmp(&now, &cfg, sizeof(cfg)) == 0) return;
  }
  // ldtilecfg by hand, reading cfg as a memory operand: GCC 12's _tile_loadconfig does not tell
  // the compiler that it reads the struct, so the stores of its rows and column widths were
  // dropped as dead and the tiles left unconfigured (the first tile instruction then raised
  // SIGILL on an AMX host)
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}

// x [m_dim, k_dim] (row stride ldx) into B tiles, one 1 KB tile per k-step: 32-bit word j of x
// row m (its columns 2j, 2j + 1) at packed[(j / 16) * 256 + (j % 16) * 16 + m]; rows m_dim..15
// zero.
void pack_input(std::vector<uint32_t>& packed, const c10::BFloat16* x, int64_t ldx,
                int64_t m_dim, int64_t k_dim) {
  const int64_t words = k_dim / 2;
  packed.assign(static_cast<size_t>(words * kTileRows), 0u);
  for (int64_t m = 0; m < m_dim; ++m) {
    const char* row = reinterpret_cast<const char*>(x + m * ldx);
    for (int64_t j = 0; j < words; ++j) {
      uint32_t word;
      std::memcpy(&word, row + 4 * j, 4);
      packed[(j / 16) * 256 + (j % 16) * 16 + m] = word;
    }
  }
}

// Weight rows n0 .. n0 + 16 NB against every packed input row: C tile t holds rows n0 + 16 t.
// The next NB blocks (the rows after these, one contiguous stretch of w) are prefetched into L2
// over the k-steps, in address order, where they are this thread's (next_end).
template <int NB>
VLLM_AMX_TARGET void tile_blocks(float* c, const c10::BFloat16* w, const uint32_t* packed,
                                 int64_t k_dim, int64_t n0, int64_t next_end) {
  _tile_zero(0);
  if constexpr (NB == 2) _tile_zero(1);
  const int64_t ld = k_dim * 2;  // bytes per weight row
  const char* a0 = reinterpret_cast<const char*>(w + n0 * k_dim);
  const char* a1 = a0 + kTileRows * ld;
  const char* next = a0 + NB * kTileRows * ld;
  const int64_t next_rows =
      std::max<int64_t>(0, std::min<int64_t>(NB * kTileRows, next_end - n0 - NB * kTileRows));
  const int64_t steps = k_dim / kTileK;
  // each k-step prefetches next_rows * 64 bytes of the next stretch (its size / steps)
  const int64_t lines_per_step = next_rows;
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, packed + s * 256, 64);
    _tile_loadd(2, a0 + s * 64, ld);
    _tile_dpbf16ps(0, 2, 4);
    if constexpr (NB == 2) {
      _tile_loadd(3, a1 + s * 64, ld);
      _tile_dpbf16ps(1, 3, 4);
    }
    const char* p = next + s * lines_per_step * 64;
    for (int64_t l = 0; l < lines_per_step; ++l) _mm_prefetch(p + l * 64, _MM_HINT_T1);
  }
  _tile_stored(0, c, 64);
  if constexpr (NB == 2) _tile_stored(1, c + 256, 64);
}

// out[m][n0 + i] = c[i * 16 + m] (+ bias), for NB blocks of c.
void write_blocks(c10::BFloat16* out, int64_t ldo, const float* c, const c10::BFloat16* bias,
                  int64_t m_dim, int64_t n0, int nb) {
  for (int64_t i = 0; i < nb * kTileRows; ++i) {
    const float b = bias != nullptr ? static_cast<float>(bias[n0 + i]) : 0.f;
    const float* ci = c + (i / kTileRows) * 256 + (i % kTileRows) * 16;
    for (int64_t m = 0; m < m_dim; ++m) {
      out[m * ldo + n0 + i] = static_cast<c10::BFloat16>(ci[m] + b);
    }
  }
}

VLLM_AMX_TARGET void release_tiles() { _tile_release(); }

}  // namespace

bool linear_amx_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x, int64_t ldx,
                     const c10::BFloat16* w, const c10::BFloat16* bias, int64_t m_dim,
                     int64_t n_dim, int64_t k_dim) {
  if (m_dim > kMaxRows || m_dim < amx_min_rows() || k_dim % kTileK != 0 ||
      n_dim < kTileRows || !amx_usable()) {
    return false;
  }
  std::vector<uint32_t> packed;
  pack_input(packed, x, ldx, m_dim, k_dim);
  const int64_t num_blocks = n_dim / kTileRows;
  // at least ~32 KB of weights per thread, as the GEMV
  const int64_t grain = std::max<int64_t>(1, (int64_t{32} << 10) / (k_dim * 2 * kTileRows));
  parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
    load_tile_config({16, 16, 16, 16, 16, 0, 0, 0});
    alignas(64) float c[2 * 256];
    const int64_t end_row = end * kTileRows;
    int64_t b = begin;
    for (; b + 2 <= end; b += 2) {
      tile_blocks<2>(c, w, packed.data(), k_dim, b * kTileRows, end_row);
      write_blocks(out, ldo, c, bias, m_dim, b * kTileRows, 2);
    }
    if (b < end) {
      tile_blocks<1>(c, w, packed.data(), k_dim, b * kTileRows, end_row);
      write_blocks(out, ldo, c, bias, m_dim, b * kTileRows, 1);
    }
    release_tiles();
  });
  const int64_t done = num_blocks * kTileRows;
  if (done < n_dim) {  // the last rows (fewer than a tile): the GEMV
    linear_small_impl<c10::BFloat16>(out + done, ldo, x, ldx, w + done * k_dim,
                                     bias != nullptr ? bias + done : nullptr, m_dim,
                                     n_dim - done, k_dim);
  }
  return true;
}

namespace {

constexpr int kPackedPanels = 4;  // accumulator tiles: 4 panels of 16 outputs per pass

// How far ahead of a k-step its weight streams are prefetched (prefetch_streams).
constexpr int64_t kPrefetchSteps = 2;

// At k-step s of a pass over the NB panels from pb (NB streams side by side): the 1 KB of each
// stream kPrefetchSteps k-steps on, into L2; over the pass's last k-steps that is the calling
// thread's next pass (panels pb + NB .. below next_end), whose streams the hardware prefetchers
// would otherwise find again from their first misses.
template <int NB>
inline void prefetch_streams(const c10::BFloat16* packed, int64_t panel, int64_t steps,
                             int64_t pb, int64_t next_end, int64_t s, bool l1) {
  const int64_t ahead = s + kPrefetchSteps;
  const int64_t q0 = ahead < steps ? pb : pb + NB;  // the streams' panels at that k-step
  const int64_t sa = ahead < steps ? ahead : ahead - steps;
  const int64_t q_end = ahead < steps ? pb + NB : next_end;
  for (int t = 0; t < NB; ++t) {
    if (q0 + t >= q_end) break;
    const char* line =
        reinterpret_cast<const char*>(packed + (q0 + t) * panel + sa * kTileK * kPackRows);
    if (l1) {
      for (int l = 0; l < 16; ++l) _mm_prefetch(line + 64 * l, _MM_HINT_T0);
    } else {
      for (int l = 0; l < 16; ++l) _mm_prefetch(line + 64 * l, _MM_HINT_T1);
    }
  }
}

// VLLM_CPU_AMX_INPUT_AHEAD (read at every call; default 4; 0: off): the input rows' line of
// k-step s + N prefetched into L1 at k-step s (the first N at a pass's start). The A tile's 8-16
// rows are lines other cores wrote in the loop before: 8 rows of 1024 columns written by 16
// other cores cost a thread 3.5 us a panel against 1.3 from its own cache (H100 machine's host,
// benchmarks/lab/cpu_amx_loop_lab.cpp, run 81), as if each k-step waited out its misses before
// the next k-step's loads began. With 4, draft-20m's batch-8 forward took 0.95-0.98x the time
// without in three rounds (run 83); copying the rows first or two A tiles by turns did not pay.
int64_t amx_input_ahead() {
  return setting_number("VLLM_CPU_AMX_INPUT_AHEAD", 4, 0, 64, "a number of k-steps from 0 to 64");
}

// The input rows' 64 bytes of k-step s, rows 0 .. rows - 1, requested into L1.
inline void prefetch_input(const c10::BFloat16* x, int64_t ldx, int64_t rows, int64_t s) {
  for (int64_t m = 0; m < rows; ++m) {
    _mm_prefetch(reinterpret_cast<const char*>(x + m * ldx + s * kTileK), _MM_HINT_T0);
  }
}

// The packed copy's panels pb .. pb + NB against the m_dim input rows: the input rows are the A
// operand (m_dim rows x 32 columns per k-step, read in place), the packed panel's k-step the B
// operand (its 16 column pairs x 16 weight rows are the 1 KB at panel + 512 s: the tile layout
// itself). C tile t = out[m][16 (pb + t) + n], m_dim rows x 16 fp32, stored to c + 256 t.
// prefetch (VLLM_CPU_AMX_PREFETCH: an AmxPrefetch): each k-step prefetch_streams; input_ahead
// (VLLM_CPU_AMX_INPUT_AHEAD): prefetch_input.
template <int NB>
VLLM_AMX_TARGET void packed_panels_amx(float* c, const c10::BFloat16* x, int64_t ldx,
                                       int64_t rows, const c10::BFloat16* packed,
                                       int64_t pairs, int64_t steps, int64_t pb, int prefetch,
                                       int64_t next_end, int64_t input_ahead) {
  static_assert(NB >= 1 && NB <= kPackedPanels, "4 accumulator tiles");
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
  const c10::BFloat16* b0 = packed + pb * pairs * 2 * kPackRows;
  const int64_t panel = pairs * 2 * kPackRows;  // elements per panel
  if (input_ahead > 0) {
    for (int64_t s = 0; s < std::min(input_ahead, steps); ++s) prefetch_input(x, ldx, rows, s);
  }
  for (int64_t s = 0; s < steps; ++s) {
    if (prefetch != kNoPrefetch) {
      prefetch_streams<NB>(packed, panel, steps, pb, next_end, s, prefetch == kPrefetchL1);
    }
    if (input_ahead > 0 && s + input_ahead < steps) prefetch_input(x, ldx, rows, s + input_ahead);
    _tile_loadd(4, x + s * kTileK, ldx * 2);
    const c10::BFloat16* b = b0 + s * kTileK * kPackRows;
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
  _tile_stored(0, c, 64);
  if constexpr (NB > 1) _tile_stored(1, c + 256, 64);
  if constexpr (NB > 2) _tile_stored(2, c + 512, 64);
  if constexpr (NB > 3) _tile_stored(3, c + 768, 64);
}

// packed_panels_amx for 17-32 input rows in one pass over the panels: rows 0-15 and 16.. are
// two A tiles (4, 5), panels pb and pb + 1 (NB of them) two B tiles (6, 7), each loaded once a
// k-step for both row groups. C tile NB g + t (rows of group g, panel t) is stored to
// c + 256 (NB g + t) (tiles 0, 1 rows 0-15; 2, 3 the rest: the caller's tile configuration).
template <int NB>
VLLM_AMX_TARGET void packed_panels_amx2(float* c, const c10::BFloat16* x, int64_t ldx,
                                        const c10::BFloat16* packed, int64_t pairs,
                                        int64_t steps, int64_t pb, int prefetch,
                                        int64_t next_end) {
  static_assert(NB == 1 || NB == 2, "2 row groups x 2 panels of accumulator tiles");
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (NB > 1) {
    _tile_zero(1);
    _tile_zero(3);
  }
  const c10::BFloat16* b0 = packed + pb * pairs * 2 * kPackRows;
  const c10::BFloat16* x1 = x + kTileRows * ldx;
  const int64_t panel = pairs * 2 * kPackRows;  // elements per panel
  for (int64_t s = 0; s < steps; ++s) {
    if (prefetch != kNoPrefetch) {
      prefetch_streams<NB>(packed, panel, steps, pb, next_end, s, prefetch == kPrefetchL1);
    }
    _tile_loadd(4, x + s * kTileK, ldx * 2);
    _tile_loadd(5, x1 + s * kTileK, ldx * 2);
    const c10::BFloat16* b = b0 + s * kTileK * kPackRows;
    _tile_loadd(6, b, 64);
    if constexpr (NB > 1) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(7, b + panel, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
    }
  }
  if constexpr (NB > 1) {
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
  } else {
    _tile_stored(0, c, 64);
    _tile_stored(2, c + 256, 64);
  }
}

// packed_panels_amx for 33-64 input rows in one pass over the panels: G groups of 16 rows (the
// last one m_last) against one panel at a time, its k-step loaded once as the B tile (5) for
// all the groups, each group's rows the A tile (4; the last group's 6, configured to its rows).
// C tile g (rows of group g) is stored to c + 256 g.
template <int G>
VLLM_AMX_TARGET void packed_panel_groups_amx(float* c, const c10::BFloat16* x, int64_t ldx,
                                             const c10::BFloat16* packed, int64_t pairs,
                                             int64_t steps, int64_t pb) {
  static_assert(G == 3 || G == 4, "33-64 rows");
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  if constexpr (G == 4) _tile_zero(3);
  const c10::BFloat16* b0 = packed + pb * pairs * 2 * kPackRows;
  const int64_t group = kTileRows * ldx;  // elements between two groups' first rows
  for (int64_t s = 0; s < steps; ++s) {
    const c10::BFloat16* xs = x + s * kTileK;
    _tile_loadd(5, b0 + s * kTileK * kPackRows, 64);
    _tile_loadd(4, xs, ldx * 2);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(4, xs + group, ldx * 2);
    _tile_dpbf16ps(1, 4, 5);
    if constexpr (G == 3) {
      _tile_loadd(6, xs + 2 * group, ldx * 2);
      _tile_dpbf16ps(2, 6, 5);
    } else {
      _tile_loadd(4, xs + 2 * group, ldx * 2);
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(6, xs + 3 * group, ldx * 2);
      _tile_dpbf16ps(3, 6, 5);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  if constexpr (G == 4) _tile_stored(3, c + 768, 64);
}

// out[m][16 (pb + t) + n] = c[256 t + 16 m + n] (+ bias), for the columns below n_dim: a row
// of a panel a vector (its 16 sums, rounded to bf16 as the packed AVX512_BF16 tiles round theirs),
// not a scalar conversion apiece (2-core AMX Xeon, SmolLM2's four linears at 8 rows, weights in
// cache: 10.3 / 7.1 / 38.1 / 14.2 -> 9.5-9.7 / 6.6-6.8 / 35.5-36.5 / 13.5-14.0 us).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void write_panels(
    c10::BFloat16* out, int64_t ldo, const float* c, const c10::BFloat16* bias, int64_t m_dim,
    int64_t n_dim, int64_t pb, int nb) {
  for (int t = 0; t < nb; ++t) {
    const int64_t n0 = (pb + t) * kPackRows;
    const int64_t width = std::min<int64_t>(kPackRows, n_dim - n0);
    const __mmask16 mask = width == kPackRows ? __mmask16(0xFFFF) : __mmask16((1u << width) - 1);
    __m512 bv = _mm512_setzero_ps();
    if (bias != nullptr) {  // bf16 -> fp32: the 16 bits moved to the top of each lane
      bv = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + n0)), 16));
    }
    for (int64_t m = 0; m < m_dim; ++m) {
      const __m512 v = _mm512_add_ps(_mm512_loadu_ps(c + 256 * t + 16 * m), bv);
      _mm256_mask_storeu_epi16(out + m * ldo + n0, mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

// The packed copy on AMX tiles as a PanelKernel, for m_dim input rows: to 16, 4 panels a task
// (an accumulator tile each, packed_panels_amx); 17-32, two row groups against 2 panels
// (packed_panels_amx2); 33-64 (a batch of 8 verifying 4 drafts each: 40), 3-4 row groups
// against a panel at a time (packed_panel_groups_amx), each panel read once.
class AmxPanels final : public PanelKernel {
 public:
  AmxPanels(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* packed,
            const c10::BFloat16* bias, int64_t m_dim, int64_t n_dim, int64_t k_dim)
      : PanelKernel(m_dim <= kMaxRows ? kPackedPanels : m_dim <= kMaxPackedRows ? 2 : 1),
        out_(out), ldo_(ldo), packed_(packed), bias_(bias), m_(m_dim), n_(n_dim),
        pairs_(k_dim / 2), steps_(k_dim / kTileK),
        groups_(static_cast<int>((m_dim + kTileRows - 1) / kTileRows)),
        prefetch_(amx_prefetch()), keep_tiles_(amx_keep_tiles()),
        input_ahead_(amx_input_ahead()) {}

  void begin() const override {
    if (m_ <= kMaxRows) {
      const auto m = static_cast<uint8_t>(m_);
      load_tile_config({m, m, m, m, m, 16, 16, 16}, keep_tiles_);
    } else if (m_ <= kMaxPackedRows) {
      const auto m1 = static_cast<uint8_t>(m_ - kMaxRows);
      load_tile_config({16, 16, m1, m1, 16, m1, 16, 16}, keep_tiles_);
    } else {
      const auto last = static_cast<uint8_t>(m_ - (groups_ - 1) * kTileRows);
      if (groups_ == 3) {
        load_tile_config({16, 16, last, 0, 16, 16, last, 0}, keep_tiles_);
      } else {
        load_tile_config({16, 16, 16, last, 16, 16, last, 0}, keep_tiles_);
      }
    }
  }

  void run(int64_t pb, int nb, const c10::BFloat16* x, int64_t ldx,
           int64_t next_end) const override {
    alignas(64) float c[4 * 256];
    if (m_ <= kMaxRows) {
      for_rows_left<kPackedPanels>(nb, [&](auto panels_now) {
        packed_panels_amx<decltype(panels_now)::value>(c, x, ldx, m_, packed_, pairs_, steps_,
                                                       pb, prefetch_, next_end, input_ahead_);
      });
      write_panels(out_, ldo_, c, bias_, m_, n_, pb, nb);
    } else if (m_ <= kMaxPackedRows) {
      if (nb == 2) {
        packed_panels_amx2<2>(c, x, ldx, packed_, pairs_, steps_, pb, prefetch_, next_end);
      } else {
        packed_panels_amx2<1>(c, x, ldx, packed_, pairs_, steps_, pb, prefetch_, next_end);
      }
      write_panels(out_, ldo_, c, bias_, kMaxRows, n_, pb, nb);
      write_panels(out_ + kMaxRows * ldo_, ldo_, c + 256 * nb, bias_, m_ - kMaxRows, n_, pb, nb);
    } else {
      const int64_t last = m_ - (groups_ - 1) * kTileRows;
      if (groups_ == 3) {
        packed_panel_groups_amx<3>(c, x, ldx, packed_, pairs_, steps_, pb);
      } else {
        packed_panel_groups_amx<4>(c, x, ldx, packed_, pairs_, steps_, pb);
      }
      for (int g = 0; g < groups_; ++g) {
        write_panels(out_ + g * kTileRows * ldo_, ldo_, c + 256 * g, bias_,
                     g + 1 < groups_ ? kTileRows : last, n_, pb, 1);
      }
    }
  }

  void end() const override {
    if (!keep_tiles_) release_tiles();
  }

 private:
  c10::BFloat16* out_;
  int64_t ldo_;
  const c10::BFloat16 *packed_, *bias_;
  int64_t m_, n_, pairs_, steps_;
  int groups_;
  int prefetch_;
  bool keep_tiles_;
  int64_t input_ahead_;
};

}  // namespace

bool linear_amx_packed_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                            int64_t ldx, const c10::BFloat16* packed, const c10::BFloat16* bias,
                            int64_t m_dim, int64_t n_dim, int64_t k_dim,
                            const LinearFold* fold) {
  if (m_dim > kSmallMaxRows || m_dim < amx_min_rows() || k_dim % kTileK != 0 ||
      !amx_usable()) {
    return false;
  }
  run_panels(AmxPanels(out, ldo, packed, bias, m_dim, n_dim, k_dim), x, ldx, n_dim, k_dim, fold);
  return true;
}

#else

bool linear_amx_packed_bf16(c10::BFloat16*, int64_t, const c10::BFloat16*, int64_t,
                            const c10::BFloat16*, const c10::BFloat16*, int64_t, int64_t,
                            int64_t, const LinearFold*) {
  return false;
}

bool linear_amx_bf16(c10::BFloat16*, int64_t, const c10::BFloat16*, int64_t,
                     const c10::BFloat16*, const c10::BFloat16*, int64_t, int64_t, int64_t) {
  return false;
}

#endif

}  // namespace vllm_cpu
