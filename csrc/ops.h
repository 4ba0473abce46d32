// Every exported kernel signature. Each device has its own namespace (vllm_cpu, vllm_cuda) so the
// symbols stay distinct; torch_bindings.cpp registers both under one schema per op.
#pragma once

#include <torch/all.h>

#include <vector>

#define VLLM_KERNEL_DECLARATIONS                                                                 \
  /* out[t] = input[t] / rms(input[t]) * weight; input/out [num_tokens, hidden] */               \
  void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,             \
                double epsilon);                                                                 \
  /* residual += input; input = rms_norm(residual) * weight (both in place) */                   \
  void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,    \
                          double epsilon);                                                       \
  /* input [num_tokens, 2 * d] -> out [num_tokens, d] = silu(input[:, :d]) * input[:, d:] */     \
  void silu_and_mul(at::Tensor& out, const at::Tensor& input);                                   \
  /* rotates query [num_tokens, num_heads * head_size] and key [num_tokens, num_kv_heads *       \
     head_size] in place at positions [num_tokens]; cos_sin_cache [max_pos, rot_dim] holds cos   \
     in its first half and sin in its second; neox rotates halves, gpt-j interleaved pairs */    \
  void rotary_embedding(const at::Tensor& positions, at::Tensor& query, at::Tensor& key,         \
                        int64_t head_size, const at::Tensor& cos_sin_cache, bool is_neox);       \
  /* key/value [num_tokens, num_kv_heads, head_size] -> caches [num_blocks, num_kv_heads,        \
     block_size, head_size] at slot_mapping [num_tokens] (block * block_size + offset; <0 skips) */ \
  void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,  \
                         at::Tensor& value_cache, const at::Tensor& slot_mapping);               \
  /* rotary_embedding of query and key, then reshape_and_cache of the rotated key and value;  \
     key/value [num_tokens, num_kv_heads, head_size] with each row's heads adjacent */           \
  void rotary_embedding_and_cache(const at::Tensor& positions, at::Tensor& query,                \
                                  at::Tensor& key, const at::Tensor& value, int64_t head_size,   \
                                  const at::Tensor& cos_sin_cache, bool is_neox,                 \
                                  at::Tensor& key_cache, at::Tensor& value_cache,                \
                                  const at::Tensor& slot_mapping);                               \
  /* for each layer, copies cache block src -> dst for each row of block_mapping [n, 2] */       \
  void copy_blocks(const std::vector<at::Tensor>& key_caches,                                    \
                   const std::vector<at::Tensor>& value_caches, const at::Tensor& block_mapping); \
  /* out/query [num_tokens, num_heads, head_size]; sequence s owns query rows                    \
     query_start_loc[s]..query_start_loc[s+1] (its newest tokens, already in the cache) and      \
     attends causally over its context_lens[s] cached tokens through block_tables[s] */          \
  void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,    \
                       const at::Tensor& value_cache, const at::Tensor& block_tables,            \
                       const at::Tensor& context_lens, const at::Tensor& query_start_loc,        \
                       int64_t max_context_len, double scale);                                   \
  /* a decode step's matmul of few rows: out [M, N] = input [M, K] @ weight [N, K]^T (+ bias     \
     [N]); fp32 sums, cost ~ the weight bytes (each weight byte read once for all M rows) */     \
  void linear_small(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,          \
                    const std::optional<at::Tensor>& bias);

namespace vllm_cpu {
VLLM_KERNEL_DECLARATIONS
// CPU only: a decode step of few rows in one call (cpu/decode_layers.cpp).
/* hidden [num_tokens, hidden] (the embedded tokens) -> the final norm's output, in place, through
   every layer; weights: per layer ln1, qkv_w, qkv_b (empty: none), o_w, ln2, gate_up_w, down_w;
   caches and attention metadata as for reshape_and_cache and paged_attention; packed: empty, or
   per layer pack_linear's copies of qkv_w, o_w, gate_up_w, down_w (each may be empty);
   stage_ms: none, or float64 [kDecodeStages] to which each stage's wall time is added */
void decode_layers(at::Tensor& hidden, const at::Tensor& positions,
                   const std::vector<at::Tensor>& weights, const at::Tensor& final_norm,
                   const at::Tensor& cos_sin_cache, const std::vector<at::Tensor>& key_caches,
                   const std::vector<at::Tensor>& value_caches, const at::Tensor& slot_mapping,
                   const at::Tensor& block_tables, const at::Tensor& context_lens,
                   const at::Tensor& query_start_loc, int64_t max_context_len, int64_t num_heads,
                   int64_t num_kv_heads, int64_t head_size, double epsilon, double scale,
                   bool is_neox, const std::vector<at::Tensor>& packed,
                   const std::optional<at::Tensor>& stage_ms);
// decode_layers' stages, the entries of its optional stage_ms (ms added per stage; the checks
// and allocations between stages count to the next one): the norms (each layer's two and the
// final one), the qkv linear, rotary with the cache write, the attention, the o linear, the
// gate/up linear, silu_and_mul, the down linear; and greedy_steps' own (its decode_layers
// adding the above): each step's input rows (slots, context lengths, the embedding's rows) and
// its LM head (linear_argmax).
enum DecodeStage {
  kStageNorms, kStageQkv, kStageRotaryCache, kStageAttention, kStageO, kStageGateUp,
  kStageSilu, kStageDown, kStageInputs, kStageLmHead, kDecodeStages
};
// CPU only: a weight's packed copy for the packed tiles (cpu/linear_packed.cpp; empty where this
// CPU or dtype has none), and linear_small with it.
at::Tensor pack_linear(const at::Tensor& weight);
void linear_packed(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                   const at::Tensor& packed, const std::optional<at::Tensor>& bias);
// out [rows] (int64) = each row's first maximal index of input @ weight^T in weight's dtype, a
// NaN as the maximum (cpu/linear_argmax.cpp; packed as for linear_packed): a greedy draft's
// tokens without its logits.
void linear_argmax(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                   const at::Tensor& packed);
// tokens [steps, rows] (int64) = a plain-greedy draft's next `steps` tokens a sequence
// (cpu/greedy_steps.cpp): from input_ids at positions (one token a sequence, or with
// query_start_loc [rows + 1] several at consecutive positions in the first step), each step the
// embedding's rows, decode_layers (arguments as there; slots, context lengths from
// block_tables) and linear_argmax over head (head_packed as for linear_packed) of each
// sequence's last row, its tokens the next step's input at the next positions. step_ms: none,
// or float64 [steps] to which each step's wall time is written (ms; the first step's from the
// call's start: its checks and the team's start count to it).
void greedy_steps(at::Tensor& tokens, const at::Tensor& input_ids, const at::Tensor& positions,
                  const at::Tensor& embedding, const std::vector<at::Tensor>& weights,
                  const at::Tensor& final_norm, const at::Tensor& cos_sin_cache,
                  const std::vector<at::Tensor>& key_caches,
                  const std::vector<at::Tensor>& value_caches, const at::Tensor& block_tables,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_size, double epsilon,
                  double scale, bool is_neox, const std::vector<at::Tensor>& packed,
                  const at::Tensor& head, const at::Tensor& head_packed,
                  const std::optional<at::Tensor>& stage_ms,
                  const std::optional<at::Tensor>& query_start_loc,
                  const std::optional<at::Tensor>& step_ms);
}  // namespace vllm_cpu

#ifdef VLLM_WITH_CUDA
namespace vllm_cuda {
VLLM_KERNEL_DECLARATIONS
}  // namespace vllm_cuda
#endif
