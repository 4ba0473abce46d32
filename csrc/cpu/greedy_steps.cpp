// greedy_steps on the CPU: a plain-greedy draft's next `steps` forwards in one call (the first
// may catch a sequence up on several tokens, the later ones feed one token a sequence). Each
// step gathers its tokens' embedding rows, runs decode_layers (every layer and the final norm)
// and linear_argmax (the LM head's first maximum, of each sequence's last row), and feeds those
// tokens to the next step at the next positions, the slots and context lengths worked out here
// from the block tables. Between a draft's steps nothing but these three calls runs: in a
// Python loop, each step's input building, embedding and dispatch cost about as much as a
// small draft's layers (a 20M draft on a 2-core Xeon: ~0.25 ms of a 0.9 ms forward, its
// Python's data evicted by the weights' stream every step). Where every linear is this
// extension's loop, all the steps run in one team region (team.h), the LM head's loops too.
#include <algorithm>
#include <chrono>
#include <vector>

#include "core/checks.h"
#include "cpu/linear.h"
#include "cpu/stage_clock.h"
#include "cpu/switches.h"
#include "cpu/team.h"
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
                  const std::optional<at::Tensor>& stage_ms,
                  const std::optional<at::Tensor>& query_start_loc,
                  const std::optional<at::Tensor>& step_ms) {
  auto step_start = std::chrono::steady_clock::now();  // the first step's: the call's start
  SettingsScope settings;  // every setting looked up once for the call's steps
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong && tokens.is_contiguous(),
              "tokens must be a contiguous int64 [steps, rows] tensor, got ", tokens.sizes(), " ",
              tokens.scalar_type());
  const int64_t steps = tokens.size(0), rows = tokens.size(1);
  TORCH_CHECK(steps > 0 && rows > 0, "greedy_steps needs at least one step and one row");
  double* step_out = ms_entries(step_ms, steps, "step_ms");
  const int64_t num_tokens = input_ids.dim() == 1 ? input_ids.size(0) : -1;
  TORCH_CHECK(num_tokens >= rows && input_ids.scalar_type() == at::kLong &&
                  positions.dim() == 1 && positions.size(0) == num_tokens &&
                  positions.scalar_type() == at::kLong,
              "input_ids and positions must be int64 [tokens] of the same length, at least one "
              "token a sequence (", rows, "); got ", input_ids.sizes(), " and ", positions.sizes());
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
  // the first step's query starts: given (a sequence may feed several tokens whose KV is
  // missing, at consecutive positions) or one token a sequence
  at::Tensor first_qsl = query_start_loc.has_value() ? query_start_loc->contiguous()
                                                     : at::arange(rows + 1, cpu_int);
  TORCH_CHECK(first_qsl.dim() == 1 && first_qsl.size(0) == rows + 1 &&
                  first_qsl.scalar_type() == at::kInt,
              "query_start_loc must be int32 [", rows + 1, "], got ", first_qsl.sizes(), " ",
              first_qsl.scalar_type());
  const int32_t* qs = first_qsl.data_ptr<int32_t>();
  const at::Tensor pos = positions.contiguous();
  at::Tensor ids = input_ids.contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  // every position the steps write must lie in its sequence's tables, a sequence's first-step
  // positions must follow one another, and the first tokens lie in the embedding (later steps'
  // tokens are the LM head's columns)
  const int64_t* first = ids.data_ptr<int64_t>();
  TORCH_CHECK(qs[0] == 0 && qs[rows] == num_tokens, "query_start_loc must run from 0 to the ",
              num_tokens, " tokens, got ", qs[0], " .. ", qs[rows]);
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(qs[r + 1] > qs[r], "query_start_loc: sequence ", r, " feeds no token");
    const int64_t last = p[qs[r + 1] - 1];
    for (int64_t t = qs[r]; t < qs[r + 1]; ++t) {
      TORCH_CHECK(p[t] == last - (qs[r + 1] - 1 - t), "positions of sequence ", r,
                  " must be consecutive, got ", p[t], " before its last ", last);
      TORCH_CHECK(first[t] >= 0 && first[t] < vocab, "token ", first[t], " (input ", t,
                  ") is outside the embedding's ", vocab, " rows");
    }
    TORCH_CHECK(p[qs[r]] >= 0 && (last + steps - 1) / block_size < max_blocks, "positions[", r,
                "] = ", last, ": its ", steps, " steps reach past the block table's ",
                max_blocks, " blocks of ", block_size);
  }
  TORCH_CHECK(head.size(0) <= vocab, "the LM head's ", head.size(0),
              " rows exceed the embedding's ", vocab);
  // the first step: every fed token's KV, each sequence's last token's next token (its last
  // row's, where a sequence feeds several)
  const at::Tensor last_rows =
      num_tokens == rows ? at::Tensor() : first_qsl.slice(0, 1).to(at::kLong) - 1;
  at::Tensor slots = at::empty({num_tokens}, cpu_long);
  at::Tensor context_lens = at::empty({rows}, cpu_int);
  int64_t* slot = slots.data_ptr<int64_t>();
  int32_t* ctx = context_lens.data_ptr<int32_t>();
  at::Tensor hidden_rows = at::empty({num_tokens, embedding.size(1)}, embedding.options());
  StageClock clock(stage_ms);
  const auto run_step = [&](const at::Tensor& step_pos, const at::Tensor& qsl, int64_t s) {
    clock.restart();
    const int32_t* starts = qsl.data_ptr<int32_t>();
    const int64_t* sp = step_pos.data_ptr<int64_t>();
    int64_t max_context_len = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = starts[r]; t < starts[r + 1]; ++t) {
        slot[t] = static_cast<int64_t>(table[r * max_blocks + sp[t] / block_size]) * block_size +
                  sp[t] % block_size;
      }
      ctx[r] = static_cast<int32_t>(sp[starts[r + 1] - 1] + 1);
      max_context_len = std::max<int64_t>(max_context_len, ctx[r]);
    }
    const int64_t n = step_pos.size(0);
    at::Tensor hidden = hidden_rows.slice(0, 0, n);
    at::index_select_out(hidden, embedding, 0, ids);
    clock.mark(kStageInputs);
    decode_layers(hidden, step_pos, weights, final_norm, cos_sin_cache, key_caches, value_caches,
                  slots.slice(0, 0, n), tables, context_lens, qsl, max_context_len, num_heads,
                  num_kv_heads, head_size, epsilon, scale, is_neox, packed, stage_ms);
    clock.restart();
    if (n != rows) hidden = hidden.index_select(0, last_rows);  // the first step only
    at::Tensor out = tokens[s];
    linear_argmax(out, hidden, head, head_packed);
    clock.mark(kStageLmHead);
    ids = out;
    if (step_out != nullptr) {
      const auto now = std::chrono::steady_clock::now();
      step_out[s] = std::chrono::duration<double, std::milli>(now - step_start).count();
      step_start = now;
    }
  };
  // later steps: one token a sequence, at the position after its last
  at::Tensor step_pos = num_tokens == rows ? pos.clone() : pos.index_select(0, last_rows);
  at::Tensor one_each = at::arange(rows + 1, cpu_int);
  int64_t* sp = step_pos.data_ptr<int64_t>();
  const auto all_steps = [&] {
    run_step(pos, first_qsl, 0);
    for (int64_t s = 1; s < steps; ++s) {
      for (int64_t r = 0; r < rows; ++r) ++sp[r];
      run_step(step_pos, one_each, s);
    }
  };
  // every step in one team region (decode_layers' own then runs inline) where every linear is
  // this extension's loop: the LM head's loops then go to the team's spinning threads too, and
  // the team starts once a call. On a 16-core host, in turns, batch 1: llama-68m 0.495 against
  // 0.545 ms a step, draft-20m 0.202 / 0.207, SmolLM2-135M 2.541 / 2.511 (RESULTS.md, run 50).
  const auto dtype = embedding.scalar_type();
  if (switched_on("VLLM_CPU_DECODE_TEAM") &&
      linear_rows_in_house(dtype, num_tokens, !packed.empty()) &&
      linear_rows_in_house(dtype, rows, !packed.empty()) &&
      linear_rows_in_house(dtype, rows, head_packed.numel() > 0)) {
    Team::run(all_steps);
  } else {
    all_steps();
  }
}

}  // namespace vllm_cpu
