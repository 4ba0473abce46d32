// One parallel region for a whole decode step (decode_layers): the calling thread runs the step
// and hands each parallel loop to the region's other threads, which spin between loops, instead
// of opening an OpenMP region per loop. On a 16-core Xeon host a region per loop cost 5.6 us
// where the loop's own work was 0.3 us, a hand-over to spinning threads 3.4 (benchmarks/lab/
// cpu_parallel_lab.py); a SmolLM2-135M step opens ~5 loops a layer at batch 1 and ~11 at batch
// 8, and at 16 threads its decode_layers took 0.70x (batch 1) and 0.67x (batch 8) the time of a
// region per loop (benchmarks/RESULTS.md, run 30).
//
// parallel_for(begin, end, grain, f) splits [begin, end) as at::parallel_for does (at most one
// contiguous chunk a thread, chunks of at least `grain` items, chunk t to thread t; one chunk
// runs inline) and runs on the active team where the calling thread has one, else through
// at::parallel_for. Every CPU kernel here calls it, so the same kernels run either way.
//
// A tail (set_tail) rides on the next loop the team hands out: once every chunk of that loop is
// done (a flag a thread, which every thread waits on), each thread runs its share of the tail's
// items before it reports done, so that work which needs the whole loop's output (the attention
// after the qkv linear, a norm after o or down) costs no hand-over of its own.
#pragma once

#include <ATen/Parallel.h>
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "cpu/trace.h"

namespace vllm_cpu {

// Waits until ready(): a pause instruction between reads at first; after kSpinsBeforeYield of
// them (~0.1-0.3 ms, far more than a step's serial work between two loops) the core is yielded
// at each read, so that where threads outnumber cores (two engines' processes on one host) a
// spinning thread does not hold the core that the thread it waits for needs.
template <typename Ready>
inline void spin_until(Ready&& ready) {
  constexpr int64_t kSpinsBeforeYield = int64_t{1} << 12;
  for (int64_t spins = 0; !ready(); ++spins) {
    if (spins >= kSpinsBeforeYield) {
      std::this_thread::yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    }
  }
}

// An atomic counter alone on its cache line, so that threads spinning on one do not move the
// lines of others (Team's flags, a fold's row counters).
struct alignas(64) LineCounter {
  std::atomic<int64_t> v{0};
};

class Team {
 public:
  // A type-erased loop body: fn(ctx, begin, end).
  using Body = void (*)(const void* ctx, int64_t begin, int64_t end);

  // Runs step() on the calling thread with a team of at::get_num_threads() threads (one
  // OpenMP region) serving its parallel_for loops; exceptions from step or a loop are rethrown
  // here. Inline, without a team, where there is one thread or a region is already open.
  template <typename Step>
  static void run(const Step& step) {
    const int threads = at::get_num_threads();
    if (threads <= 1 || at::in_parallel_region() || active() != nullptr) {
      step();
      return;
    }
    Team team;
    team.finished_.reset(new LineCounter[threads]);
    team.chunk_done_.reset(new LineCounter[threads]);
    std::exception_ptr error;
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() == 0) {
        team.size_ = omp_get_num_threads();
        active() = &team;
        trace(kTrTeamStart);
        try {
          step();
        } catch (...) {
          error = std::current_exception();
        }
        trace(kTrTeamEnd);
        active() = nullptr;
        team.generation_.v.store(kStop, std::memory_order_release);
      } else {
        team.serve(omp_get_thread_num());
      }
    }
    trace_flush();
    if (error) std::rethrow_exception(error);
  }

  // The team whose step runs on this thread, or nullptr.
  static Team*& active() {
    thread_local Team* team = nullptr;
    return team;
  }

  // The tail of the next loop handed out with more than one chunk: tail(ctx, b, e) over [0,
  // items) in a share a thread, on that loop's threads after all its chunks. A loop run inline
  // (one chunk) leaves it pending: tail_pending() says whether the caller must still run it.
  void set_tail(Body tail, const void* ctx, int64_t items) {
    pending_tail_ = {tail, ctx, items};
  }
  bool tail_pending() const { return pending_tail_.items > 0; }
  void clear_tail() { pending_tail_ = {}; }

  // f over [begin, end) in chunks as at::parallel_for makes them, on the team's threads.
  template <typename F>
  void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
    if (begin >= end) return;
    const int64_t range = end - begin;
    const int64_t chunks = std::min<int64_t>(size_, (range + std::max<int64_t>(grain, 1) - 1) /
                                                        std::max<int64_t>(grain, 1));
    if (chunks <= 1) {
      f(begin, end);
      return;
    }
    body_ = [](const void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); };
    ctx_ = &f;
    begin_ = begin;
    end_ = end;
    chunk_ = (range + chunks - 1) / chunks;
    tail_ = pending_tail_;
    pending_tail_ = {};
    const int64_t loop = ++issued_;
    if (tail_.items > 0) {
      tail_loop_ = loop;
      failed_.store(false, std::memory_order_relaxed);
    }
    trace(kTrIssue, loop);
    generation_.v.store(loop, std::memory_order_release);
    active() = nullptr;  // a loop inside this chunk runs inline (as in at::parallel_for)
    run_chunk(0);
    run_tail(0);
    trace(kTrOwnDone, loop);
    active() = this;
    // each thread's flag, read in passes over all of them (their loads independent): a shared
    // counter that every thread increments moves its line between the cores once per thread
    // (benchmarks/lab/cpu_parallel_lab.py, "a done flag a thread")
    spin_until([&] {
      int done = 0;
      for (int t = 1; t < size_; ++t) {
        done += finished_[t].v.load(std::memory_order_acquire) == loop;
      }
      return done == size_ - 1;
    });
    trace(kTrAllDone, loop);
    if (loop_error_) {
      std::exception_ptr e = loop_error_;
      loop_error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  static constexpr int64_t kStop = -1;

  Team() = default;

  // A worker: runs its chunk of each loop the master issues until the master stops the team.
  void serve(int tid) {
    int64_t seen = 0;
    for (;;) {
      int64_t g = seen;
      spin_until([&] { return (g = generation_.v.load(std::memory_order_acquire)) != seen; });
      if (g == kStop) return;
      seen = g;
      trace(kTrSeen, g);
      run_chunk(tid);
      run_tail(tid);
      trace(kTrDone, g);
      finished_[tid].v.store(g, std::memory_order_release);
    }
  }

  void run_chunk(int tid) {
    const int64_t b = begin_ + tid * chunk_;
    if (b >= end_) return;
    try {
      body_(ctx_, b, std::min(end_, b + chunk_));
    } catch (...) {
      record_error();
    }
  }

  // The loop's tail, if it has one: this thread's flag set (its chunk done), a wait until every
  // thread's is, then this thread's share of the items, split as parallel_for splits a loop of
  // grain 1 (the threads start together, so equal shares; none after a chunk failed: the tail
  // reads the chunks' output).
  void run_tail(int tid) {
    if (tail_.items == 0) return;
    // each thread's flag, read by every thread: one counter that every thread increments while
    // the others read it moved its line between the cores ~3 us a loop on a 16-core host
    // (benchmarks/lab/cpu_step_trace.py, run 63)
    chunk_done_[tid].v.store(tail_loop_, std::memory_order_release);
    spin_until([&] {
      int done = 0;
      for (int t = 0; t < size_; ++t) {
        done += chunk_done_[t].v.load(std::memory_order_acquire) == tail_loop_;
      }
      return done == size_;
    });
    trace(kTrTail);
    const int64_t share = (tail_.items + size_ - 1) / size_;
    const int64_t b = tid * share;
    if (b >= tail_.items || failed_.load(std::memory_order_relaxed)) return;
    try {
      tail_.body(tail_.ctx, b, std::min(tail_.items, b + share));
    } catch (...) {
      record_error();
    }
  }

  void record_error() {
    failed_.store(true, std::memory_order_relaxed);
    const std::lock_guard<std::mutex> lock(error_mutex_);
    if (!loop_error_) loop_error_ = std::current_exception();
  }

  struct Tail {
    Body body = nullptr;
    const void* ctx = nullptr;
    int64_t items = 0;
  };

  LineCounter generation_;
  std::unique_ptr<LineCounter[]> finished_;  // a thread's last loop done, one line each
  int64_t issued_ = 0;
  int size_ = 1;
  Body body_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;
  Tail pending_tail_, tail_;  // the next loop's tail; the loop's own
  int64_t tail_loop_ = 0;  // the loop whose tail runs (its number: what the flags hold)
  std::unique_ptr<LineCounter[]> chunk_done_;  // a thread's last tail loop with its chunk done
  std::atomic<bool> failed_{false};  // a chunk or tail item of the loop threw
  std::mutex error_mutex_;
  std::exception_ptr loop_error_;
};

// at::parallel_for's split of [begin, end), on the calling thread's team where it has one.
template <typename F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  Team* team = Team::active();
  if (team != nullptr) {
    team->parallel_for(begin, end, grain, f);
  } else {
    at::parallel_for(begin, end, grain, f);
  }
}

}  // namespace vllm_cpu
