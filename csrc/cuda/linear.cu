// linear_small on CUDA: out[M, N] = input[M, K] @ weight[N, K]^T (+ bias) for few rows (a decode
// step: M of 1 to 8 per launch; more rows take one launch per 8). Like cuBLAS's GEMV this costs
// the weight bytes, so both kernels are shaped to stream them at the HBM read rate: every weight
// byte is read once (16-byte loads that bypass L1, ld.global.nc.L1::no_allocate, so the stream
// does not evict the input, which every block re-reads through L1), a block reads 4 KB of each
// of its rows at a time, and each thread has 128-256 bytes of weights in flight (the latency x
// bandwidth product is ~30 KB per SM on an H200). Sums are fp32; the bias is added in fp32 and
// the result cast to T once, as torch's GEMM epilogue does.
//  - The FMA kernel (1-2 rows of bf16/fp16, fp32, and any misaligned case): a block owns 4
//    adjacent weight rows and all its threads sweep K together, each loading 2 chunks of 16
//    bytes of every row before using them; each weight chunk is used for all M input rows while
//    in registers (M x 4 accumulators, M a template argument). bf16 widens to fp32 by a shift.
//    Splitting K over the block (not a warp per row) keeps every SM busy for N as small as 4096
//    (1024 blocks). The block's sums are reduced by a halving warp exchange (31 shuffles for 32
//    values instead of 160), then over warps in shared memory. Measured on the H200 (bf16, 7B
//    shapes, weights past L2): 3.4-4.3 TB/s at M = 1 against cuBLAS's 2.5-4.0; the 7B step's
//    GEMMs (13.2 GB) 3.28 ms against 3.79 at M = 1, 3.36 against 3.77 at M = 2. But it spends
//    8 M FMAs per 16 weight bytes, and at M >= 3 the arithmetic no longer keeps up (M = 4:
//    4.01 ms, M = 8: 5.66, cuBLAS 3.8).
//  - The tensor-core kernels (3-8 rows of bf16/fp16, 16-byte aligned) make that arithmetic
//    free: the wave kernel (K a multiple of 256) reads its rows as the FMA kernel does and
//    takes 5-6% longer at 3-5 rows than the FMA kernel at one (H100); the k-step kernel (any K
//    of whole chunks) streams at cuBLAS's rate: see linear_small_wave_kernel and
//    linear_small_mma_kernel.
// A weight or input that is not 16-byte aligned, K not a multiple of the chunk, or an input row
// stride that is not takes the FMA kernel with one-element loads (correct, not fast).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/checks.h"
#include "cuda/dispatch.h"
#include "cuda/launch.cuh"
#include "ops.h"

namespace vllm_cuda {
namespace {

constexpr int kMaxM = 8;  // input rows per launch
// the FMA kernel's
constexpr int kRows = 4;    // weight rows (output features) per block
constexpr int kUnroll = 2;  // chunks per row each thread loads before using them
constexpr int kMaxThreads = 256;

struct Params {
  void* out;           // [M, N], row stride ldo
  const void* input;   // [M, K], row stride ldi
  const void* weight;  // [N, K], contiguous
  const void* bias;    // [N] or null
  int64_t ldo, ldi;
  int n, k;
  int prefetch;  // launched with PDL and 16-byte aligned rows: prefetch_rows before waiting
};

// The start of weight rows n0 .. n0 + rows (those below N) towards L2, at most
// kPrefetchBlockBytes a block (a thread a row), and then chain_in: under PDL (launch.cuh) the
// rows stream from HBM while the kernels before this one finish; the weights are never written
// by a kernel this one could overlap. The cap keeps what the resident blocks request (~5 of 256
// threads a SM on an H200: ~21 MB) within half the 50 MB L2, so no line is evicted before use.
constexpr int kPrefetchBlockBytes = 32 << 10;
template <typename T>
__device__ __forceinline__ void prefetch_rows_then_wait(const Params& p, int n0, int rows) {
  const int r = static_cast<int>(threadIdx.x);
  if (p.prefetch && r < rows && n0 + r < p.n) {
    const int64_t row_bytes = static_cast<int64_t>(p.k) * sizeof(T);
    const int64_t bytes = min(row_bytes, int64_t{kPrefetchBlockBytes / rows}) / 16 * 16;
    prefetch_l2(static_cast<const T*>(p.weight) + static_cast<int64_t>(n0 + r) * p.k,
                static_cast<uint32_t>(bytes));
  }
  chain_in();
}

// 16 bytes of weights, past L1 (read once, they would only evict the input).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// One element's bits, in the low bits of a word.
template <typename T>
__device__ __forceinline__ uint32_t load_bits(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(__ldg(reinterpret_cast<const float*>(p)));
  } else {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
}

// The W words of a chunk (kVector: 16 bytes, else one element) -> its E floats.
template <typename T, bool kVector>
__device__ __forceinline__ void widen(const uint32_t* words, float* f) {
  constexpr int W = kVector ? 4 : 1;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const uint32_t w = words[i];
    if constexpr (std::is_same_v<T, float>) {
      f[i] = __uint_as_float(w);
    } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
      f[kVector ? 2 * i : i] = __uint_as_float(w << 16);  // bf16 is fp32's top half
      if constexpr (kVector) f[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
    } else {
      if constexpr (kVector) {
        __half2 h;
        memcpy(&h, &w, sizeof(h));
        const float2 v = __half22float2(h);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
      } else {
        f[i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w)));
      }
    }
  }
}

template <typename T, bool kVector, bool kStream>
__device__ __forceinline__ void load_chunk(const T* p, uint32_t* words) {
  if constexpr (kVector) {
    const uint4 v = kStream ? load_stream16(p) : __ldg(reinterpret_cast<const uint4*>(p));
    words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
  } else {
    words[0] = load_bits(p);
  }
}

// out[row, n] = sum (+ bias[n]), the bias added in fp32 and the result cast to T once.
template <typename T>
__device__ __forceinline__ void store_out(const Params& p, int row, int n, float sum) {
  if (p.bias != nullptr) {
    float b;
    const uint32_t bits = load_bits(static_cast<const T*>(p.bias) + n);
    widen<T, false>(&bits, &b);
    sum += b;
  }
  static_cast<T*>(p.out)[row * p.ldo + n] = static_cast<T>(sum);
}

// One step of the halving exchange: of its WIDTH values a lane keeps the lower half (partner
// bit OFFSET clear) or the upper half, and adds the partner's copy of that half, which the
// partner sends in exchange for the other. After the steps of WIDTH = P, P/2, .., 2 (OFFSET = 16,
// 8, ..), a[0] of lane l is the sum over its group of P lanes of value l >> (5 - log2 P).
template <int WIDTH, int OFFSET>
__device__ __forceinline__ void halve(float* a, int lane) {
  const bool upper = lane & OFFSET;
#pragma unroll
  for (int i = 0; i < WIDTH / 2; ++i) {
    const float send = upper ? a[i] : a[i + WIDTH / 2];
    const float keep = upper ? a[i + WIDTH / 2] : a[i];
    a[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFFSET);
  }
  if constexpr (WIDTH > 2) halve<WIDTH / 2, OFFSET / 2>(a, lane);
}

constexpr int pow2_at_least(int v) { return v <= 1 ? 1 : 2 * pow2_at_least((v + 1) / 2); }

// The FMA kernel. grid: ceil(N / kRows) blocks; block b owns rows b * kRows .. + kRows of weight
// and out.
template <typename T, int M, bool kVector>
__global__ void __launch_bounds__(kMaxThreads) linear_small_kernel(const Params p) {
  constexpr int E = kVector ? 16 / sizeof(T) : 1;  // elements per chunk
  constexpr int W = kVector ? 4 : 1;               // 32-bit words per chunk
  constexpr int V = M * kRows;                     // sums per block
  constexpr int P = pow2_at_least(V);
  static_assert(V <= 32, "one value per lane after the exchange");
  const T* x = static_cast<const T*>(p.input);
  const int n0 = blockIdx.x * kRows;
  prefetch_rows_then_wait<T>(p, n0, kRows);
  const int chunks = p.k / E;  // per row
  // the last block's rows past N read row N - 1 again and write nothing
  const T* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    rows[r] = static_cast<const T*>(p.weight) + static_cast<int64_t>(min(n0 + r, p.n - 1)) * p.k;
  }

  float acc[M][kRows];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.f;
  }
  const int stride = blockDim.x;
  for (int c0 = threadIdx.x; c0 < chunks; c0 += kUnroll * stride) {
    // every load first (a tail chunk past the row re-reads the row's last, unused)...
    uint32_t w[kUnroll][kRows][W];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = min(c0 + u * stride, chunks - 1);
#pragma unroll
      for (int r = 0; r < kRows; ++r) load_chunk<T, kVector, true>(rows[r] + c * E, w[u][r]);
    }
    // ...then the products, each weight chunk against every input row
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * stride;
      if (c >= chunks) break;
      float wf[kRows][E];
#pragma unroll
      for (int r = 0; r < kRows; ++r) widen<T, kVector>(w[u][r], wf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        uint32_t xw[W];
        load_chunk<T, kVector, false>(x + m * p.ldi + c * E, xw);
        float xf[E];
        widen<T, kVector>(xw, xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int e = 0; e < E; ++e) acc[m][r] = fmaf(xf[e], wf[r][e], acc[m][r]);
        }
      }
    }
  }

  // the warp's sums (value i = m * kRows + r), then the block's
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float a[P];
#pragma unroll
  for (int i = 0; i < P; ++i) a[i] = i < V ? acc[i / kRows][i % kRows] : 0.f;
  if constexpr (P > 1) halve<P, 16>(a, lane);
  float v = a[0];
  constexpr int kSpan = 32 / P;  // lanes that hold each value's total
#pragma unroll
  for (int o = kSpan / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ float partial[kMaxThreads / 32][32];
  if (lane % kSpan == 0) partial[warp][lane / kSpan] = v;
  __syncthreads();
  const int t = threadIdx.x;
  if (t < V) {
    const int n = n0 + t % kRows;
    if (n < p.n) {
      float sum = 0.f;
      for (int i = 0; i < stride / 32; ++i) sum += partial[i][t];
      store_out<T>(p, t / kRows, n, sum);
    }
  }
}

// The tensor-core kernel: out^T [N, M] = weight [N, K] x input^T [K, M] as mma.m16n8k16 tiles,
// the weights the 16-row A operand and up to 8 input rows the 8 columns of B. Thread (g = lane /
// 4, t = lane % 4) of a warp loads, per k-step of 32, chunk 4 * step + t (8 elements, 16 bytes)
// of weight rows g and g + 8 and of input row g; a dot product does not care in which order its
// k are summed, so the chunk's elements 0..3 fill the thread's k slots of one mma and 4..7 those
// of a second, the same slots in A and B, and no shuffle or shared-memory staging is needed. The
// k-steps are dealt to the block's warps in turn, a step at a time, two accumulators per thread.
// Measured over a 7B step's weights on the H200 (the variants in benchmarks/lab/): the more
// warps share a block's 16 rows and the fewer steps each has in flight, the faster: 8 warps x 8
// steps 4.4-5.3 ms, 8 x 4 4.1-4.8, 16 x 2 3.8-4.2, 16 x 1 3.78-3.92 against cuBLAS's 3.75-3.86
// (M = 1..8). So this kernel matches cuBLAS at 3-8 rows but does not reach the FMA kernel's
// one-row rate. (The lab's k_tr, which reads 512 contiguous bytes of a row per warp load, as
// the FMA kernel does, and takes the fragments from shared memory, was 1-6% faster than cuBLAS
// there, 3.61-3.85 ms: the start of the wave kernel below.) On the H100 (run 26, a 7B step's
// weights) it is 2-4% faster than cuBLAS at 3 and 5 rows (5.02 / 5.08 ms against 5.15 / 5.27),
// and in a CUDA graph the step more so (cuBLAS splits K and adds reduce kernels). It now takes
// the 3-8-row launches whose K is not a multiple of 256; the wave kernel the others.
constexpr int kMmaRows = 16;    // weight rows per block (the mma's M dimension)
constexpr int kMmaWarps = 16;   // split K among them, reduced in shared memory
constexpr int kMmaMinRows = 3;  // fewer rows: the FMA kernel (measured faster at 1 and 2)

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// The tensor-core kernels' epilogue. A warp's accumulator fragment d (rows g and g + 8 of the
// block's 16, input rows 2t and 2t + 1) into its slice of partial [warps][16][8]...
__device__ __forceinline__ void put_fragment(float* partial, int warp, int g, int t,
                                             const float (&d)[4]) {
  float* pw = partial + warp * kMmaRows * 8;
  pw[g * 8 + 2 * t] = d[0];
  pw[g * 8 + 2 * t + 1] = d[1];
  pw[(g + 8) * 8 + 2 * t] = d[2];
  pw[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// ...and, after a __syncthreads, the sum over the WARPS slices of each (row, input row) stored
// by one thread of the block (16 x 8 of them).
template <typename T, int WARPS>
__device__ __forceinline__ void store_warp_sums(const Params& p, const float* partial, int n0,
                                                int m) {
  const int i = threadIdx.x, r = i % kMmaRows, row = i / kMmaRows, n = n0 + r;
  if (row < m && n < p.n) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < WARPS; ++j) sum += partial[(j * kMmaRows + r) * 8 + row];
    store_out<T>(p, row, n, sum);
  }
}

// grid: ceil(N / 16) blocks; block b owns rows 16 b .. 16 b + 16; m (1..8) input rows.
template <typename T>
__global__ void __launch_bounds__(kMmaWarps * 32) linear_small_mma_kernel(const Params p, int m) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * kMmaRows;
  prefetch_rows_then_wait<T>(p, n0, kMmaRows);
  const T* w = static_cast<const T*>(p.weight);
  const T* w_lo = w + static_cast<int64_t>(min(n0 + g, p.n - 1)) * p.k;
  const T* w_hi = w + static_cast<int64_t>(min(n0 + g + 8, p.n - 1)) * p.k;
  const T* x = static_cast<const T*>(p.input) + min(g, m - 1) * p.ldi;
  const int chunks = p.k / 8, steps = (chunks + 3) / 4;
  float d[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s = warp; s < steps; s += kMmaWarps) {
    const int c = s * 4 + t;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo, xv = lo;
    if (c < chunks) {  // a last step that ends past K: nothing from this thread's lanes
      lo = load_stream16(w_lo + c * 8);
      hi = load_stream16(w_hi + c * 8);
      if (g < m) xv = __ldg(reinterpret_cast<const uint4*>(x + c * 8));
    }
    mma_16816<T>(d, lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
    mma_16816<T>(e, lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] += e[i];
  // d: (row g, input rows 2t, 2t + 1) and (row g + 8, the same); then the sum over warps
  __shared__ float partial[kMmaWarps * kMmaRows * 8];
  put_fragment(partial, warp, g, t, d);
  __syncthreads();
  store_warp_sums<T, kMmaWarps>(p, partial, n0, m);
}

// The wave kernel: the k-step kernel's mma, the FMA kernel's reading order. A block owns 16
// weight rows and its kWaveWarps warps split K in segments of 256 (512 contiguous bytes of a
// row: lane l reads chunk l of each of the 16 rows in one instruction, as the FMA kernel reads),
// warp w taking segments w, w + kWaveWarps, ...; all 16 loads are issued before any is used.
// The segment goes through the warp's own shared rows (pitch 36 chunks: the fragment reads below
// hit 8 distinct bank groups) to where lane (g, t) takes rows g and g + 8, chunk 4 q + t: as in
// the k-step kernel, elements 0-3 fill one mma's k slots and 4-7 a second's, in A and B alike.
// The segment's 8 input chunks are loaded before its mma, which rotate over 4 accumulators (a
// chain of dependent mma is a tail of its own once the loads have landed). Measured in
// benchmarks/lab/gemv_lab.cu (k_wave2<8, 1>) over a 7B step's weights on the H100: 4.69-4.86 ms
// at 1-8 rows against the k-step kernel's 5.08-5.17, cuBLAS's 5.23-5.38 and the FMA kernel's
// 4.56 at one row; variants with more segments in flight, 4 or 16 warps, 32 rows a block or
// the weights as the B operand were slower (RESULTS.md, twentieth session). In the 7B step
// (run 28): the 5-token verification's GEMMs 4.95 -> 4.63 ms. Not yet measured on an H200.
constexpr int kWaveWarps = 8;
constexpr int kWaveSeg = 256;   // k per segment: 32 lanes x 8 elements
constexpr int kWavePitch = 36;  // 16-byte chunks per shared row (32 used)
constexpr size_t kWaveSmem =
    kWaveWarps * kMmaRows * kWavePitch * 16 + kWaveWarps * kMmaRows * 8 * sizeof(float);

template <typename T>
__global__ void __launch_bounds__(kWaveWarps * 32, 2) linear_small_wave_kernel(const Params p,
                                                                                int m) {
  extern __shared__ uint4 smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  uint4* rows_sm = smem + warp * kMmaRows * kWavePitch;
  float* partial = reinterpret_cast<float*>(smem + kWaveWarps * kMmaRows * kWavePitch);
  const int n0 = blockIdx.x * kMmaRows;
  prefetch_rows_then_wait<T>(p, n0, kMmaRows);
  const T* w = static_cast<const T*>(p.weight) + lane * 8;
  const T* x = static_cast<const T*>(p.input) + min(g, m - 1) * p.ldi + t * 8;
  const int segs = p.k / kWaveSeg;
  float d[4][4] = {};
  for (int seg = warp; seg < segs; seg += kWaveWarps) {
    uint4 v[kMmaRows];
#pragma unroll
    for (int r = 0; r < kMmaRows; ++r) {
      const int64_t row = min(n0 + r, p.n - 1);
      v[r] = load_stream16(w + row * p.k + seg * kWaveSeg);
    }
    uint4 xv[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      xv[q] = make_uint4(0, 0, 0, 0);
      if (g < m) xv[q] = __ldg(reinterpret_cast<const uint4*>(x + seg * kWaveSeg + q * 32));
    }
#pragma unroll
    for (int r = 0; r < kMmaRows; ++r) rows_sm[r * kWavePitch + lane] = v[r];
    __syncwarp();
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int c = 4 * q + t;
      const uint4 lo = rows_sm[g * kWavePitch + c], hi = rows_sm[(g + 8) * kWavePitch + c];
      mma_16816<T>(d[(2 * q) % 4], lo.x, hi.x, lo.y, hi.y, xv[q].x, xv[q].y);
      mma_16816<T>(d[(2 * q + 1) % 4], lo.z, hi.z, lo.w, hi.w, xv[q].z, xv[q].w);
    }
    __syncwarp();
  }
#pragma unroll
  for (int a = 1; a < 4; ++a) {
#pragma unroll
    for (int i = 0; i < 4; ++i) d[0][i] += d[a][i];
  }
  put_fragment(partial, warp, g, t, d[0]);
  __syncthreads();
  store_warp_sums<T, kWaveWarps>(p, partial, n0, m);
}

// The wave kernel's shared memory is past the default 48 KB: allowed once per device and type;
// false (the k-step kernel then) on a device whose blocks cannot have that much.
template <typename T>
bool allow_wave_smem() {
  static std::atomic<uint64_t> checked{0}, allowed{0};  // a bit per device (0-63)
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device % 64);
  if (checked.load(std::memory_order_acquire) & bit) {
    return allowed.load(std::memory_order_acquire) & bit;
  }
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const bool ok = static_cast<size_t>(optin) >= kWaveSmem;
  if (ok) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(linear_small_wave_kernel<T>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kWaveSmem)));
    allowed.fetch_or(bit, std::memory_order_acq_rel);
  }
  checked.fetch_or(bit, std::memory_order_acq_rel);
  return ok;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Launches the FMA kernel for M = rows (1..M).
template <typename T, int M>
void launch_rows(const Params& p, int rows, bool vec, int threads, cudaStream_t stream) {
  if constexpr (M > 1) {
    if (rows < M) return launch_rows<T, M - 1>(p, rows, vec, threads, stream);
  }
  const dim3 grid((p.n + kRows - 1) / kRows);
  auto kernel = vec ? linear_small_kernel<T, M, true> : linear_small_kernel<T, M, false>;
  launch_kernel(kernel, grid, dim3(threads), 0, stream, p);
}

template <typename T>
void launch(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight, const T* bias,
            cudaStream_t stream) {
  constexpr int E = 16 / sizeof(T);
  const int64_t m_dim = input.size(0), ldi = input.stride(0), ldo = out.stride(0);
  const int k = static_cast<int>(weight.size(1));
  const bool vec = k % E == 0 && (m_dim == 1 || ldi % E == 0) && aligned16(input.data_ptr()) &&
                   aligned16(weight.data_ptr());
  // enough threads for kUnroll chunks each across a row, a power of two from 32 to kMaxThreads
  const int per_thread = kUnroll * (vec ? E : 1);
  int threads = 32;
  while (threads < kMaxThreads && threads * per_thread < k) threads *= 2;
  Params p{nullptr, nullptr, weight.data_ptr(), bias, ldo, ldi,
           static_cast<int>(weight.size(0)), k, vec && pdl_enabled() ? 1 : 0};
  for (int64_t m0 = 0; m0 < m_dim; m0 += kMaxM) {
    p.out = out.data_ptr<T>() + m0 * ldo;
    p.input = input.data_ptr<T>() + m0 * ldi;
    const int rows = static_cast<int>(std::min<int64_t>(kMaxM, m_dim - m0));
    if constexpr (sizeof(T) == 2) {
      if (vec && rows >= kMmaMinRows) {
        const dim3 grid((p.n + kMmaRows - 1) / kMmaRows);
        if (k % kWaveSeg == 0 && allow_wave_smem<T>()) {
          launch_kernel(linear_small_wave_kernel<T>, grid, dim3(kWaveWarps * 32), kWaveSmem,
                        stream, p, rows);
        } else {
          launch_kernel(linear_small_mma_kernel<T>, grid, dim3(kMmaWarps * 32), 0, stream, p,
                        rows);
        }
        continue;
      }
    }
    launch_rows<T, kMaxM>(p, rows, vec, threads, stream);
  }
}

}  // namespace

void linear_small(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias) {
  const at::Tensor* b = bias.has_value() && bias->defined() ? &*bias : nullptr;
  vllm::check_linear_small_args(out, input, weight, b);
  TORCH_CHECK(weight.size(0) < (int64_t{1} << 31) && weight.size(1) < (int64_t{1} << 31),
              "linear_small: weight ", weight.sizes(), " is too large");
  if (out.numel() == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(device_of(input));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  VLLM_CUDA_DISPATCH_FLOAT_TYPES(weight.scalar_type(), "linear_small", [&] {
    launch<scalar_t>(out, input, weight, b != nullptr ? b->data_ptr<scalar_t>() : nullptr,
                     stream);
  });
}

}  // namespace vllm_cuda
