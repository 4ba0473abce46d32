// The CPU attention's fold for decode_layers (attention.cpp).
#pragma once

#include <torch/all.h>

#include <memory>

namespace vllm_cpu {

// An attention call's parts, planned before any runs (from the sequences' lengths and block
// tables, not the query's values): run(begin, end) runs parts [begin, end) on the calling
// thread, each part on any thread once the query (and, folded, the new keys and values) is
// written. small(): too little work to wake other threads (run it on one).
class AttentionLoop {
 public:
  virtual ~AttentionLoop() = default;
  virtual int64_t parts() const = 0;
  virtual bool small() const = 0;
  virtual void run(int64_t begin, int64_t end) const = 0;
  // The same plan for the next layer of a step (the same sequences, query and new tokens):
  // its key and value caches, of the planned ones' sizes, strides and dtype, in their place,
  // and the split tasks' merge counters reset. Called where no thread runs the loop.
  virtual void next_layer(const at::Tensor& key_cache, const at::Tensor& value_cache) = 0;
};

// The loop's parts as one parallel loop (on one thread where small()).
void run_attention_loop(const AttentionLoop& loop);

// rotary_embedding of query and key, reshape_and_cache of the rotated key and value, then
// paged_attention into out [tokens, heads, head_size], as one parallel loop's parts: each
// attention task rotates its own query heads (into a buffer of its thread) and writes its new
// keys and values into the caches before reading them, the split tasks merged by the thread
// that finishes each one's last part (one hand-over between cores instead of three; the same
// bits). query, key and value: the qkv linear's [tokens, heads x head_size] row views, not
// rotated (left so). Planned (its checks made) before the qkv linear writes them; run by
// run_attention_loop or as a team's tail (team.h) after; next_layer plans the step's next
// layer (its caches). Only where rotary_cache_attention_applies.
std::unique_ptr<AttentionLoop> rotary_cache_attention_loop(
    at::Tensor& out, at::Tensor& query, at::Tensor& key, const at::Tensor& value,
    const at::Tensor& positions, const at::Tensor& cos_sin_cache, bool is_neox,
    at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& slot_mapping,
    const at::Tensor& block_tables, const at::Tensor& context_lens,
    const at::Tensor& query_start_loc, int64_t max_context_len, double scale);
// Whether every sequence's tokens are one attention task (at most 64 query rows: a task of 2+
// tokens reads its earlier tokens' keys, which another task would be writing).
bool rotary_cache_attention_applies(const at::Tensor& query_start_loc, int64_t num_heads,
                                    int64_t num_kv_heads);

}  // namespace vllm_cpu
