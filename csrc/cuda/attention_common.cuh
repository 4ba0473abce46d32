// What the CUDA paged attention's two block kernels share (attention.cu: K/V tiles in shared
// memory; attention_warps.cuh: warps on their own key slices): the launch parameters, which
// keys a row sees and a partition holds, and how a block reads its queries and writes a
// partition's result.
#pragma once

#include <cstdint>

namespace vllm_cuda {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

struct Params {
  void* out;                   // [num_tokens, num_heads, HS]
  const void* query;           // [num_tokens, num_heads, HS]
  const void* key_cache;       // [num_blocks, num_kv_heads, block_size, HS]
  const void* value_cache;     // same
  const int* block_tables;     // [num_seqs, max_blocks]
  const int* context_lens;     // [num_seqs]
  const int* query_start_loc;  // [num_seqs + 1]
  float* ws_o;   // [num_tokens, num_heads, num_parts, HS] partial outputs; null: one partition
  float* ws_ml;  // [num_tokens, num_heads, num_parts, 2] partial (max, sum), log2 units
  int num_seqs, num_tokens, num_heads, num_kv_heads, group, block_size, max_blocks;
  int num_parts, part_size;
  int part_unit;     // partitions hold whole units of this many keys (the kernel's key step)
  float scale_log2;  // scale * log2(e): scores live in log2 units for exp2f
  int parts_by_context;  // partitions sized per sequence on the device (part_keys)
  int combine_last_block;  // VLLM_CUDA_ATTN_COMBINE: counters wanted when partitioned
  // [items * num_kv_heads] arrival counts, zero between launches: with them the last block of
  // each (row tile, kv head) to finish merges the partitions itself; null: the combine kernel
  int* counters;
};

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Keys visible to query token i of a sequence: causal among its q_len new tokens, clamped to
// the keys the block table and the grid's partitions reach (all kernels must agree on it).
__device__ __forceinline__ int reach_keys(const Params& p, int ctx) {
  return min(ctx, min(p.max_blocks * p.block_size, p.num_parts * p.part_size));
}
__device__ __forceinline__ int visible_keys(const Params& p, int ctx, int q_len, int i) {
  return min(ctx - q_len + i + 1, reach_keys(p, ctx));
}

// Keys per partition for a sequence of ctx keys: the launch's part_size (sized on the host for
// max_context_len), or with parts_by_context the fewest whole units that spread the keys the
// sequence reaches over the grid's partitions: a CUDA graph captured for the longest context
// then splits a short one over as many blocks as a long one, each walking fewer keys. All
// kernels must agree on it; num_parts * part_keys covers the keys visible_keys reaches.
__device__ __forceinline__ int part_keys(const Params& p, int ctx) {
  if (!p.parts_by_context) return p.part_size;
  const int per = (reach_keys(p, ctx) + p.num_parts - 1) / p.num_parts;
  return max(p.part_unit, min(p.part_size, (per + p.part_unit - 1) / p.part_unit * p.part_unit));
}

// Flat (token, head) index of row `row` of a block: rows r = i * group + g are the sequence's
// token i and query head g of kv_head's group.
__device__ __forceinline__ int64_t row_head(const Params& p, int q_start, int row, int kv_head) {
  return static_cast<int64_t>(q_start + row / p.group) * p.num_heads + kv_head * p.group +
         row % p.group;
}

// Element offset of key pos's cache row for kv_head, -1 at or past key_end.
template <int HS>
__device__ __forceinline__ int64_t key_row(const Params& p, const int* table, int pos,
                                           int kv_head, int key_end) {
  if (pos >= key_end) return -1;
  return ((static_cast<int64_t>(table[pos / p.block_size]) * p.num_kv_heads + kv_head) *
              p.block_size + pos % p.block_size) * HS;
}

// The block's rows' queries into q_s [rows][HS], fp32, pre-scaled into log2 units.
template <typename T, int HS>
__device__ __forceinline__ void load_queries(const Params& p, float* q_s, int q_start, int row0,
                                             int rows, int kv_head) {
  constexpr int kVec = 16 / sizeof(T), kChunks = HS / kVec;
  using P = Pack<T, kVec>;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const int64_t head = row_head(p, q_start, row0 + r, kv_head);
    const P v = reinterpret_cast<const P*>(static_cast<const T*>(p.query) + head * HS)[c];
#pragma unroll
    for (int e = 0; e < kVec; ++e) q_s[r * HS + c * kVec + e] = static_cast<float>(v.v[e]) * p.scale_log2;
  }
}

// A block's result for four columns d .. d + 3 of one (token, head) row over its partition:
// o_sum / l straight to out when there is one partition, else to the workspace with the row's
// (m, l) for the merge.
template <typename T, int HS>
__device__ __forceinline__ void store_part(const Params& p, int64_t head, int d, float4 o_sum,
                                           float m, float l) {
  const float inv = 1.f / l;  // l >= 1: the row's largest score contributes exp2(0)
  const float4 o = make_float4(o_sum.x * inv, o_sum.y * inv, o_sum.z * inv, o_sum.w * inv);
  if (p.ws_o == nullptr) {
    *reinterpret_cast<Pack<T, 4>*>(static_cast<T*>(p.out) + head * HS + d) =
        Pack<T, 4>{{static_cast<T>(o.x), static_cast<T>(o.y), static_cast<T>(o.z), static_cast<T>(o.w)}};
  } else {
    const int64_t slot = head * p.num_parts + blockIdx.y;
    *reinterpret_cast<float4*>(p.ws_o + slot * HS + d) = o;
    if (d == 0) reinterpret_cast<float2*>(p.ws_ml)[slot] = make_float2(m, l);
  }
}

}  // namespace
}  // namespace vllm_cuda
