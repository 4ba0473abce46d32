// linear_small on the CPU: out[M, N] = input[M, K] @ weight[N, K]^T (+ bias) for few rows (a
// decode step: M of 1 to a few dozen). Each weight row is streamed from memory once and used for
// every input row while it sits in registers, so the cost is the weight bytes; one parallel region
// splits the output columns among the threads.
#include "cpu/linear.h"

#include <vector>

#include "cpu/vec.h"
#include "ops.h"

// bf16 x bf16 dot products in one instruction (AVX512_BF16: Cooper Lake, Sapphire Rapids, Zen 4),
// picked at run time: twice the multiply-adds per instruction and no conversion of the weights,
// which is what keeps a step of 8 rows at the cost of 1 on few cores.
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define VLLM_BF16_DOT 1
#include <immintrin.h>
#endif

namespace vllm_cpu {
namespace {

constexpr int kTileN = 4;  // weight rows per tile: kTileN x kTileM accumulators in registers
constexpr int kTileM = 4;

// out rows m0..m0+MB, columns n0..n0+NB: dot products over K with fp32 accumulators.
template <typename T, int NB, int MB>
inline void tile(T* out, int64_t ldo, const float* x, const T* w, const T* bias, int64_t k_dim,
                 int64_t n0, int64_t m0) {
  fVec acc[NB][MB];
  for (int j = 0; j < NB; ++j) {
    for (int i = 0; i < MB; ++i) acc[j][i] = fVec(0.f);
  }
  const T* wrow[NB];
  for (int j = 0; j < NB; ++j) wrow[j] = w + (n0 + j) * k_dim;
  const float* xrow = x + m0 * k_dim;
  int64_t k = 0;
  for (; k + kVecSize <= k_dim; k += kVecSize) {
    fVec wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = load_float(wrow[j] + k);
    for (int i = 0; i < MB; ++i) {
      const fVec xv = fVec::loadu(xrow + i * k_dim + k);
      for (int j = 0; j < NB; ++j) acc[j][i] = at::vec::fmadd(wv[j], xv, acc[j][i]);
    }
  }
  if (k < k_dim) {
    const int w_tail = static_cast<int>(k_dim - k);
    fVec wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = load_float(wrow[j] + k, w_tail);
    for (int i = 0; i < MB; ++i) {
      const fVec xv = fVec::loadu(xrow + i * k_dim + k, w_tail);
      for (int j = 0; j < NB; ++j) acc[j][i] = at::vec::fmadd(wv[j], xv, acc[j][i]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float sum = at::vec::vec_reduce_all<float>(
          [](const fVec& a, const fVec& b) { return a + b; }, acc[j][i]);
      if (bias != nullptr) sum += static_cast<float>(bias[n0 + j]);
      out[(m0 + i) * ldo + n0 + j] = static_cast<T>(sum);
    }
  }
}

template <typename T, int NB>
inline void tile_rows(T* out, int64_t ldo, const float* x, const T* w, const T* bias,
                      int64_t m_dim, int64_t k_dim, int64_t n0) {
  int64_t m = 0;
  for (; m + kTileM <= m_dim; m += kTileM) tile<T, NB, kTileM>(out, ldo, x, w, bias, k_dim, n0, m);
  switch (m_dim - m) {
    case 3: tile<T, NB, 3>(out, ldo, x, w, bias, k_dim, n0, m); break;
    case 2: tile<T, NB, 2>(out, ldo, x, w, bias, k_dim, n0, m); break;
    case 1: tile<T, NB, 1>(out, ldo, x, w, bias, k_dim, n0, m); break;
    default: break;
  }
}

#ifdef VLLM_BF16_DOT
#define VLLM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// acc[j][i] += the 32 (masked) products of weight row j and input row i from column k on
template <int NB, int MB>
VLLM_BF16_TARGET inline void dot_step(__m512 (&acc)[NB][MB], const c10::BFloat16* x, int64_t ldx,
                                      const c10::BFloat16* w, int64_t k_dim, int64_t k,
                                      __mmask32 mask) {
  __m512bh wv[NB];
  for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j * k_dim + k);
  for (int i = 0; i < MB; ++i) {
    const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * ldx + k);
    for (int j = 0; j < NB; ++j) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], wv[j], xv);
  }
}

template <int NB, int MB>
VLLM_BF16_TARGET inline void tile_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                       int64_t ldx, const c10::BFloat16* w,
                                       const c10::BFloat16* bias, int64_t k_dim, int64_t n0,
                                       int64_t m0) {
  __m512 acc[NB][MB];
  for (int j = 0; j < NB; ++j) {
    for (int i = 0; i < MB; ++i) acc[j][i] = _mm512_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 32 <= k_dim; k += 32) {
    dot_step<NB, MB>(acc, x + m0 * ldx, ldx, w + n0 * k_dim, k_dim, k, ~__mmask32(0));
  }
  if (k < k_dim) {
    dot_step<NB, MB>(acc, x + m0 * ldx, ldx, w + n0 * k_dim, k_dim, k,
                     (__mmask32(1) << (k_dim - k)) - 1);
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float sum = _mm512_reduce_add_ps(acc[j][i]);
      if (bias != nullptr) sum += static_cast<float>(bias[n0 + j]);
      out[(m0 + i) * ldo + n0 + j] = static_cast<c10::BFloat16>(sum);
    }
  }
}

// rows of up to MB at a time; NB weight rows per tile (NB x MB accumulators)
template <int NB, int MB>
VLLM_BF16_TARGET void tile_rows_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x,
                                     int64_t ldx, const c10::BFloat16* w,
                                     const c10::BFloat16* bias, int64_t m_dim, int64_t k_dim,
                                     int64_t n0) {
  int64_t m = 0;
  for (; m + MB <= m_dim; m += MB) tile_bf16<NB, MB>(out, ldo, x, ldx, w, bias, k_dim, n0, m);
  switch (m_dim - m) {
#define VLLM_CASE(R) \
  case R: if constexpr (R < MB) tile_bf16<NB, R>(out, ldo, x, ldx, w, bias, k_dim, n0, m); break;
    VLLM_CASE(7) VLLM_CASE(6) VLLM_CASE(5) VLLM_CASE(4) VLLM_CASE(3) VLLM_CASE(2) VLLM_CASE(1)
#undef VLLM_CASE
    default: break;
  }
}

// Up to 4 rows: 4 weight rows x the rows per tile. More: 2 weight rows x 8 rows, which streams
// a step of 8 rows at about the cost of 1 (measured on AVX512_BF16).
void linear_bf16(c10::BFloat16* out, int64_t ldo, const c10::BFloat16* x, int64_t ldx,
                 const c10::BFloat16* w, const c10::BFloat16* bias, int64_t m_dim, int64_t n_dim,
                 int64_t k_dim) {
  const int64_t nb = m_dim > 4 ? 2 : 4;
  const int64_t num_tiles = (n_dim + nb - 1) / nb;
  const int64_t grain = std::max<int64_t>(1, (int64_t{32} << 10) / (nb * k_dim * 2));
  at::parallel_for(0, num_tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * nb;
      const int64_t rows = std::min<int64_t>(nb, n_dim - n0);
      if (nb == 2) {
        if (rows == 2) {
          tile_rows_bf16<2, 8>(out, ldo, x, ldx, w, bias, m_dim, k_dim, n0);
        } else {
          tile_rows_bf16<1, 8>(out, ldo, x, ldx, w, bias, m_dim, k_dim, n0);
        }
        continue;
      }
      switch (rows) {
        case 4: tile_rows_bf16<4, 4>(out, ldo, x, ldx, w, bias, m_dim, k_dim, n0); break;
        case 3: tile_rows_bf16<3, 4>(out, ldo, x, ldx, w, bias, m_dim, k_dim, n0); break;
        case 2: tile_rows_bf16<2, 4>(out, ldo, x, ldx, w, bias, m_dim, k_dim, n0); break;
        default: tile_rows_bf16<1, 4>(out, ldo, x, ldx, w, bias, m_dim, k_dim, n0); break;
      }
    }
  });
}

bool has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
#endif

}  // namespace

template <typename T>
void linear_small_impl(T* out, int64_t ldo, const T* input, int64_t ldi, const T* weight,
                       const T* bias, int64_t m_dim, int64_t n_dim, int64_t k_dim) {
  const int64_t num_tiles = (n_dim + kTileN - 1) / kTileN;
  // at least ~32 KB of weights per thread: below that a thread costs more than it streams
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{32} << 10) / (kTileN * k_dim * static_cast<int64_t>(sizeof(T))));
#ifdef VLLM_BF16_DOT
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (has_bf16_dot()) {
      linear_bf16(out, ldo, input, ldi, weight, bias, m_dim, n_dim, k_dim);
      return;
    }
  }
#endif
  // the input rows once in fp32 (a few KB), read from cache for every weight tile
  std::vector<float> x(m_dim * k_dim);
  for (int64_t m = 0; m < m_dim; ++m) {
    for (int64_t k = 0; k < k_dim; ++k) x[m * k_dim + k] = static_cast<float>(input[m * ldi + k]);
  }
  at::parallel_for(0, num_tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kTileN;
      switch (std::min<int64_t>(kTileN, n_dim - n0)) {
        case 4: tile_rows<T, 4>(out, ldo, x.data(), weight, bias, m_dim, k_dim, n0); break;
        case 3: tile_rows<T, 3>(out, ldo, x.data(), weight, bias, m_dim, k_dim, n0); break;
        case 2: tile_rows<T, 2>(out, ldo, x.data(), weight, bias, m_dim, k_dim, n0); break;
        default: tile_rows<T, 1>(out, ldo, x.data(), weight, bias, m_dim, k_dim, n0); break;
      }
    }
  });
}

template void linear_small_impl<float>(float*, int64_t, const float*, int64_t, const float*,
                                       const float*, int64_t, int64_t, int64_t);
template void linear_small_impl<c10::BFloat16>(c10::BFloat16*, int64_t, const c10::BFloat16*,
                                               int64_t, const c10::BFloat16*,
                                               const c10::BFloat16*, int64_t, int64_t, int64_t);

void check_linear_small_args(const at::Tensor& out, const at::Tensor& input,
                             const at::Tensor& weight, const at::Tensor* bias) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && out.dim() == 2,
              "linear_small takes 2-d input, weight and out");
  TORCH_CHECK(weight.is_contiguous() && input.stride(1) == 1 && out.stride(1) == 1,
              "linear_small needs a contiguous weight and unit-stride input/out rows");
  TORCH_CHECK(input.size(1) == weight.size(1), "input has ", input.size(1),
              " features, weight expects ", weight.size(1));
  TORCH_CHECK(out.size(0) == input.size(0) && out.size(1) == weight.size(0), "out has shape ",
              out.sizes(), ", expected [", input.size(0), ", ", weight.size(0), "]");
  TORCH_CHECK(input.scalar_type() == weight.scalar_type() && out.scalar_type() == weight.scalar_type(),
              "linear_small needs one dtype for input, weight and out");
  if (bias != nullptr) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->is_contiguous() &&
                    bias->scalar_type() == weight.scalar_type(),
                "bias must be a contiguous [", weight.size(0), "] tensor of the weight's dtype");
  }
}

void linear_small(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias) {
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  check_linear_small_args(out, input, weight, b);
  VLLM_CPU_DISPATCH_FLOAT_TYPES(weight.scalar_type(), "linear_small", [&] {
    linear_small_impl<scalar_t>(out.data_ptr<scalar_t>(), out.stride(0),
                                input.data_ptr<scalar_t>(), input.stride(0),
                                weight.data_ptr<scalar_t>(),
                                b != nullptr ? b->data_ptr<scalar_t>() : nullptr, input.size(0),
                                weight.size(0), weight.size(1));
  });
}

}  // namespace vllm_cpu
