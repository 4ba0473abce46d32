// The small-row linear of linear.cpp, for the other CPU kernels (decode_layers.cpp).
#pragma once

#include <torch/all.h>

#include <type_traits>

// bf16 x bf16 dot products in one instruction (AVX512_BF16: Cooper Lake, Sapphire Rapids, Zen 4),
// picked at run time (has_bf16_dot): twice the multiply-adds per instruction and no conversion of
// the weights.
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define VLLM_BF16_DOT 1
#define VLLM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#include <immintrin.h>
#endif

namespace vllm_cpu {

// Whether this CPU has AVX512_BF16 (and the build its kernels).
bool has_bf16_dot();

// The most input rows linear_rows gives this file's kernels (the register tiles, row-major or
// packed); above, torch's GEMM.
constexpr int64_t kSmallMaxRows = 64;

// f(std::integral_constant<int, rows>{}) for the 1 .. R rows a tile loop leaves over (R counts
// down to rows; nothing for 0), so that a tile kernel templated on its row count covers them
// (also the AMX kernel's 1 .. 4 panels of a pass).
template <int R, typename F>
inline void for_rows_left(int64_t rows, F&& f) {
  if constexpr (R > 0) {
    if (rows == R) {
      f(std::integral_constant<int, R>{});
    } else {
      for_rows_left<R - 1>(rows, f);
    }
  }
}

// out[m * ldo + n] = sum_k input[m * ldi + k] * weight[n * k_dim + k] (+ bias[n]), fp32 sums.
template <typename T>
void linear_small_impl(T* out, int64_t ldo, const T* input, int64_t ldi, const T* weight,
                       const T* bias, int64_t m_dim, int64_t n_dim, int64_t k_dim);

// What decode_layers folds into a packed linear's parallel loop, so that each thread does it for
// itself instead of the step handing over between cores once more (layer_folds.h): the norm
// that makes the linear's input rows, and silu_and_mul of its two output halves (gate, up).
class LinearFold {
 public:
  virtual ~LinearFold() = default;
  // The input rows the calling thread reads (row stride in *ld), made on its first call in a
  // loop; nullptr: the linear's own input. first: the thread's chunk holds the loop's first
  // task (what is written once, the residual, is written there).
  virtual const c10::BFloat16* input(bool first, int64_t* ld) const {
    (void)first;
    (void)ld;
    return nullptr;
  }
  // Whether out's columns are two halves (gate, up) that a task computes together.
  virtual bool paired() const { return false; }
  // Runs after a task wrote out's columns [n0, n1) (of both halves where paired), on its thread.
  virtual void output(int64_t n0, int64_t n1) const {
    (void)n0;
    (void)n1;
  }
  // Runs after a thread's tasks wrote out's columns [n0, n1) (its whole chunk of the loop, in
  // one contiguous range; of the first half where paired), on that thread.
  virtual void chunk_done(int64_t n0, int64_t n1) const {
    (void)n0;
    (void)n1;
  }
};

// out = input @ weight^T (+ bias) for [rows, in] tensors of contiguous rows: linear_small_impl
// where it pays, torch's GEMM elsewhere; with `packed` (pack_linear's copy of weight, non-empty)
// the packed tiles where those pay. What the linear_small op and decode_layers run. fold: only
// where linear_rows_folds says the packed tiles run (else an error).
void linear_rows(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                 const at::Tensor* bias, const at::Tensor* packed = nullptr,
                 const LinearFold* fold = nullptr);
// Whether linear_rows runs this extension's kernels (not torch's GEMM) for `rows` rows of
// `dtype`, with or without packed copies of the weights.
bool linear_rows_in_house(at::ScalarType dtype, int64_t rows, bool packed);
// Whether linear_rows runs the packed tiles (and so takes a fold) for `rows` rows of `dtype`
// with packed copies of the weights.
bool linear_rows_folds(at::ScalarType dtype, int64_t rows);

// The packed layout (linear_packed.cpp): [ceil(N / kPackRows), ceil(K / 2) * 2 * kPackRows], a
// 64-byte vector per column pair of kPackRows weight rows, zeros past N and K.
constexpr int64_t kPackRows = 16;
// Whether weights of `dtype` are packed on this CPU (bf16 with AVX512_BF16).
inline bool packed_weights_apply(at::ScalarType dtype) {
  return dtype == at::kBFloat16 && has_bf16_dot();
}
// How many of `panels` packed panels a parallel task takes: `most` (a power of two: as many as
// the kernel's accumulators hold) unless a smaller power of two leaves the busiest thread fewer
// panels, per * ceil(tasks / threads) (at::parallel_for gives a thread one contiguous share;
// ties keep the larger). SmolLM2's o and down projections, 36 panels, on 16 threads: 4 a task
// left 7 threads idle and the busy ones 4 panels each; 1 a task, 3.
inline int64_t panels_per_task(int64_t panels, int64_t most, int64_t threads) {
  const auto busiest = [&](int64_t per) {
    return per * (((panels + per - 1) / per + threads - 1) / threads);
  };
  int64_t per = most;
  for (int64_t q = most / 2; q >= 1; q /= 2) {
    if (busiest(q) < busiest(per)) per = q;
  }
  return per;
}
// Throws unless packed is empty (not packed) or pack_linear's copy of weight.
void check_packed(const at::Tensor& packed, const at::Tensor& weight);
// A packed linear's kernel (the AVX512_BF16 tiles below, linear_amx.cpp's AMX tiles): run
// writes out's columns of panels pb .. pb + nb (nb <= most) from input rows x, on the calling
// thread, between begin() and end() (once a chunk of tasks: the AMX tile configuration); the
// calling thread's next panels, if any, are pb + nb .. next_end (a kernel may prefetch them).
class PanelKernel {
 public:
  explicit PanelKernel(int64_t most) : most(most) {}
  virtual ~PanelKernel() = default;
  virtual void begin() const {}
  virtual void run(int64_t pb, int nb, const c10::BFloat16* x, int64_t ldx,
                   int64_t next_end) const = 0;
  virtual void end() const {}
  const int64_t most;
};
// A packed linear of n_dim outputs and k_dim inputs as one parallel loop over tasks of panels
// (panels_per_task; at least VLLM_CPU_PACKED_GRAIN_KB, default 8, of weights a thread), each
// thread's input rows from fold where given; with a paired fold, task i computes the same
// panels of both halves of out.
void run_panels(const PanelKernel& kernel, const c10::BFloat16* x, int64_t ldx, int64_t n_dim,
                int64_t k_dim, const LinearFold* fold);

// out [m, n] (row stride ldo) = x [m, k] (row stride ldx) @ W^T (+ bias) from W's packed copy;
// false where it did nothing (no AVX512_BF16).
bool linear_packed_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x, int64_t ldx,
                        const c10::BFloat16* packed, const c10::BFloat16* bias, int64_t m_dim,
                        int64_t n_dim, int64_t k_dim, const LinearFold* fold = nullptr);

// The same for bf16 on AMX tiles (linear_amx.cpp), where the CPU has them and the shape suits
// (VLLM_CPU_AMX: 8-16 rows by default; K a multiple of 32); false where it did nothing.
bool linear_amx_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* input, int64_t ldi,
                     const c10::BFloat16* weight, const c10::BFloat16* bias, int64_t m_dim,
                     int64_t n_dim, int64_t k_dim);
// The same from the weight's packed copy (its panels' k-steps are the tile multiply's B tiles as
// they lie: each thread streams whole panels in address order), to 64 rows (past 16, 2-4 row
// groups of A tiles against each panel, the panels read once).
bool linear_amx_packed_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                            int64_t ldx, const c10::BFloat16* packed, const c10::BFloat16* bias,
                            int64_t m_dim, int64_t n_dim, int64_t k_dim,
                            const LinearFold* fold = nullptr);

}  // namespace vllm_cpu
