// greedy_steps on the CPU: a plain-greedy draft's next `steps` one-token forwards in one call.
// Each step gathers its tokens' embedding rows, runs decode_layers (every layer and the final
// norm) and linear_argmax (the LM head's first maximum a row), and feeds those tokens to the
// next step at the next positions, the slots and context lengths worked out here from the block
// tables. Between a draft's steps nothing but these three calls runs: in a Python loop, each
// step's input building, embedding and dispatch cost about as much as a small draft's layers
// (a 20M draft on a 2-core Xeon: ~0.25 ms of a 0.9 ms forward, its Python's data evicted by the
// weights' stream every step).
#include <algorithm>
#include <vector>

#include "core/checks.h"
#include "ops.h"

namespace vllm_cpu {

void greedy_steps(at::Tensor& tokens, const at::Tensor& input_ids, const at::Tensor& positions,
                  const at::Tensor& embedding, const std::vector<at::Tensor>& weights,
                  const at::Tensor& final_norm, const at::Tensor& cos_sin_cache,
                  const std::vector<at::Tensor>& key_caches,
                  const std::vector<at::Tensor>& value_caches, const at::Tensor& block_tables,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_size, double epsilon,
                  double scale, bool is_neox, const std::vector<at::Tensor>& packed,
                  const at::Tensor& head, const at::Tensor& head_packed,
                  const std::optional<at::Tensor>& stage_ms) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong && tokens.is_contiguous(),
              "tokens must be a contiguous int64 [steps, rows] tensor, got ", tokens.sizes(), " ",
              tokens.scalar_type());
  const int64_t steps = tokens.size(0), rows = tokens.size(1);
  TORCH_CHECK(steps > 0 && rows > 0, "greedy_steps needs at least one step and one row");
  TORCH_CHECK(input_ids.dim() == 1 && input_ids.size(0) == rows &&
                  input_ids.scalar_type() == at::kLong && positions.dim() == 1 &&
                  positions.size(0) == rows && positions.scalar_type() == at::kLong,
              "input_ids and positions must be int64 [", rows, "] (one token a sequence)");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == rows &&
                  block_tables.scalar_type() == at::kInt,
              "block_tables must be int32 [", rows, ", max_blocks], got ", block_tables.sizes(),
              " ", block_tables.scalar_type());
  TORCH_CHECK(!key_caches.empty() && embedding.dim() == 2 && head.dim() == 2 &&
                  embedding.size(1) == head.size(1),
              "greedy_steps needs a layer, and an embedding and LM head of the same width");
  const int64_t vocab = embedding.size(0), block_size = key_caches[0].size(2);
  const int64_t max_blocks = block_tables.size(1);
  const auto tables = block_tables.contiguous();
  const int32_t* table = tables.data_ptr<int32_t>();
  const auto cpu_long = positions.options().dtype(at::kLong);
  const auto cpu_int = positions.options().dtype(at::kInt);
  at::Tensor pos = positions.contiguous().clone();
  at::Tensor slots = at::empty({rows}, cpu_long);
  at::Tensor context_lens = at::empty({rows}, cpu_int);
  at::Tensor query_start_loc = at::arange(rows + 1, cpu_int);
  at::Tensor ids = input_ids.contiguous();
  at::Tensor hidden = at::empty({rows, embedding.size(1)}, embedding.options());
  int64_t* p = pos.data_ptr<int64_t>();
  int64_t* slot = slots.data_ptr<int64_t>();
  int32_t* ctx = context_lens.data_ptr<int32_t>();
  // every position the steps write must lie in its sequence's tables, and the first tokens in
  // the embedding (later steps' tokens are the LM head's columns)
  const int64_t* first = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(p[r] >= 0 && (p[r] + steps - 1) / block_size < max_blocks, "positions[", r,
                "] = ", p[r], ": its ", steps, " steps reach past the block table's ", max_blocks,
                " blocks of ", block_size);
    TORCH_CHECK(first[r] >= 0 && first[r] < vocab, "token ", first[r], " (row ", r,
                ") is outside the embedding's ", vocab, " rows");
  }
  TORCH_CHECK(head.size(0) <= vocab, "the LM head's ", head.size(0),
              " rows exceed the embedding's ", vocab);
  for (int64_t s = 0; s < steps; ++s) {
    at::index_select_out(hidden, embedding, 0, ids);
    int64_t max_context_len = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (s > 0) ++p[r];
      slot[r] = static_cast<int64_t>(table[r * max_blocks + p[r] / block_size]) * block_size +
                p[r] % block_size;
      ctx[r] = static_cast<int32_t>(p[r] + 1);
      max_context_len = std::max<int64_t>(max_context_len, p[r] + 1);
    }
    decode_layers(hidden, pos, weights, final_norm, cos_sin_cache, key_caches, value_caches,
                  slots, tables, context_lens, query_start_loc, max_context_len, num_heads,
                  num_kv_heads, head_size, epsilon, scale, is_neox, packed, stage_ms);
    at::Tensor out = tokens[s];
    linear_argmax(out, hidden, head, head_packed);
    ids = out;
  }
}

}  // namespace vllm_cpu
