// The decode variant of the paged-attention block (VLLM_CUDA_ATTN_DECODE=warp), for blocks of a
// few query rows: each warp walks its own 32-key slices of the block's partition with no
// shared K/V tiles and no block-wide barrier per slice. For the scores a lane owns a key (its K
// row read straight into registers, the rows' queries broadcast from shared memory); for P V a
// lane owns a 16-byte column chunk of a few keys' V rows (read coalesced, a row per 2-16 lanes).
// Each warp keeps a running (max, sum, output) per row; the warps merge once at the end.
#pragma once

#include <cstdint>

#include "cuda/attention_common.cuh"

namespace vllm_cuda {
namespace {

template <typename T, int HS, int ROWS>
struct SliceCfg {
  static constexpr int kVec = 16 / sizeof(T), kChunks = HS / kVec;  // 16-byte chunks per row
  static constexpr int kRows = ROWS;
  static constexpr int kSlots = kChunks <= 32 ? 32 / kChunks : 1;  // keys per P V step
  static constexpr int kKeysPerLane = (32 + kSlots - 1) / kSlots;
  static constexpr int kUnit = kWarps * 32;  // partitions hold whole units: a slice per warp
  // a lane holds a K row and a V chunk of kKeysPerLane keys in registers: rows of at most 16
  // chunks (fp16 and bf16 heads up to 128, fp32 up to 64); the tile kernel takes the rest
  static constexpr bool kSupported = HS % kVec == 0 && kChunks <= 16;
  // V loaded beside K when the accumulators leave registers for both; else after the scores
  static constexpr bool kEarlyV = kRows * kVec <= 16;
  // bytes: queries and the output sum float [kRows][HS] each; probabilities float
  // [kWarps][kRows][32]; each warp's (max, sum) float [2][kWarps][kRows]
  static constexpr size_t kBytes = (2 * kRows * HS + kWarps * kRows * 32 + 2 * kWarps * kRows) *
                                   sizeof(float);
};

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> as_pack(uint4 u) {
  static_assert(sizeof(Pack<T, N>) == sizeof(uint4), "a pack is 16 bytes");
  return *reinterpret_cast<const Pack<T, N>*>(&u);
}

// One block's partition of keys for rows row0 .. of sequence seq (SliceCfg's variant of attend).
template <typename T, int HS, int ROWS>
__device__ __forceinline__ void attend_slices(const Params& p, int seq, int row0) {
  using C = SliceCfg<T, HS, ROWS>;
  using P = Pack<T, C::kVec>;
  constexpr int R = ROWS, V = C::kVec;
  extern __shared__ __align__(16) unsigned char smem[];
  float* q_s = reinterpret_cast<float*>(smem);
  float* o_s = q_s + R * HS;
  float* p_s = o_s + R * HS;               // [kWarps][R][32]
  float* max_s = p_s + kWarps * R * 32;    // [kWarps][R]
  float* sum_s = max_s + kWarps * R;       // [kWarps][R]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int kv_head = blockIdx.z;
  const int q_start = p.query_start_loc[seq], q_len = p.query_start_loc[seq + 1] - q_start;
  const int ctx = p.context_lens[seq];
  const int rows = min(R, q_len * p.group - row0);
  const int part_size = part_keys(p, ctx);
  const int key_begin = blockIdx.y * part_size;
  const int key_end = min(key_begin + part_size,
                          visible_keys(p, ctx, q_len, (row0 + rows - 1) / p.group));
  if (key_begin >= key_end) return;  // no row of the block sees a key of this partition
  const int* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks;
  const T* key_cache = static_cast<const T*>(p.key_cache);
  const T* value_cache = static_cast<const T*>(p.value_cache);

  load_queries<T, HS>(p, q_s, q_start, row0, rows, kv_head);
  for (int i = tid; i < R * HS; i += kThreads) o_s[i] = 0.f;
  int vis[R];  // keys row r sees in this partition end at vis[r]
#pragma unroll
  for (int r = 0; r < R; ++r) {
    vis[r] = r < rows ? min(visible_keys(p, ctx, q_len, (row0 + r) / p.group), key_end) : 0;
  }
  __syncthreads();

  float m[R], l[R], acc[R][V];  // l: this lane's keys' share of the row sum
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < V; ++e) acc[r][e] = 0.f;
  }
  float* pw = p_s + warp * R * 32;
  const int pc = lane % C::kChunks, ks = lane / C::kChunks;  // P V: column chunk, key slot
  const bool pv_lane = ks < C::kSlots;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  int base = key_begin + warp * 32;  // this warp's slices: base .. base + 31, then + kUnit
  int64_t off = key_row<HS>(p, table, base + lane, kv_head, key_end);  // this lane's key row
  for (; base < key_end; base += C::kUnit) {
    uint4 kr[C::kChunks];  // the lane's K row; rows past key_end read as zeros
#pragma unroll
    for (int c = 0; c < C::kChunks; ++c) {
      kr[c] = off >= 0 ? __ldg(reinterpret_cast<const uint4*>(key_cache + max(off, int64_t{0})) + c)
                       : zero;
    }
    uint4 vr[C::kKeysPerLane];  // chunk pc of the V rows of keys ks, ks + kSlots, ...
    const int64_t slice_off = off;
    auto load_v = [&] {
#pragma unroll
      for (int i = 0; i < C::kKeysPerLane; ++i) {
        const int j = ks + C::kSlots * i;
        const int64_t oj = __shfl_sync(0xffffffffu, slice_off, j & 31);
        vr[i] = pv_lane && j < 32 && oj >= 0
                    ? __ldg(reinterpret_cast<const uint4*>(value_cache + max(oj, int64_t{0})) + pc)
                    : zero;
      }
    };
    if constexpr (C::kEarlyV) load_v();
    off = key_row<HS>(p, table, base + C::kUnit + lane, kv_head, key_end);  // the next slice

    float s[R] = {};
#pragma unroll
    for (int c = 0; c < C::kChunks; ++c) {
      const P kv = as_pack<T, V>(kr[c]);
      float kf[V];
#pragma unroll
      for (int e = 0; e < V; ++e) kf[e] = static_cast<float>(kv.v[e]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
#pragma unroll
        for (int e = 0; e < V; e += 4) {
          const float4 q = *reinterpret_cast<const float4*>(q_s + r * HS + c * V + e);
          s[r] += q.x * kf[e] + q.y * kf[e + 1] + q.z * kf[e + 2] + q.w * kf[e + 3];
        }
      }
    }
    if constexpr (!C::kEarlyV) load_v();
    // Online softmax over the slice: the lane's key's probability exp2(s - m_new) per row.
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
      const float sc = base + lane < vis[r] ? s[r] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(sc));
      const float alpha = m_new == -INFINITY ? 1.f : exp2f(m[r] - m_new);
      const float pr = m_new == -INFINITY ? 0.f : exp2f(sc - m_new);  // nothing seen: no NaN
      l[r] = l[r] * alpha + pr;
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < V; ++e) acc[r][e] *= alpha;
      pw[r * 32 + lane] = pr;
    }
    __syncwarp();
    if (pv_lane) {
#pragma unroll
      for (int i = 0; i < C::kKeysPerLane; ++i) {
        const int j = ks + C::kSlots * i;
        if (j >= 32) break;
        const P vv = as_pack<T, V>(vr[i]);
        float vf[V];
#pragma unroll
        for (int e = 0; e < V; ++e) vf[e] = static_cast<float>(vv.v[e]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= rows) break;
          const float pj = pw[r * 32 + j];
#pragma unroll
          for (int e = 0; e < V; ++e) acc[r][e] += pj * vf[e];
        }
      }
    }
    __syncwarp();  // the probabilities are free for the next slice
  }

  // Merge the warps: M = the rows' largest max over warps; each warp adds its output scaled by
  // 2^(m_w - M) into o_s, and L = sum_w l_w 2^(m_w - M).
#pragma unroll
  for (int r = 0; r < R; ++r) {
    l[r] = warp_sum(l[r]);
    if (lane == 0) {
      max_s[warp * R + r] = m[r];
      sum_s[warp * R + r] = l[r];
    }
  }
  __syncthreads();
  auto row_max = [&](int r) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, max_s[w * R + r]);
    return mx;
  };
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    if (!pv_lane || m[r] == -INFINITY) continue;  // a warp that saw none of the row's keys
    const float f = exp2f(m[r] - row_max(r));
#pragma unroll
    for (int e = 0; e < V; ++e) atomicAdd(o_s + r * HS + pc * V + e, acc[r][e] * f);
  }
  __syncthreads();
  for (int idx = tid; idx < rows * (HS / 4); idx += kThreads) {
    const int r = idx / (HS / 4), d = idx % (HS / 4) * 4, row = row0 + r;
    if (min(visible_keys(p, ctx, q_len, row / p.group), key_end) <= key_begin) continue;
    const float mx = row_max(r);
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = max_s[w * R + r];
      if (mw != -INFINITY) sum += sum_s[w * R + r] * exp2f(mw - mx);
    }
    store_part<T, HS>(p, row_head(p, q_start, row, kv_head), d,
                      *reinterpret_cast<const float4*>(o_s + r * HS + d), mx, sum);
  }
}

}  // namespace
}  // namespace vllm_cuda
