// The norms and silu_and_mul of a decode_layers step folded into its packed linears' loops
// (LinearFold, linear.h), so that a layer hands its rows between cores at 5 loops instead of 8
// (norm, qkv, ..., o, norm, gate/up, silu, down). The norm: shared (VLLM_CPU_FOLD_SHARE=1, the
// default), the loop's threads each claim rows (an atomic counter) and normalise them into one
// buffer, writing the residual stream, then wait until every row is done: a row is normalised
// once, on whichever thread claims it. Not shared (0), each thread normalises all the rows for
// itself into a buffer of its own (a few KB, read from cache), the thread whose chunk holds the
// first task writing the residual stream: no waiting, but at 8 rows each thread's 8 rows
// cost more than the wait. silu: each thread of gate/up turns its own columns of gate and up
// into silu(gate) * up. The row functions are the ops' own (row_ops.h): the same bits as the
// unfolded step either way.
#pragma once

#include <vector>

#include "cpu/linear.h"
#include "cpu/row_ops.h"
#include "cpu/team.h"

namespace vllm_cpu {

class LayerFold final : public LinearFold {
  using T = c10::BFloat16;

 public:
  // The norm: x (rows x hidden, contiguous: the last linear's output) added to residual (null
  // at the first layer, where x is the residual stream) into residual_out, normalised by
  // weight. silu (act non-null): act[r, c] = silu(out[r, c]) * out[r, d + c], d = act's
  // columns, out being the linear's output (gate, then up). shared (non-null: rows x hidden,
  // contiguous): the buffer the rows are normalised into once, shared by the loop's threads;
  // null: each thread's own.
  LayerFold(const at::Tensor& x, const at::Tensor* residual, at::Tensor& residual_out,
            const at::Tensor& weight, double epsilon, const at::Tensor& out,
            at::Tensor* act, at::Tensor* shared)
      : shared_(shared != nullptr ? shared->data_ptr<T>() : nullptr), x_(x.data_ptr<T>()),
        residual_(residual != nullptr ? residual->data_ptr<T>() : nullptr),
        residual_out_(residual_out.data_ptr<T>()), weight_(weight.data_ptr<T>()),
        rows_(x.size(0)), hidden_(x.size(1)), epsilon_(static_cast<float>(epsilon)),
        out_(out.data_ptr<T>()), ldo_(out.stride(0)),
        act_(act != nullptr ? act->data_ptr<T>() : nullptr),
        lda_(act != nullptr ? act->stride(0) : 0), d_(act != nullptr ? act->size(1) : 0) {}

  // Shared: rows [begin, end) normalised into the shared buffer (the residual stream written),
  // on the calling thread, by the loop before this fold's linear as its tail (team.h); once
  // every row is (set_normalised), the linear's threads read the buffer without a wait.
  void normalise(int64_t begin, int64_t end) const {
    for (int64_t r = begin; r < end; ++r) norm_row(r, shared_, residual_out_);
  }
  int64_t rows() const { return rows_; }
  void set_normalised() { normalised_ = true; }

  const T* input(bool first, int64_t* ld) const override {
    *ld = hidden_;
    if (normalised_) return shared_;
    if (shared_ != nullptr) {
      for (int64_t r; (r = claimed_.v.fetch_add(1, std::memory_order_relaxed)) < rows_;) {
        norm_row(r, shared_, residual_out_);
        done_.v.fetch_add(1, std::memory_order_release);
      }
      trace(kTrNormMine);
      spin_until([&] { return done_.v.load(std::memory_order_acquire) == rows_; });
      trace(kTrNormWait);
      return shared_;
    }
    thread_local std::vector<T> buf;  // the normalised rows, then the sums (not `first`)
    buf.resize(static_cast<size_t>(2 * rows_ * hidden_));
    T* normed = buf.data();
    T* sums = first ? residual_out_ : normed + rows_ * hidden_;
    for (int64_t r = 0; r < rows_; ++r) norm_row(r, normed, sums);
    return normed;
  }

  bool paired() const override { return act_ != nullptr; }

  void output(int64_t n0, int64_t n1) const override {
    if (act_ == nullptr) return;
    for (int64_t r = 0; r < rows_; ++r) {
      const T* gate = out_ + r * ldo_;
      silu_mul_span(act_ + r * lda_ + n0, gate + n0, gate + d_ + n0, n1 - n0);
    }
  }

 private:
  // Row r normalised into normed; sums gets the residual stream's row (x's at the first layer).
  void norm_row(int64_t r, T* normed, T* sums) const {
    const int64_t o = r * hidden_;
    if (residual_ == nullptr) {
      rms_norm_row(normed + o, x_ + o, weight_, hidden_, epsilon_);
      std::copy(x_ + o, x_ + o + hidden_, sums + o);
    } else {
      add_rms_norm_row(normed + o, sums + o, x_ + o, residual_ + o, weight_, hidden_, epsilon_);
    }
  }

  T* shared_;
  bool normalised_ = false;  // shared: every row normalised already (by the loop before)
  mutable LineCounter claimed_, done_;  // shared: the rows claimed, and those normalised
  const T* x_;
  const T* residual_;
  T* residual_out_;
  const T* weight_;
  int64_t rows_, hidden_;
  float epsilon_;
  const T* out_;
  int64_t ldo_;
  T* act_;
  int64_t lda_, d_;
};

}  // namespace vllm_cpu
