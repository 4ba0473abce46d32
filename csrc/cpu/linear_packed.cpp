// The bf16 linear of several input rows on weights repacked once (AVX512_BF16; the engine packs
// them at a model's first step of 2+ rows, vllm/model_executor/cpu_decode.py):
// out[M, N] = input[M, K] @ weight[N, K]^T (+ bias). The row-major register tiles (linear.cpp,
// tile_bf16) hold 16-lane partial sums of single outputs and reduce them horizontally at each
// tile's end, which at 16-20 rows held them to ~280 GFLOP/s on 2 Zen 4 cores against ~470 for the
// multiply-adds alone. Here the weights are stored as [ceil(N / 16)][ceil(K / 2)][16][2]: one
// 64-byte vector holds a column pair of 16 weight rows, so `vdpbf16ps` against an input's column
// pair broadcast to every lane leaves 16 finished outputs per accumulator: no horizontal sums,
// and each 16-row panel is one address-order stream. A tile is 2 panels (32 outputs) x 12 input
// rows, 24 accumulators. Measured first in benchmarks/lab/cpu_tile_lab.cpp: 1.3-1.45x the
// row-major tiles at 16-20 rows, 1.1-1.3x at 8, 0.73-1.11x at 4 (benchmarks/RESULTS.md).
// The packed copy sits beside the row-major weight (which the GEMV of fewer rows, the per-op
// path and a tied embedding read), so it costs that weight's bytes again in memory.
#include "cpu/linear.h"

#include <ATen/Parallel.h>

#include <cstring>

#include "core/checks.h"
#include "cpu/switches.h"
#include "cpu/team.h"
#include "ops.h"

namespace vllm_cpu {

at::Tensor pack_linear(const at::Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2,
              "pack_linear: weight must be a 2-D CPU tensor, got ", weight.sizes(), " on ",
              weight.device());
  const int64_t n_dim = weight.size(0), k_dim = weight.size(1);
  if (!packed_weights_apply(weight.scalar_type()) || n_dim == 0 || k_dim == 0) {
    return at::empty({0}, weight.options());
  }
  const at::Tensor w = weight.contiguous();
  const int64_t panels = (n_dim + kPackRows - 1) / kPackRows, pairs = (k_dim + 1) / 2;
  at::Tensor packed = at::empty({panels, pairs * 2 * kPackRows}, weight.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<c10::BFloat16>());
  parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      uint16_t* panel = dst + p * pairs * 2 * kPackRows;
      for (int64_t r = 0; r < kPackRows; ++r) {
        const int64_t n = p * kPackRows + r;
        for (int64_t k = 0; k < 2 * pairs; ++k) {
          panel[(k / 2) * 2 * kPackRows + r * 2 + k % 2] =
              n < n_dim && k < k_dim ? src[n * k_dim + k] : 0;
        }
      }
    }
  });
  return packed;
}

#ifdef VLLM_BF16_DOT
namespace {

constexpr int kPanels = 2;     // 16-row weight panels per tile (32 outputs)
constexpr int kTileRows = 12;  // input rows per tile: 2 x 12 accumulators
// The software prefetch's distance along a panel (its stream): 2 KB (the lab's; the next tile's
// panels are the adjacent addresses, which the hardware prefetcher follows).
constexpr int64_t kPrefetchElems = 1024;

// Panels pb .. pb + NB against input rows m0 .. m0 + MR: the column pair kp of each input row
// broadcast to every lane; out's columns past n_dim masked off. The first pass over the panels
// (m0 = 0) prefetches them into L2 ahead of the loads.
template <int NB, int MR>
VLLM_BF16_TARGET inline void packed_tile(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                         int64_t ldx, const c10::BFloat16* packed,
                                         const c10::BFloat16* bias, int64_t n_dim,
                                         int64_t k_dim, int64_t pb, int64_t m0) {
  static_assert(NB * MR <= 24, "NB x MR accumulators, NB weights and an input in 32 registers");
  __m512 acc[NB * MR];
  for (int a = 0; a < NB * MR; ++a) acc[a] = _mm512_setzero_ps();
  const int64_t pairs = (k_dim + 1) / 2, panel = pairs * 2 * kPackRows;
  const c10::BFloat16* pr = packed + pb * panel;
  const c10::BFloat16* xr = x + m0 * ldx;
  const bool prefetch = m0 == 0;
  const int64_t full = k_dim / 2;  // column pairs inside every input row
  for (int64_t kp = 0; kp < full; ++kp) {
    __m512bh wv[NB];
    for (int b = 0; b < NB; ++b) {
      const c10::BFloat16* wp = pr + b * panel + kp * 2 * kPackRows;
      if (prefetch) __builtin_prefetch(wp + kPrefetchElems, 0, 1);
      wv[b] = (__m512bh)_mm512_loadu_si512(wp);
    }
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, xr + i * ldx + 2 * kp, sizeof(pair));
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < NB; ++b) acc[i * NB + b] = _mm512_dpbf16_ps(acc[i * NB + b], wv[b], xv);
    }
  }
  if (full < pairs) {  // odd K: the last column against the packed zero beside it
    __m512bh wv[NB];
    for (int b = 0; b < NB; ++b) {
      wv[b] = (__m512bh)_mm512_loadu_si512(pr + b * panel + full * 2 * kPackRows);
    }
    for (int i = 0; i < MR; ++i) {
      uint16_t last;
      std::memcpy(&last, xr + i * ldx + k_dim - 1, sizeof(last));
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(last));
      for (int b = 0; b < NB; ++b) acc[i * NB + b] = _mm512_dpbf16_ps(acc[i * NB + b], wv[b], xv);
    }
  }
  for (int b = 0; b < NB; ++b) {
    const int64_t n = (pb + b) * kPackRows;
    const __mmask16 mask =
        n + kPackRows <= n_dim ? __mmask16(0xFFFF) : __mmask16((1u << (n_dim - n)) - 1);
    __m512 bv = _mm512_setzero_ps();
    if (bias != nullptr) {  // bf16 -> fp32: the 16 bits moved to the top of each lane
      bv = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + n)), 16));
    }
    for (int i = 0; i < MR; ++i) {
      const __m256bh o = _mm512_cvtneps_pbh(_mm512_add_ps(acc[i * NB + b], bv));
      _mm256_mask_storeu_epi16(out + (m0 + i) * ldo + n, mask, (__m256i)o);
    }
  }
}

// Panels pb .. pb + NB against all m_dim input rows, kTileRows at a time (the panels re-read
// from cache after the first pass).
template <int NB>
VLLM_BF16_TARGET void packed_panels(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                    int64_t ldx, const c10::BFloat16* packed,
                                    const c10::BFloat16* bias, int64_t m_dim, int64_t n_dim,
                                    int64_t k_dim, int64_t pb) {
  int64_t m = 0;
  for (; m + kTileRows <= m_dim; m += kTileRows) {
    packed_tile<NB, kTileRows>(out, ldo, x, ldx, packed, bias, n_dim, k_dim, pb, m);
  }
  for_rows_left<kTileRows - 1>(m_dim - m, [&](auto r) {
    packed_tile<NB, decltype(r)::value>(out, ldo, x, ldx, packed, bias, n_dim, k_dim, pb, m);
  });
}

// The tiles above as a PanelKernel: 2 panels a task (a tile), or 1.
class PackedTiles final : public PanelKernel {
 public:
  PackedTiles(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* packed,
              const c10::BFloat16* bias, int64_t m_dim, int64_t n_dim, int64_t k_dim)
      : PanelKernel(kPanels), out_(out), ldo_(ldo), packed_(packed), bias_(bias), m_(m_dim),
        n_(n_dim), k_(k_dim) {}
  void run(int64_t pb, int nb, const c10::BFloat16* x, int64_t ldx,
           int64_t next_end) const override {
    (void)next_end;  // the hardware prefetcher follows a panel into the next (kPrefetchElems)
    if (nb == kPanels) {
      packed_panels<kPanels>(out_, ldo_, x, ldx, packed_, bias_, m_, n_, k_, pb);
    } else {
      packed_panels<1>(out_, ldo_, x, ldx, packed_, bias_, m_, n_, k_, pb);
    }
  }

 private:
  c10::BFloat16* out_;
  int64_t ldo_;
  const c10::BFloat16 *packed_, *bias_;
  int64_t m_, n_, k_;
};

}  // namespace

bool linear_packed_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x, int64_t ldx,
                        const c10::BFloat16* packed, const c10::BFloat16* bias, int64_t m_dim,
                        int64_t n_dim, int64_t k_dim, const LinearFold* fold) {
  if (!has_bf16_dot()) return false;
  run_panels(PackedTiles(out, ldo, packed, bias, m_dim, n_dim, k_dim), x, ldx, n_dim, k_dim,
             fold);
  return true;
}
#else
bool linear_packed_bf16(c10::BFloat16*, int64_t, const c10::BFloat16*, int64_t,
                        const c10::BFloat16*, const c10::BFloat16*, int64_t, int64_t, int64_t,
                        const LinearFold*) {
  return false;
}
#endif

void run_panels(const PanelKernel& kernel, const c10::BFloat16* x, int64_t ldx, int64_t n_dim,
                int64_t k_dim, const LinearFold* fold) {
  const int64_t panels = (n_dim + kPackRows - 1) / kPackRows;
  const bool paired = fold != nullptr && fold->paired();
  TORCH_CHECK(!paired || n_dim % (2 * kPackRows) == 0, "a paired fold takes whole panels in ",
              "each half of the output, got ", n_dim, " columns");
  const int64_t span = paired ? panels / 2 : panels;  // the panels tasks are cut from
  const int64_t per = panels_per_task(span, kernel.most, at::get_num_threads());
  const int64_t tasks = (span + per - 1) / per;
  // contiguous blocks of tasks per thread, at least VLLM_CPU_PACKED_GRAIN_KB of weights each
  // (default 8). At 32 (the GEMV's grain) draft-20m's batch-8 qkv ran on 12 of 16 threads and
  // its o on 4; at 8 both on all 16: its batch-8 forward 0.98-0.99x the time on an H100
  // machine's 16-core host, in turns (AMX tiles; run 76), 0.97-0.98x with l1 prefetches and
  // kept tiles (run 77). Not measured on the AVX512_BF16 tiles of a host without AMX.
  const int64_t task_bytes = k_dim * 2 * kPackRows * per * (paired ? 2 : 1);
  const int64_t grain_bytes =
      setting_number("VLLM_CPU_PACKED_GRAIN_KB", 8, 1, 4096, "a number of KB from 1 to 4096")
      << 10;
  const int64_t grain = std::max<int64_t>(1, grain_bytes / task_bytes);
  parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    int64_t ld = ldx;
    const c10::BFloat16* rows = fold != nullptr ? fold->input(begin == 0, &ld) : nullptr;
    if (rows == nullptr) {
      rows = x;
      ld = ldx;
    }
    const int64_t next_end = std::min(end * per, span);  // this thread's panels' end
    kernel.begin();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pb = t * per;
      const int nb = static_cast<int>(std::min(per, span - pb));
      kernel.run(pb, nb, rows, ld, next_end);
      if (paired) kernel.run(span + pb, nb, rows, ld, span + next_end);
      if (fold != nullptr) {
        fold->output(pb * kPackRows, std::min((pb + nb) * kPackRows, paired ? n_dim / 2 : n_dim));
      }
    }
    kernel.end();
    trace(kTrTiles);
    if (fold != nullptr) {
      fold->chunk_done(begin * per * kPackRows,
                       std::min(next_end * kPackRows, paired ? n_dim / 2 : n_dim));
    }
  });
}

void linear_packed(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                   const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  vllm::check_linear_small_args(out, input, weight, b);
  check_packed(packed, weight);
  linear_rows(out, input, weight, b, packed.numel() > 0 ? &packed : nullptr);
}

void check_packed(const at::Tensor& packed, const at::Tensor& weight) {
  if (packed.numel() == 0) return;  // not packed: the row-major weight alone
  const int64_t n_dim = weight.size(0), k_dim = weight.size(1);
  const int64_t panels = (n_dim + kPackRows - 1) / kPackRows, pairs = (k_dim + 1) / 2;
  TORCH_CHECK(packed.dim() == 2 && packed.size(0) == panels &&
                  packed.size(1) == pairs * 2 * kPackRows && packed.is_contiguous() &&
                  packed.scalar_type() == weight.scalar_type() && packed.device().is_cpu(),
              "packed weight must be pack_linear's [", panels, ", ", pairs * 2 * kPackRows,
              "] copy of the ", weight.sizes(), " ", weight.scalar_type(), " weight, got ",
              packed.sizes(), " ", packed.scalar_type());
}

}  // namespace vllm_cpu
