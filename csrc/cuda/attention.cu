// paged_attention on CUDA: split-K flash attention over paged K/V blocks; the partitions are
// merged through distributed shared memory inside a thread-block cluster (sm_90+), by the last
// block of each to finish, or by a combine pass.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "core/checks.h"
#include "cuda/dispatch.h"
#include "cuda/launch.cuh"
#include "ops.h"

namespace vllm_cuda {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kTileKeys = 64;  // keys per K/V tile in shared memory
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxClusterParts = 8;  // blocks of a cluster, the portable most

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Rows per block: a prefill's (many rows share each K/V tile; fits sm_80's 163 KB), or
// kFewRows for decode and short verifications (one to a few rows per sequence and kv head: the
// smaller query and score buffers and fewer accumulators let more blocks share an SM, and an SM
// with more blocks has more K/V bytes in flight).
template <typename T, int HS>
constexpr int kManyRows = sizeof(T) * HS >= 1024 ? 16 : 32;
constexpr int kFewRows = 8;

// Sizes and shared-memory layout for one (dtype, head size, rows per block). A block owns up to
// kRows query rows (token, head of the kv head's GQA group) and walks its partition in tiles
// of kTileKeys.
template <typename T, int HS, int ROWS>
struct Cfg {
  static constexpr int kVec = 16 / sizeof(T), kChunks = HS / kVec;  // 16-byte chunks per row
  static constexpr int kRows = ROWS;
  // K/V rows padded by 16 bytes: 4 mod 8 words, so 8 rows' chunks fall in distinct banks
  static constexpr int kKvStride = HS + kVec, kSStride = kTileKeys + 4;
  static constexpr int kScoreGroups = kThreads / kTileKeys, kScoreRows = kRows / kScoreGroups;
  static constexpr int kPvGroups = kThreads / kChunks;
  static constexpr int kPvRows = (kRows + kPvGroups - 1) / kPvGroups;
  // bytes: int64 key offsets [2][kTileKeys]; K, V tiles T [kTileKeys][kKvStride]; queries (then
  // the output sum) float [kRows][HS]; scores float [kRows][kSStride]; m, l, alpha float [kRows]
  // and visible-key counts int [kRows]
  static constexpr size_t kK = 2 * kTileKeys * sizeof(int64_t);
  static constexpr size_t kV = kK + kTileKeys * kKvStride * sizeof(T);
  static constexpr size_t kQ = kV + kTileKeys * kKvStride * sizeof(T);
  static constexpr size_t kS = kQ + kRows * HS * sizeof(float);
  static constexpr size_t kStats = kS + kRows * kSStride * sizeof(float);
  static constexpr size_t kBytes = kStats + 4 * kRows * sizeof(float);
  static_assert(HS % kVec == 0 && HS % 4 == 0 && kChunks <= kThreads, "unsupported head size");
  static_assert(kRows % kScoreGroups == 0, "rows must split evenly over the score groups");
};

struct Params {
  void* out;                   // [num_tokens, num_heads, HS]
  const void* query;           // [num_tokens, num_heads, HS], tokens q_stride elements apart
  const void* key_cache;       // [num_blocks, num_kv_heads, block_size, HS]
  const void* value_cache;     // same
  const int* block_tables;     // [num_seqs, max_blocks]
  const int* context_lens;     // [num_seqs]
  const int* query_start_loc;  // [num_seqs + 1]
  float* ws_o;   // [num_tokens, num_heads, num_parts, HS] partial outputs; null: one partition
  float* ws_ml;  // [num_tokens, num_heads, num_parts, 2] partial (max, sum), log2 units
  int num_seqs, num_tokens, num_heads, num_kv_heads, group, block_size, max_blocks;
  int num_parts, part_size;
  float scale_log2;  // scale * log2(e): scores live in log2 units for exp2f
  int parts_by_context;  // partitions sized per sequence on the device (part_keys)
  int combine;  // VLLM_CUDA_ATTN_COMBINE (Combine), read on the host
  // [items * num_kv_heads] arrival counts, zero between launches: with them the last block of
  // each (row tile, kv head) to finish merges the partitions itself; null: the combine kernel
  int* counters;
  int64_t q_stride;
};

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row `row` of a tile of kv head kv_head (row = i * group + g) is token q_start + i, head
// kv_head * group + g: row_token_head gives the two (where the row's query is read, tokens
// q_stride apart), row_head the (token, head) index (where its output is written).
__device__ __forceinline__ int2 row_token_head(const Params& p, int q_start, int row,
                                               int kv_head) {
  return make_int2(q_start + row / p.group, kv_head * p.group + row % p.group);
}
__device__ __forceinline__ int64_t row_head(const Params& p, int q_start, int row, int kv_head) {
  const int2 th = row_token_head(p, q_start, row, kv_head);
  return static_cast<int64_t>(th.x) * p.num_heads + th.y;
}

// out[0 .. 3] = v, cast to T in one 4-element store.
template <typename T>
__device__ __forceinline__ void store4(T* out, float4 v) {
  *reinterpret_cast<Pack<T, 4>*>(out) = Pack<T, 4>{
      {static_cast<T>(v.x), static_cast<T>(v.y), static_cast<T>(v.z), static_cast<T>(v.w)}};
}

// Keys visible to query token i of a sequence: causal among its q_len new tokens, clamped to
// the keys the block table and the grid's partitions reach (both kernels must agree on it).
__device__ __forceinline__ int reach_keys(const Params& p, int ctx) {
  return min(ctx, min(p.max_blocks * p.block_size, p.num_parts * p.part_size));
}
__device__ __forceinline__ int visible_keys(const Params& p, int ctx, int q_len, int i) {
  return min(ctx - q_len + i + 1, reach_keys(p, ctx));
}

// Keys per partition for a sequence of ctx keys: the launch's part_size (sized on the host for
// max_context_len), or with parts_by_context the fewest whole tiles that spread the keys the
// sequence reaches over the grid's partitions: a CUDA graph captured for the longest context
// then splits a short one over as many blocks as a long one, each walking fewer tiles. Both
// kernels must agree on it; num_parts * part_keys covers the keys visible_keys reaches.
__device__ __forceinline__ int part_keys(const Params& p, int ctx) {
  if (!p.parts_by_context) return p.part_size;
  const int per = (reach_keys(p, ctx) + p.num_parts - 1) / p.num_parts;
  return max(kTileKeys, min(p.part_size, (per + kTileKeys - 1) / kTileKeys * kTileKeys));
}

// 16-byte global -> shared copy that bypasses registers; zero-fills when !valid.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Which (sequence, row tile) item x is, by a warp-wide prefix sum of each sequence's
// ceil(q_len * group / rows_per_tile) tiles; {-1, 0} past the last. Call from one whole warp.
__device__ int2 find_item(const Params& p, int x, int rows_per_tile) {
  const int lane = threadIdx.x % 32;
  for (int s0 = 0, base = 0; s0 < p.num_seqs; s0 += 32) {
    const int s = s0 + lane;
    const int q = s < p.num_seqs ? p.query_start_loc[s + 1] - p.query_start_loc[s] : 0;
    const int n = (max(q, 0) * p.group + rows_per_tile - 1) / rows_per_tile;
    int incl = n;
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, x - base >= incl - n && x - base < incl);
    if (hit) {
      const int src = __ffs(hit) - 1;
      return make_int2(s0 + src, x - base - __shfl_sync(0xffffffffu, incl - n, src));
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  return make_int2(-1, 0);
}

// Merges the partitions that row idx (token * num_heads + head) sees, vis keys in partitions of
// part_size, into out (a warp's work): out = sum_p l_p 2^(m_p - M) o_p / sum_p l_p 2^(m_p - M).
// The partials are read from L2 (__ldcg): other blocks wrote them.
template <typename T, int HS>
__device__ void combine_row(const Params& p, int64_t idx, int vis, int part_size, int lane) {
  const int parts = vis <= 0 ? 0 : (vis + part_size - 1) / part_size;
  const float2* ml = reinterpret_cast<const float2*>(p.ws_ml) + idx * p.num_parts;
  float m = -INFINITY, w = 0.f;
  for (int i = lane; i < parts; i += 32) m = fmaxf(m, __ldcg(ml + i).x);
  m = warp_max(m);
  for (int i = lane; i < parts; i += 32) {
    const float2 v = __ldcg(ml + i);
    w += v.y * exp2f(v.x - m);
  }
  w = warp_sum(w);
  constexpr int kPer = (HS + 31) / 32;
  float acc[kPer] = {};
  for (int i = 0; i < parts; ++i) {
    const float2 v = __ldcg(ml + i);
    const float wi = v.y * exp2f(v.x - m) / w;
    const float* o = p.ws_o + (idx * p.num_parts + i) * HS;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (lane + 32 * k < HS) acc[k] += wi * __ldcg(o + lane + 32 * k);
    }
  }
  T* out = static_cast<T*>(p.out) + idx * HS;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    if (lane + 32 * k < HS) out[lane + 32 * k] = static_cast<T>(acc[k]);
  }
}

// One block's partition of keys for rows row0 .. of sequence seq (paged_attention_kernel).
// kInSmem (the cluster kernel): the block's unnormalized output sums stay in shared memory (at
// the queries' place) with each row's (m, l), l = 0 for a row that saw no key of the partition,
// for cluster_merge; otherwise they are written to out (one partition) or the workspace.
template <typename T, int HS, int ROWS, bool kInSmem>
__device__ __forceinline__ void attend(const Params& p, int seq, int row0) {
  using C = Cfg<T, HS, ROWS>;
  using P = Pack<T, C::kVec>;
  constexpr int R = C::kRows;
  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* offs = reinterpret_cast<int64_t*>(smem);
  T* k_s = reinterpret_cast<T*>(smem + C::kK);
  T* v_s = reinterpret_cast<T*>(smem + C::kV);
  float* q_s = reinterpret_cast<float*>(smem + C::kQ);
  float* s_s = reinterpret_cast<float*>(smem + C::kS);
  float* m_s = reinterpret_cast<float*>(smem + C::kStats);
  float* l_s = m_s + R;
  float* alpha_s = l_s + R;
  int* vis_s = reinterpret_cast<int*>(alpha_s + R);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int part = blockIdx.y, kv_head = blockIdx.z;
  const int q_start = p.query_start_loc[seq], q_len = p.query_start_loc[seq + 1] - q_start;
  const int ctx = p.context_lens[seq];
  const int rows = min(R, q_len * p.group - row0);
  const int part_size = part_keys(p, ctx);
  const int key_begin = part * part_size;
  const int key_end = min(key_begin + part_size,
                          visible_keys(p, ctx, q_len, (row0 + rows - 1) / p.group));
  if (key_begin >= key_end) {  // no row of the block sees a key of this partition
    if constexpr (kInSmem) {
      for (int r = tid; r < R; r += kThreads) l_s[r] = 0.f;
    }
    return;
  }
  const int num_tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  const int* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks;
  const T* key_cache = static_cast<const T*>(p.key_cache);
  const T* value_cache = static_cast<const T*>(p.value_cache);

  // Queries in fp32, pre-scaled into log2 units; running stats; visible keys per row.
  for (int idx = tid; idx < rows * C::kChunks; idx += kThreads) {
    const int r = idx / C::kChunks, c = idx % C::kChunks, row = row0 + r;
    const int2 th = row_token_head(p, q_start, row, kv_head);
    const P v = reinterpret_cast<const P*>(static_cast<const T*>(p.query) + th.x * p.q_stride +
                                           static_cast<int64_t>(th.y) * HS)[c];
#pragma unroll
    for (int e = 0; e < C::kVec; ++e) q_s[r * HS + c * C::kVec + e] = static_cast<float>(v.v[e]) * p.scale_log2;
  }
  for (int r = tid; r < R; r += kThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
    vis_s[r] = r < rows ? visible_keys(p, ctx, q_len, (row0 + r) / p.group) : 0;
  }
  // Element offsets of tile t's cache rows (-1 past key_end), double-buffered by tile parity.
  auto fill_offsets = [&](int t) {
    const int pos = key_begin + t * kTileKeys + tid;
    if (tid < kTileKeys) {
      offs[(t & 1) * kTileKeys + tid] =
          pos >= key_end ? -1
                         : ((static_cast<int64_t>(table[pos / p.block_size]) * p.num_kv_heads +
                             kv_head) * p.block_size + pos % p.block_size) * HS;
    }
  };
  auto load_tile = [&](T* dst, const T* cache, int t) {  // one cp.async group per call
    for (int idx = tid; idx < kTileKeys * C::kChunks; idx += kThreads) {
      const int j = idx / C::kChunks, c = idx % C::kChunks;
      const int64_t off = offs[(t & 1) * kTileKeys + j];
      cp_async16(dst + j * C::kKvStride + c * C::kVec, cache + max(off, int64_t{0}) + c * C::kVec, off >= 0);
    }
    cp_async_commit();
  };
  fill_offsets(0);
  __syncthreads();
  load_tile(k_s, key_cache, 0);
  load_tile(v_s, value_cache, 0);

  // QK^T: thread -> key sj of the tile, rows sg + kScoreGroups * k.
  const int sj = tid % kTileKeys, sg = tid / kTileKeys;
  // PV: thread -> 16-byte column chunk pc; its group pg is a row slot and, when rows are fewer
  // than groups (decode), also a key slot, so that every thread has work either way.
  const int pc = tid % C::kChunks, pg = tid / C::kChunks;
  const int row_slots = min(rows, C::kPvGroups), key_slots = C::kPvGroups / row_slots;
  const int prow = pg % row_slots, pkey = pg / row_slots;
  const bool pv_active = pg < row_slots * key_slots;
  float acc[C::kPvRows][C::kVec] = {};

  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<1>();  // K tile t has landed (V tile t may not have)
    __syncthreads();
    float dot[C::kScoreRows] = {};
#pragma unroll (C::kChunks <= 8 ? C::kChunks : 2)
    for (int c = 0; c < C::kChunks; ++c) {
      const P kv = reinterpret_cast<const P*>(k_s + sj * C::kKvStride)[c];
      float kf[C::kVec];
#pragma unroll
      for (int e = 0; e < C::kVec; ++e) kf[e] = static_cast<float>(kv.v[e]);
#pragma unroll
      for (int k = 0; k < C::kScoreRows; ++k) {
        const int r = sg + C::kScoreGroups * k;
        if (r >= rows) break;
#pragma unroll
        for (int e = 0; e < C::kVec; e += 4) {
          const float4 q = *reinterpret_cast<const float4*>(q_s + r * HS + c * C::kVec + e);
          dot[k] += q.x * kf[e] + q.y * kf[e + 1] + q.z * kf[e + 2] + q.w * kf[e + 3];
        }
      }
    }
    const int pos = key_begin + t * kTileKeys + sj;
#pragma unroll
    for (int k = 0; k < C::kScoreRows; ++k) {
      const int r = sg + C::kScoreGroups * k;
      if (r >= rows) break;
      s_s[r * C::kSStride + sj] = pos < min(vis_s[r], key_end) ? dot[k] : -INFINITY;
    }
    if (t + 1 < num_tiles) fill_offsets(t + 1);
    __syncthreads();  // scores complete; the K buffer is free
    if (t + 1 < num_tiles) load_tile(k_s, key_cache, t + 1);

    // Online softmax, a warp per row: scores become probabilities exp2(s - m_new).
    for (int r = warp; r < rows; r += kWarps) {
      float* srow = s_s + r * C::kSStride;
      float v[kTileKeys / 32], mx = -INFINITY, sum = 0.f;
#pragma unroll
      for (int i = 0; i < kTileKeys / 32; ++i) mx = fmaxf(mx, v[i] = srow[lane + 32 * i]);
      const float m_old = m_s[r], m_new = fmaxf(m_old, warp_max(mx));
#pragma unroll
      for (int i = 0; i < kTileKeys / 32; ++i) {
        v[i] = m_new == -INFINITY ? 0.f : exp2f(v[i] - m_new);  // nothing seen yet: no NaN
        sum += v[i];
        srow[lane + 32 * i] = v[i];
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = m_new == -INFINITY ? 1.f : exp2f(m_old - m_new);
        alpha_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
      }
    }
    if (t + 1 < num_tiles) cp_async_wait<1>();  // V tile t has landed (K tile t + 1 may not)
    else cp_async_wait<0>();
    __syncthreads();

    // acc = acc * alpha + P V over this thread's rows and key quads.
    if (pv_active) {
#pragma unroll
      for (int k = 0; k < C::kPvRows; ++k) {
        const int r = prow + row_slots * k;
        if (r >= rows) break;
#pragma unroll
        for (int e = 0; e < C::kVec; ++e) acc[k][e] *= alpha_s[r];
      }
      for (int q = pkey; q < kTileKeys / 4; q += key_slots) {
        float vf[4][C::kVec];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const P vv = reinterpret_cast<const P*>(v_s + (4 * q + jj) * C::kKvStride)[pc];
#pragma unroll
          for (int e = 0; e < C::kVec; ++e) vf[jj][e] = static_cast<float>(vv.v[e]);
        }
#pragma unroll
        for (int k = 0; k < C::kPvRows; ++k) {
          const int r = prow + row_slots * k;
          if (r >= rows) break;
          const float4 pr = *reinterpret_cast<const float4*>(s_s + r * C::kSStride + 4 * q);
#pragma unroll
          for (int e = 0; e < C::kVec; ++e) {
            acc[k][e] += pr.x * vf[0][e] + pr.y * vf[1][e] + pr.z * vf[2][e] + pr.w * vf[3][e];
          }
        }
      }
    }
    __syncthreads();  // the V buffer and the probabilities are free
    if (t + 1 < num_tiles) load_tile(v_s, value_cache, t + 1);
  }

  // Sum the key slots' partial outputs in shared memory (q_s is no longer needed).
  float* o_s = q_s;
  for (int i = tid; i < rows * HS; i += kThreads) o_s[i] = 0.f;
  __syncthreads();
  if (pv_active) {
#pragma unroll
    for (int k = 0; k < C::kPvRows; ++k) {
      const int r = prow + row_slots * k;
      if (r >= rows) break;
#pragma unroll
      for (int e = 0; e < C::kVec; ++e) atomicAdd(o_s + r * HS + pc * C::kVec + e, acc[k][e]);
    }
  }
  __syncthreads();
  // Rows that see a key of this partition write o / l: straight to out when there is one
  // partition, else to the workspace with (m, l) for the combine kernel.
  if constexpr (!kInSmem) {
    for (int idx = tid; idx < rows * (HS / 4); idx += kThreads) {
      const int r = idx / (HS / 4), d = idx % (HS / 4) * 4, row = row0 + r;
      if (vis_s[r] <= key_begin) continue;
      const float inv = 1.f / l_s[r];  // l >= 1: the row's largest score contributes exp2(0)
      const float4 o_sum = *reinterpret_cast<const float4*>(o_s + r * HS + d);
      const float4 o = make_float4(o_sum.x * inv, o_sum.y * inv, o_sum.z * inv, o_sum.w * inv);
      const int64_t head = row_head(p, q_start, row, kv_head);
      if (p.ws_o == nullptr) {
        store4(static_cast<T*>(p.out) + head * HS + d, o);
      } else {
        const int64_t slot = head * p.num_parts + part;
        *reinterpret_cast<float4*>(p.ws_o + slot * HS + d) = o;
        if (d == 0) reinterpret_cast<float2*>(p.ws_ml)[slot] = make_float2(m_s[r], l_s[r]);
      }
    }
  }
}

// With counters: the block that completes a (row tile, kv head) merges its rows' partitions.
// Every block of the tile arrives once, with or without keys of its own; each thread's partial
// writes are fenced before the arrival, the last block resets the count for the next launch.
template <typename T, int HS, int ROWS>
__device__ __forceinline__ void combine_if_last(const Params& p, int seq, int row0) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* count = p.counters + static_cast<int64_t>(blockIdx.x) * gridDim.z + blockIdx.z;
    last = atomicAdd(count, 1) == static_cast<int>(gridDim.y) - 1;
    if (last) atomicExch(count, 0);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int q_start = p.query_start_loc[seq], q_len = p.query_start_loc[seq + 1] - q_start;
  const int ctx = p.context_lens[seq], part_size = part_keys(p, ctx);
  const int rows = min(ROWS, q_len * p.group - row0);
  for (int r = threadIdx.x / 32; r < rows; r += kWarps) {
    const int row = row0 + r, i = row / p.group;
    const int64_t idx = row_head(p, q_start, row, blockIdx.z);
    combine_row<T, HS>(p, idx, visible_keys(p, ctx, q_len, i), part_size, threadIdx.x % 32);
  }
}

// This block's item (blockIdx.x): its sequence (-1 past the last) and first row, found by one
// warp and shared with the block.
template <int ROWS>
__device__ __forceinline__ int2 block_item(const Params& p) {
  __shared__ int2 item;
  if (threadIdx.x < 32) {
    const int2 found = find_item(p, blockIdx.x, ROWS);
    if (threadIdx.x == 0) item = make_int2(found.x, found.y * ROWS);
  }
  __syncthreads();
  return item;
}

// grid (items, partitions, kv heads): item x is a tile of kRows rows r = i * group + g of one
// sequence's q_len tokens i (find_item); partition y covers keys [y, y + 1) * part_keys. The
// block loads each K/V tile once for all its rows and keeps a running (max m, sum l, output)
// per row, flash-attention style.
template <typename T, int HS, int ROWS>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const Params p) {
  chain_in();
  const int2 item = block_item<ROWS>(p);
  const int seq = item.x, row0 = item.y;
  if (seq < 0) return;  // the grid over-counts items (no block of such an item arrives)
  attend<T, HS, ROWS, false>(p, seq, row0);
  if (p.counters != nullptr) combine_if_last<T, HS, ROWS>(p, seq, row0);
}

// The cluster's partitions of one (row tile, kv head) merged through distributed shared memory:
// every block holds its rows' output sums o_b (unnormalized) and (m_b, l_b); out = sum_b
// 2^(m_b - M) o_b / sum_b 2^(m_b - M) l_b over the blocks with l_b > 0. The blocks split the
// rows' 4-column groups between them. A row no block saw a key of is left untouched in out, as
// the other merges leave it. The cluster spans the grid's y (partitions) alone: rank = y.
template <typename T, int HS, int ROWS>
__device__ __forceinline__ void cluster_merge(const Params& p, int seq, int row0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using C = Cfg<T, HS, ROWS>;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  float* o_s = reinterpret_cast<float*>(smem + C::kQ);
  float* m_s = reinterpret_cast<float*>(smem + C::kStats);
  float* l_s = m_s + ROWS;
  cluster.sync();  // every block's sums and stats are written and visible to the cluster
  const int parts = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int q_start = p.query_start_loc[seq], q_len = p.query_start_loc[seq + 1] - q_start;
  const int rows = min(ROWS, q_len * p.group - row0);
  constexpr int kGroups = HS / 4;
  for (int idx = rank * kThreads + threadIdx.x; idx < rows * kGroups; idx += parts * kThreads) {
    const int r = idx / kGroups, d = idx % kGroups * 4;
    float mb[kMaxClusterParts], lb[kMaxClusterParts], mx = -INFINITY;
#pragma unroll
    for (int b = 0; b < kMaxClusterParts; ++b) {
      lb[b] = b < parts ? *cluster.map_shared_rank(l_s + r, b) : 0.f;
      mb[b] = b < parts ? *cluster.map_shared_rank(m_s + r, b) : -INFINITY;
      if (lb[b] > 0.f) mx = fmaxf(mx, mb[b]);
    }
    if (mx == -INFINITY) continue;
    float w = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int b = 0; b < kMaxClusterParts; ++b) {
      if (lb[b] > 0.f) {
        const float s = exp2f(mb[b] - mx);
        const float4 o = *reinterpret_cast<const float4*>(cluster.map_shared_rank(o_s + r * HS + d, b));
        w += s * lb[b];
        acc.x += s * o.x;
        acc.y += s * o.y;
        acc.z += s * o.z;
        acc.w += s * o.w;
      }
    }
    const float inv = 1.f / w;  // w >= 1: the largest m's block has l >= 1
    const int64_t head = row_head(p, q_start, row0 + r, blockIdx.z);
    store4(static_cast<T*>(p.out) + head * HS + d,
           make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
  }
  cluster.sync();  // no block leaves while another may still read its shared memory
#endif
}

// paged_attention_kernel's grid with the partitions of each (row tile, kv head) as one cluster
// (sm_90+, at most kMaxClusterParts): no workspace, no fence, no arrival count. Every block of a
// cluster has the same item, so an over-counted item's cluster leaves whole.
template <typename T, int HS, int ROWS>
__global__ void __launch_bounds__(kThreads) paged_attention_cluster_kernel(const Params p) {
  chain_in();
  const int2 item = block_item<ROWS>(p);
  const int seq = item.x, row0 = item.y;
  if (seq < 0) return;
  attend<T, HS, ROWS, true>(p, seq, row0);
  cluster_merge<T, HS, ROWS>(p, seq, row0);
}

// Without counters: grid (ceil(num_tokens * num_heads / kWarps)); a warp per (token, head).
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) combine_kernel(const Params p) {
  chain_in();
  const int lane = threadIdx.x % 32;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (idx >= static_cast<int64_t>(p.num_tokens) * p.num_heads) return;
  const int token = static_cast<int>(idx / p.num_heads);
  const int* qsl = p.query_start_loc;
  if (qsl[0] > token) return;
  int lo = 0, hi = p.num_seqs + 1;  // the owner is the last s with query_start_loc[s] <= token
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (qsl[mid] <= token ? lo : hi) = mid;
  }
  if (lo == p.num_seqs) return;  // past every sequence's tokens (padding): left untouched
  const int ctx = p.context_lens[lo];
  combine_row<T, HS>(p, idx, visible_keys(p, ctx, qsl[lo + 1] - qsl[lo], token - qsl[lo]),
                     part_keys(p, ctx), lane);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The index in `choices` of environment variable `name`'s value (the first choice when it is
// unset); anything else is an error that names every choice. Read at every call.
int env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* v = std::getenv(name);
  const std::string mode = v == nullptr ? *choices.begin() : v;
  std::string listed;
  int i = 0, found = -1;
  const int n = static_cast<int>(choices.size());
  for (const char* c : choices) {
    if (mode == c && found < 0) found = i;
    listed += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(c);
    ++i;
  }
  TORCH_CHECK(found >= 0, name, " must be ", listed, ", got '", mode, "'");
  return found;
}

// VLLM_CUDA_ATTN_BLOCKS_PER_SM: the blocks per SM the key partitions aim for (default 4).
int blocks_per_sm() {
  const char* v = std::getenv("VLLM_CUDA_ATTN_BLOCKS_PER_SM");
  if (v == nullptr) return 4;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  TORCH_CHECK(*v != '\0' && *end == '\0' && n >= 1 && n <= 64,
              "VLLM_CUDA_ATTN_BLOCKS_PER_SM must be a whole number from 1 to 64, got '", v, "'");
  return static_cast<int>(n);
}

// VLLM_CUDA_ATTN_COMBINE: how the partitions are merged (Combine); cluster by default (run 25,
// H100: the attention alone at batch 1 0.77-0.93x the last-block merge's time, the 7B batch-1
// step 5.107 -> 5.069 ms, the 5-token verification 6.283 -> 6.146).
enum Combine { kCluster = 0, kLastBlock = 1, kCombineKernel = 2 };
int combine_mode() {
  return env_choice("VLLM_CUDA_ATTN_COMBINE", {"cluster", "last-block", "kernel"});
}

// The arrival counters of a device, at least `needed` of them, or null when they would have to
// grow inside a CUDA graph capture (cudaMalloc is not allowed there: that launch then takes the
// combine kernel). One array per device, zeroed once, left zero by every launch; a grown array
// replaces the old without freeing it (graphs captured earlier keep using theirs). Launches that
// share an array must not run at the same time: the engine runs one forward at a time.
int* arrival_counters(int64_t needed, int device, cudaStream_t stream) {
  static std::mutex mutex;
  static std::unordered_map<int, std::pair<int*, int64_t>> arrays;  // device -> (array, size)
  const std::lock_guard<std::mutex> lock(mutex);
  std::pair<int*, int64_t>& a = arrays[device];
  if (a.second >= needed) return a.first;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return nullptr;
  const int64_t size = std::max<int64_t>(needed, int64_t{1} << 16);
  int* array = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&array, size * sizeof(int)));
  C10_CUDA_CHECK(cudaMemsetAsync(array, 0, size * sizeof(int), stream));
  a = {array, size};
  return array;
}

// Whether a cluster launch of `config` (its cluster dimension among its attributes) can be
// scheduled on `device`: at least one such cluster fits at a time. Cached per (kernel, cluster
// size, device), as the occupancy query costs a host round trip per call.
bool cluster_fits(const void* kernel, const cudaLaunchConfig_t& config, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, unsigned, int>, bool> fits;
  const auto key = std::make_tuple(kernel, config.attrs[0].val.clusterDim.y, device);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = fits.find(key);
  if (found != fits.end()) return found->second;
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  return fits[key] = clusters > 0;
}

template <typename T, int HS, int ROWS>
void launch(Params p, const at::Tensor& query, int64_t max_context_len, cudaStream_t stream) {
  using C = Cfg<T, HS, ROWS>;
  // Items over-count the (sequence, row tile) pairs: sum_s ceil(q_s g / R) <= T g / R + S, and
  // each pair holds at least one of the T g rows.
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.group;
  const int64_t items = std::min(rows / C::kRows + p.num_seqs, rows);
  // Split the context into enough partitions for ~4 blocks per SM (blocks_per_sm; decode at
  // small batch); large batches and prefills get one partition and skip the merge. Cluster
  // merges need sm_90 and at most kMaxClusterParts partitions, which split each sequence's own
  // context (part_keys, whatever VLLM_CUDA_ATTN_PARTS says) so that a short one still spreads
  // over them; elsewhere the last block merges.
  const int device = query.get_device();
  int sms = 0, major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (p.combine == kCluster && major < 9) p.combine = kLastBlock;
  const int64_t max_tiles = ceil_div(max_context_len, kTileKeys);
  int64_t wanted = std::clamp<int64_t>(
      ceil_div(static_cast<int64_t>(blocks_per_sm()) * sms, items * p.num_kv_heads), 1, max_tiles);
  if (p.combine == kCluster) {
    wanted = std::min<int64_t>(wanted, kMaxClusterParts);
    p.parts_by_context = 1;
  }
  const int64_t tiles_per_part = ceil_div(max_tiles, wanted);
  p.num_parts = static_cast<int>(ceil_div(max_tiles, tiles_per_part));
  p.part_size = static_cast<int>(tiles_per_part * kTileKeys);
  TORCH_CHECK(items <= INT32_MAX && p.num_parts <= 65535 && p.num_kv_heads <= 65535,
              "paged_attention: batch too large for one launch");
  const dim3 grid(static_cast<unsigned>(items), p.num_parts, p.num_kv_heads);
  if (p.num_parts > 1 && p.combine == kCluster) {
    auto kernel = paged_attention_cluster_kernel<T, HS, ROWS>;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(C::kBytes)));
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = static_cast<unsigned>(p.num_parts);
    attr[0].val.clusterDim.z = 1;
    const cudaLaunchConfig_t config =
        launch_config(grid, dim3(kThreads), C::kBytes, stream, attr, 1);
    if (cluster_fits(reinterpret_cast<const void*>(kernel), config, device)) {
      launch_kernel_ex(kernel, grid, dim3(kThreads), C::kBytes, stream, attr, 1, p);
      return;
    }
    p.combine = kLastBlock;  // the same partitions, merged by their last block
  }
  at::Tensor ws;
  if (p.num_parts > 1) {
    const int64_t slots = static_cast<int64_t>(p.num_tokens) * p.num_heads * p.num_parts;
    ws = at::empty({slots * (HS + 2)}, query.options().dtype(at::kFloat));
    p.ws_o = ws.data_ptr<float>();
    p.ws_ml = p.ws_o + slots * HS;
  }
  if (p.num_parts > 1 && p.combine == kLastBlock) {
    p.counters = arrival_counters(items * p.num_kv_heads, device, stream);
  }
  auto kernel = paged_attention_kernel<T, HS, ROWS>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(C::kBytes)));
  launch_kernel(kernel, grid, dim3(kThreads), C::kBytes, stream, p);
  if (p.num_parts > 1 && p.counters == nullptr) {
    const int64_t blocks = ceil_div(static_cast<int64_t>(p.num_tokens) * p.num_heads, kWarps);
    launch_kernel(combine_kernel<T, HS>, dim3(blocks), dim3(kThreads), 0, stream, p);
  }
}

// Few rows per block when the sequences bring few rows on average (decode, verification of a
// few drafts); either choice computes the same result, only the speed differs.
template <typename T, int HS>
void launch_rows(const Params& p, const at::Tensor& query, int64_t max_context_len,
                 cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.group;
  if (rows <= static_cast<int64_t>(kFewRows) * p.num_seqs && kFewRows < kManyRows<T, HS>) {
    launch<T, HS, kFewRows>(p, query, max_context_len, stream);
  } else {
    launch<T, HS, kManyRows<T, HS>>(p, query, max_context_len, stream);
  }
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// VLLM_CUDA_ATTN_PARTS: max (default: partitions sized for max_context_len, as captured in a
// CUDA graph) or context (sized per sequence on the device: part_keys).
int parts_by_context() { return env_choice("VLLM_CUDA_ATTN_PARTS", {"max", "context"}); }

}  // namespace

// The sequence metadata is trusted: the CPU checks it on the host, which here would need a
// sync. Keys past max_context_len are not attended.
void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                     const at::Tensor& context_lens, const at::Tensor& query_start_loc,
                     int64_t max_context_len, double scale) {
  vllm::check_paged_attention_args(out, query, key_cache, value_cache, block_tables, context_lens,
                                   query_start_loc);
  const int64_t num_tokens = query.size(0), num_heads = query.size(1), head_size = query.size(2);
  const int64_t num_seqs = context_lens.size(0);
  TORCH_CHECK(max_context_len >= 0 && max_context_len <= INT32_MAX,
              "max_context_len must be in [0, 2^31), got ", max_context_len);
  if (num_tokens == 0 || num_heads == 0 || num_seqs == 0 || max_context_len == 0) return;
  TORCH_CHECK(aligned16(out) && aligned16(query) && aligned16(key_cache) && aligned16(value_cache),
              "paged_attention: out, query and the caches must be 16-byte aligned");
  const int64_t q_stride = num_tokens > 1 ? query.stride(0) : num_heads * head_size;
  TORCH_CHECK(q_stride * query.element_size() % 16 == 0, "paged_attention on CUDA: query's ",
              "token stride (", q_stride, " elements) must be a multiple of 16 bytes");
  TORCH_CHECK(num_tokens * num_heads <= INT32_MAX &&
                  key_cache.size(2) * block_tables.size(1) <= INT32_MAX,
              "paged_attention: sizes past the int32 range");
  const int num_kv_heads = static_cast<int>(key_cache.size(1));
  Params p{out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
           block_tables.data_ptr<int>(), context_lens.data_ptr<int>(),
           query_start_loc.data_ptr<int>(), nullptr, nullptr, static_cast<int>(num_seqs),
           static_cast<int>(num_tokens), static_cast<int>(num_heads), num_kv_heads,
           static_cast<int>(num_heads) / num_kv_heads, static_cast<int>(key_cache.size(2)),
           static_cast<int>(block_tables.size(1)), 0, 0, static_cast<float>(scale) * kLog2e,
           parts_by_context(), combine_mode(), nullptr, q_stride};
  const c10::cuda::OptionalCUDAGuard guard(device_of(query));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  VLLM_CUDA_DISPATCH_FLOAT_TYPES(query.scalar_type(), "paged_attention", [&] {
    switch (head_size) {
      case 32: return launch_rows<scalar_t, 32>(p, query, max_context_len, stream);
      case 64: return launch_rows<scalar_t, 64>(p, query, max_context_len, stream);
      case 80: return launch_rows<scalar_t, 80>(p, query, max_context_len, stream);
      case 96: return launch_rows<scalar_t, 96>(p, query, max_context_len, stream);
      case 128: return launch_rows<scalar_t, 128>(p, query, max_context_len, stream);
      case 256: return launch_rows<scalar_t, 256>(p, query, max_context_len, stream);
      default:
        TORCH_CHECK(false, "paged_attention supports head sizes 32, 64, 80, 96, 128 and 256, got ",
                    head_size);
    }
  });
}

}  // namespace vllm_cuda
