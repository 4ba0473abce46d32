// Where a CPU decode step's time goes (benchmarks/benchmark_draft.py): with a stage_ms tensor
// given, each stage's wall time in ms is added to its entry (DecodeStage, ops.h); else nothing
// is timed.
#pragma once

#include <torch/all.h>

#include <chrono>
#include <optional>

#include "cpu/trace.h"
#include "ops.h"

namespace vllm_cpu {

// The entries of an optional timing output (ms), checked to be a contiguous CPU float64 tensor
// of n; nullptr where none is given.
inline double* ms_entries(const std::optional<at::Tensor>& t, int64_t n, const char* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kDouble && t->dim() == 1 && t->size(0) == n &&
                  t->is_contiguous() && t->device().is_cpu(),
              name, " must be a contiguous CPU float64 tensor of ", n, " entries, got ",
              t->sizes(), " ", t->scalar_type());
  return t->data_ptr<double>();
}

class StageClock {
 public:
  explicit StageClock(const std::optional<at::Tensor>& stage_ms)
      : ms_(ms_entries(stage_ms, kDecodeStages, "stage_ms")) {
    if (ms_ != nullptr) last_ = std::chrono::steady_clock::now();
  }
  // the time since the last mark (or restart) goes to stage
  void mark(DecodeStage stage) {
    trace(kTrMark, stage);
    if (ms_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    ms_[stage] += std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }
  // the time since the last mark goes nowhere (another clock timed it)
  void restart() {
    if (ms_ != nullptr) last_ = std::chrono::steady_clock::now();
  }

 private:
  double* ms_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace vllm_cpu
