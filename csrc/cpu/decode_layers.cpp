// decode_layers on the CPU: every decoder layer of a Llama-family model (Llama, Mistral, SmolLM2,
// Qwen2's q/k/v biases) for a step of few rows, in one call. Per layer: rms_norm, qkv linear,
// rotary, cache write, paged attention, o linear, fused add + rms_norm, gate/up linear,
// silu_and_mul, down linear; then the final norm. The same kernels the per-op path calls, without
// a Python round trip and dispatcher call per op: the step costs its weight bytes. The linears are
// linear_small's (linear_rows: its GEMV or register tiles where they pay, else torch's GEMM), or
// the packed tiles on the weights' packed copies where those are given and pay. With the folds
// (VLLM_CPU_DECODE_FOLD), rotary and the cache write run in the attention's tasks and, on the
// packed tiles, the norms and silu_and_mul in the linears' loops: 5 parallel loops a layer; 4
// where the attention runs as the qkv loop's tail and each norm but the first as the o or down
// loop's (VLLM_CPU_ATTENTION_TAIL, VLLM_CPU_NORM_TAIL: team.h's tails).
#include <cstdlib>
#include <cstring>
#include <optional>

#include "cpu/attention.h"
#include "cpu/layer_folds.h"
#include "cpu/linear.h"
#include "cpu/stage_clock.h"
#include "cpu/switches.h"
#include "cpu/team.h"
#include "cpu/vec.h"
#include "ops.h"

namespace vllm_cpu {
namespace {

constexpr int64_t kTensorsPerLayer = 7;  // ln1, qkv_w, qkv_b, o_w, ln2, gate_up_w, down_w
constexpr int64_t kPackedPerLayer = 4;   // packed qkv_w, o_w, gate_up_w, down_w

// The packed copy of a layer's linear weight (index j of kPackedPerLayer), checked against it;
// nullptr where there is none.
const at::Tensor* packed_of(const std::vector<at::Tensor>& packed, int64_t layer, int64_t j,
                            const at::Tensor& weight) {
  if (packed.empty()) return nullptr;
  const at::Tensor& p = packed[layer * kPackedPerLayer + j];
  check_packed(p, weight);
  return p.numel() > 0 ? &p : nullptr;
}

void check_weight(const at::Tensor& w, int64_t rows, int64_t cols, const at::Tensor& like,
                  const char* name, int64_t layer) {
  TORCH_CHECK(w.dim() == 2 && w.size(0) == rows && w.size(1) == cols && w.is_contiguous() &&
                  w.scalar_type() == like.scalar_type(),
              "layer ", layer, ": ", name, " must be a contiguous [", rows, ", ", cols,
              "] tensor of the hidden state's dtype, got ", w.sizes(), " ", w.scalar_type());
}

// The norms, silu_and_mul and rotary of a decode_layers step split over the threads from
// VLLM_CPU_DECODE_SPLIT_ELEMS elements a thread (read at every call; default kSplitElems; 0:
// the ops' own 32K, as outside decode_layers). On the H200's host (16 threads) a batch-8
// SmolLM2-135M step spent 1.4 ms of 7.3 in these ops, each on one thread (run 23's stage clock).
constexpr int64_t kSplitElems = 2048;
class SmallOpSplit {
 public:
  SmallOpSplit() : saved_(small_op_min_elems()) {
    const int64_t elems =
        setting_number("VLLM_CPU_DECODE_SPLIT_ELEMS", kSplitElems, 0, INT64_MAX,
                       "a count of elements (0: off)");
    if (elems > 0) small_op_min_elems() = elems;
  }
  ~SmallOpSplit() { small_op_min_elems() = saved_; }

 private:
  int64_t saved_;
};

// A tail (team.h's set_tail) for the next linear's loop, where a team runs the step: set just
// before the linear, so that no other loop (an unfolded norm's) takes it; release() after the
// linear: whether its loop ran the tail, clearing one it left pending (a loop run inline).
class LoopTail {
 public:
  LoopTail(Team::Body body, const void* ctx, int64_t items)
      : team_(body != nullptr && items > 0 ? Team::active() : nullptr) {
    if (team_ != nullptr) team_->set_tail(body, ctx, items);
  }
  LoopTail(const LoopTail&) = delete;
  LoopTail& operator=(const LoopTail&) = delete;
  ~LoopTail() { release(); }
  bool release() {
    if (team_ == nullptr) return false;
    const bool ran = !team_->tail_pending();
    team_->clear_tail();
    team_ = nullptr;
    return ran;
  }

 private:
  Team* team_;
};

// A LoopTail whose items are ctx's Method(begin, end).
template <typename C, void (C::*Method)(int64_t, int64_t) const>
LoopTail tail_of(const C* ctx, int64_t items) {
  return LoopTail(
      [](const void* c, int64_t b, int64_t e) { (static_cast<const C*>(c)->*Method)(b, e); },
      ctx, items);
}

// The tails decode_layers gives a linear's loop: the folded attention after qkv, where it is
// not small (VLLM_CPU_ATTENTION_TAIL; a small one runs on the master after the loop), and the
// next fold's shared norm after o and down (VLLM_CPU_NORM_TAIL).
LoopTail attention_tail_of(const AttentionLoop* attention, bool on) {
  if (!on || attention == nullptr || attention->small()) return LoopTail(nullptr, nullptr, 0);
  return tail_of<AttentionLoop, &AttentionLoop::run>(attention, attention->parts());
}
LoopTail norm_tail_of(const LayerFold* fold) {
  if (fold == nullptr) return LoopTail(nullptr, nullptr, 0);
  return tail_of<LayerFold, &LayerFold::normalise>(fold, fold->rows());
}

bool linear_folds_apply(const at::Tensor& hidden, const std::vector<at::Tensor>& weights,
                        const std::vector<at::Tensor>& packed, int64_t num_layers,
                        int64_t rows) {
  if (packed.empty() || !linear_rows_folds(hidden.scalar_type(), rows)) return false;
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int64_t j = 0; j < kPackedPerLayer; ++j) {
      if (packed[l * kPackedPerLayer + j].numel() == 0) return false;
    }
    // gate and up each whole panels (a task computes the same panels of both); a weight of a
    // wrong shape is named by the step's checks
    const at::Tensor& gate_up_w = weights[l * kTensorsPerLayer + 5];
    if (gate_up_w.dim() != 2 || gate_up_w.size(0) % (2 * kPackRows) != 0) return false;
  }
  return true;
}

}  // namespace

void decode_layers(at::Tensor& hidden, const at::Tensor& positions,
                   const std::vector<at::Tensor>& weights, const at::Tensor& final_norm,
                   const at::Tensor& cos_sin_cache, const std::vector<at::Tensor>& key_caches,
                   const std::vector<at::Tensor>& value_caches, const at::Tensor& slot_mapping,
                   const at::Tensor& block_tables, const at::Tensor& context_lens,
                   const at::Tensor& query_start_loc, int64_t max_context_len, int64_t num_heads,
                   int64_t num_kv_heads, int64_t head_size, double epsilon, double scale,
                   bool is_neox, const std::vector<at::Tensor>& packed,
                   const std::optional<at::Tensor>& stage_ms) {
  SettingsScope settings;  // every setting looked up once for the step (or greedy_steps' call)
  StageClock clock(stage_ms);
  SmallOpSplit split;
  const int64_t num_layers = static_cast<int64_t>(key_caches.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kTensorsPerLayer * num_layers &&
                  value_caches.size() == key_caches.size(),
              "decode_layers takes ", kTensorsPerLayer, " weights per layer and one key and value "
              "cache per layer; got ", weights.size(), " weights for ", num_layers, " layers");
  TORCH_CHECK(packed.empty() || static_cast<int64_t>(packed.size()) == kPackedPerLayer * num_layers,
              "decode_layers takes no packed weights or ", kPackedPerLayer, " per layer; got ",
              packed.size(), " for ", num_layers, " layers");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "hidden must be [num_tokens, hidden]");
  const int64_t m = hidden.size(0);
  const bool fold_enabled_now = switched_on("VLLM_CPU_DECODE_FOLD");
  const bool fold = fold_enabled_now && linear_folds_apply(hidden, weights, packed, num_layers, m);
  const bool fold_share = fold && switched_on("VLLM_CPU_FOLD_SHARE");
  const bool fold_attention =
      fold_enabled_now && rotary_cache_attention_applies(query_start_loc, num_heads, num_kv_heads);
  const bool attention_tail = fold_attention && switched_on("VLLM_CPU_ATTENTION_TAIL");
  // the shared norms after the first as the tails of the o and down loops (each team thread
  // its share of the rows: no claims or wait in the linear's loop; without a team, or where
  // the loop runs inline, the fold normalises them as before)
  const bool norm_tail = fold_share && switched_on("VLLM_CPU_NORM_TAIL");
  // the layers and the final norm; the residual's copy and the scratch rows are made inside
  // it as well (made before the team's region, the 2-core machine's SmolLM2-135M forward took
  // 11.01 ms with the team against 10.43 with them inside)
  const auto step = [&] {
    const int64_t q_size = num_heads * head_size, kv_size = num_kv_heads * head_size;
    const auto opts = hidden.options();
    // The residual stream: unfolded, res[0] (the norms write the next layer input into hidden
    // in place); folded, res[cur], the folds writing the next sum into the other one (the
    // linears' threads read res[cur] meanwhile), hidden holding the o and down projections.
    at::Tensor res[2] = {fold ? at::empty_like(hidden) : hidden.clone(), at::Tensor()};
    if (fold) res[1] = at::empty_like(hidden);
    int cur = -1;  // folded: the res holding the stream (-1: none before the first norm)
    at::Tensor x = hidden;  // the current layer input, normalised in place (unfolded)
    at::Tensor attn = at::empty({m, num_heads, head_size}, opts);
    const at::Tensor attn2 = attn.view({m, q_size});
    // the layers' scratch rows: qkv's (every layer's qkv weight has q_size + 2 kv_size rows)
    // and their views made once, gate/up's at the first layer (and again where a layer's
    // sizes differ)
    at::Tensor qkv = at::empty({m, q_size + 2 * kv_size}, opts);
    at::Tensor q = qkv.narrow(1, 0, q_size);
    at::Tensor k = qkv.narrow(1, q_size, kv_size);
    at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size);
    at::Tensor gate_up = at::empty({m, 0}, opts), act;
    // folded and shared: the rows each norm makes once for its linear's threads
    at::Tensor normed = fold_share ? at::empty_like(hidden) : at::Tensor();
    // folded, with the norm tail: the next norm_linear's fold, made before the loop before its
    // linear (o's, down's), which normalises its rows as its tail (normalised: it did)
    std::optional<LayerFold> ahead;
    std::unique_ptr<AttentionLoop> attention;  // folded: the step's attention plan
    // the fold of the next norm_linear (its norm's rows into out's linear; silu into silu_out
    // where given) made in slot: it reads res[cur] and writes the other
    const auto make_fold = [&](std::optional<LayerFold>& slot, const at::Tensor& norm_w,
                               const at::Tensor& out, at::Tensor* silu_out,
                               at::Tensor* shared) -> const LayerFold& {
      const int next = cur == 0 ? 1 : 0;
      return slot.emplace(hidden, cur < 0 ? nullptr : &res[cur], res[next], norm_w, epsilon, out,
                          silu_out, shared);
    };
    const auto fold_ahead = [&](const at::Tensor& norm_w, const at::Tensor& out,
                                at::Tensor* silu_out) -> const LayerFold* {
      return norm_tail ? &make_fold(ahead, norm_w, out, silu_out, &normed) : nullptr;
    };
    // out = input @ w^T (+ b), the loop's tail where given: true where it ran there
    const auto linear_with_tail = [&](at::Tensor& out, const at::Tensor& input,
                                      const at::Tensor& w, const at::Tensor* b,
                                      const at::Tensor* p, const LinearFold* f, LoopTail tail) {
      linear_rows(out, input, w, b, p, f);
      return tail.release();
    };
    // o and down: x = input @ w^T, the next fold's norm as the loop's tail where made ahead
    const auto linear_then_norm = [&](const at::Tensor& input, const at::Tensor& w,
                                      const at::Tensor* p, const LayerFold* next_fold) {
      if (linear_with_tail(x, input, w, nullptr, p, nullptr, norm_tail_of(next_fold))) {
        ahead->set_normalised();
      }
    };
    // out = norm(...) @ w^T (+ b), then act = silu_and_mul(out) where act is given: folded
    // into the linear's loop, or in turn; the attention as the loop's tail where given (true:
    // it ran there; false: the caller runs it)
    const auto norm_linear = [&](const at::Tensor& norm_w, bool first, at::Tensor& out,
                                 const at::Tensor& w, const at::Tensor* b, const at::Tensor* p,
                                 at::Tensor* silu_out, DecodeStage stage,
                                 const AttentionLoop* attention) {
      if (fold) {
        std::optional<LayerFold> own;
        const LayerFold& f = ahead ? *ahead
                                   : make_fold(own, norm_w, out, silu_out,
                                               fold_share ? &normed : nullptr);
        const bool ran = linear_with_tail(out, hidden, w, b, p, &f,
                                          attention_tail_of(attention, attention_tail));
        ahead.reset();
        cur = cur == 0 ? 1 : 0;
        clock.mark(stage);
        return ran;
      }
      if (first) {
        rms_norm(x, res[0], norm_w, epsilon);
      } else {
        fused_add_rms_norm(x, res[0], norm_w, epsilon);
      }
      clock.mark(kStageNorms);
      const bool ran = linear_with_tail(out, x, w, b, p, nullptr,
                                        attention_tail_of(attention, attention_tail));
      clock.mark(stage);
      if (silu_out != nullptr) {
        silu_and_mul(*silu_out, out);
        clock.mark(kStageSilu);
      }
      return ran;
    };
    for (int64_t l = 0; l < num_layers; ++l) {
      const at::Tensor* w = weights.data() + l * kTensorsPerLayer;
      const at::Tensor& qkv_w = w[1];
      const at::Tensor* qkv_b = w[2].numel() > 0 ? &w[2] : nullptr;
      const int64_t h = hidden.size(1), inter = w[6].size(1);
      check_weight(qkv_w, q_size + 2 * kv_size, h, hidden, "qkv weight", l);
      check_weight(w[3], h, q_size, hidden, "o weight", l);
      check_weight(w[5], 2 * inter, h, hidden, "gate_up weight", l);
      check_weight(w[6], h, inter, hidden, "down weight", l);
      TORCH_CHECK(qkv_b == nullptr || (qkv_b->dim() == 1 && qkv_b->size(0) == qkv_w.size(0) &&
                                       qkv_b->scalar_type() == hidden.scalar_type()),
                  "layer ", l, ": qkv bias must be [", qkv_w.size(0), "] of the hidden's dtype");
      at::Tensor kc = key_caches[l], vc = value_caches[l];
      // folded, the attention planned before the first layer's qkv linear (the next layers'
      // the same plan on their caches) and, where it is worth other threads, run as that
      // loop's tail
      if (fold_attention && l == 0) {
        attention = rotary_cache_attention_loop(attn, q, k, v, positions, cos_sin_cache, is_neox,
                                                kc, vc, slot_mapping, block_tables,
                                                context_lens, query_start_loc, max_context_len,
                                                scale);
      } else if (fold_attention) {
        attention->next_layer(kc, vc);
      }
      if (!norm_linear(w[0], l == 0, qkv, qkv_w, qkv_b, packed_of(packed, l, 0, qkv_w), nullptr,
                       kStageQkv, attention.get()) &&
          attention != nullptr) {
        run_attention_loop(*attention);
      }
      if (!fold_attention) {
        rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox);
        at::Tensor k3 = k.view({m, num_kv_heads, head_size});
        at::Tensor v3 = v.view({m, num_kv_heads, head_size});
        reshape_and_cache(k3, v3, kc, vc, slot_mapping);
        at::Tensor q3 = q.view({m, num_heads, head_size});  // read in place: rows qkv's apart
        clock.mark(kStageRotaryCache);
        paged_attention(attn, q3, kc, vc, block_tables, context_lens, query_start_loc,
                        max_context_len, scale);
      }
      clock.mark(kStageAttention);
      const at::Tensor& gate_up_w = w[5];
      if (gate_up.size(1) != gate_up_w.size(0)) {
        gate_up = at::empty({m, gate_up_w.size(0)}, opts);
        act = at::empty({m, gate_up_w.size(0) / 2}, opts);
      }
      linear_then_norm(attn2, w[3], packed_of(packed, l, 1, w[3]),
                       fold_ahead(w[4], gate_up, &act));
      clock.mark(kStageO);
      norm_linear(w[4], false, gate_up, gate_up_w, nullptr, packed_of(packed, l, 2, gate_up_w),
                  &act, kStageGateUp, nullptr);
      // the next layer's first norm ahead (into qkv's rows, made before the layers)
      const LayerFold* next_fold = nullptr;
      if (norm_tail && l + 1 < num_layers) {
        next_fold = fold_ahead(weights[(l + 1) * kTensorsPerLayer], qkv, nullptr);
      }
      linear_then_norm(act, w[6], packed_of(packed, l, 3, w[6]), next_fold);
      clock.mark(kStageDown);
    }
    fused_add_rms_norm(x, res[fold ? cur : 0], final_norm, epsilon);
    clock.mark(kStageNorms);
  };
  // The layers in one parallel region where every linear of the step is this extension's own
  // loop: torch's GEMM (fp32 above 8 rows) inside the region would run on one thread.
  if (switched_on("VLLM_CPU_DECODE_TEAM") &&
      linear_rows_in_house(hidden.scalar_type(), m, !packed.empty())) {
    Team::run(step);
  } else {
    step();
  }
}

}  // namespace vllm_cpu
