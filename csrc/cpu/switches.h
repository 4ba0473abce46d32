// The CPU decode path's 0/1 settings, read at every call, on (1) by default; any other value is
// an error naming it (also linear_amx.cpp's VLLM_CPU_AMX_KEEP_TILES, off by default).
//   VLLM_CPU_DECODE_TEAM: a decode_layers step, or all of a greedy_steps call's steps, in one
//     parallel region, its loops handed to the region's spinning threads (team.h); 0: a region
//     per loop.
//   VLLM_CPU_DECODE_FOLD: rotary and the cache write folded into the attention's loop
//     (rotary_cache_attention_loop), and the norms and silu_and_mul into the packed linears' loops
//     (layer_folds.h) where every linear of the step runs the packed tiles; 0: each its own
//     loop.
//   VLLM_CPU_ATTENTION_TAIL: the folded attention run as the tail of the qkv linear's loop (its
//     threads claim the attention's parts once every qkv chunk is done: team.h's set_tail),
//     where a team runs the step and the attention is not small; 0: a loop of its own.
//   VLLM_CPU_NORM_TAIL: where the norms fold and are shared, each one after a
//     layer's first normalised as the tail of the o or down loop before its linear (each team
//     thread its share of the rows), not by claims and a wait inside the linear's loop.
//   VLLM_CPU_AVX2_TILES: the AVX2 build's bf16 linears of 8-64 rows on register tiles
//     (linear.cpp's tile_avx2); 0: the GEMV's passes (row_all).
//   VLLM_CPU_AVX512_TILES: the AVX-512 build's bf16 linears of 1-64 rows, without AVX512_BF16,
//     on register tiles (linear.cpp's tile_avx512); 0: the GEMV's passes (row_all).
//   VLLM_CPU_FOLD_SHARE: a folded norm's rows normalised once, shared by its linear's threads
//     (each claims rows, then waits for all; layer_folds.h); 0: each thread all rows for itself.
// setting_number reads the numeric ones (VLLM_CPU_DECODE_SPLIT_ELEMS, VLLM_CPU_PACKED_GRAIN_KB).
#pragma once

#include <torch/all.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace vllm_cpu {

// Inside a SettingsScope (one per greedy_steps or decode_layers call, on the calling thread;
// an inner scope uses the outer one) each setting's variable is looked up in the environment
// once, its value kept for the scope's later reads: a batch-8 AMX step reads ~7 settings a
// linear, each getenv a scan of the whole environment (30-50 ns on a 2-core Xeon). Settings
// are still read at every op call, so they can be timed in turns; parsing and its errors stay
// where the setting is read.
class SettingsScope {
 public:
  SettingsScope() {
    if (current() == nullptr) current() = this;
  }
  ~SettingsScope() {
    if (current() == this) current() = nullptr;
  }
  SettingsScope(const SettingsScope&) = delete;
  SettingsScope& operator=(const SettingsScope&) = delete;
  static SettingsScope*& current() {
    thread_local SettingsScope* scope = nullptr;
    return scope;
  }
  const char* get(const char* name) {
    for (int i = 0; i < count_; ++i) {
      if (names_[i] == name || std::strcmp(names_[i], name) == 0) return values_[i];
    }
    const char* v = std::getenv(name);
    if (count_ < kMost) {
      names_[count_] = name;
      values_[count_] = v;
      ++count_;
    }
    return v;
  }

 private:
  static constexpr int kMost = 32;
  const char* names_[kMost];
  const char* values_[kMost];
  int count_ = 0;
};

// The variable `name`'s value (nullptr where unset): the current SettingsScope's, else getenv.
inline const char* setting_value(const char* name) {
  SettingsScope* scope = SettingsScope::current();
  return scope != nullptr ? scope->get(name) : std::getenv(name);
}

inline bool switched_on(const char* name, bool by_default = true) {
  const char* v = setting_value(name);
  if (v == nullptr) return by_default;
  if (std::strcmp(v, "1") == 0) return true;
  TORCH_CHECK(std::strcmp(v, "0") == 0, name, " must be 0 or 1, got '", v, "'");
  return false;
}

// A whole-number setting, read at every call: by_default where unset, else a number from lo to
// hi; anything else is an error naming the setting and what it must be (`must_be`).
inline int64_t setting_number(const char* name, int64_t by_default, int64_t lo, int64_t hi,
                              const char* must_be) {
  const char* v = setting_value(name);
  if (v == nullptr) return by_default;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && n >= lo && n <= hi, name, " must be ", must_be,
              ", got '", v, "'");
  return n;
}

}  // namespace vllm_cpu
