// Where a CPU decode step's time goes (benchmarks/benchmark_draft.py): with a stage_ms tensor
// given, each stage's wall time in ms is added to its entry (DecodeStage, ops.h); else nothing
// is timed.
#pragma once

#include <torch/all.h>

#include <chrono>
#include <optional>

#include "ops.h"

namespace vllm_cpu {

class StageClock {
 public:
  explicit StageClock(const std::optional<at::Tensor>& stage_ms) {
    if (!stage_ms.has_value()) return;
    TORCH_CHECK(stage_ms->scalar_type() == at::kDouble && stage_ms->is_contiguous() &&
                    stage_ms->numel() == kDecodeStages && stage_ms->device().is_cpu(),
                "stage_ms must be a contiguous CPU float64 tensor of ", kDecodeStages,
                " entries, got ", stage_ms->sizes(), " ", stage_ms->scalar_type());
    ms_ = stage_ms->data_ptr<double>();
    last_ = std::chrono::steady_clock::now();
  }
  // the time since the last mark (or restart) goes to stage
  void mark(DecodeStage stage) {
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
  double* ms_ = nullptr;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace vllm_cpu
