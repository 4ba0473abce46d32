// What a parallel region costs a decode step's small ops on this CPU (cpu_parallel_lab.py):
// the same tiny task (each thread writes its slice of a [rows, cols] fp32 buffer, after reading
// the whole buffer the step before wrote) run n times through
//   0: at::parallel_for (a region per task, as every vllm._C CPU op runs today),
//   1: one thread (the master alone; no handoff between cores but no split either),
//   2: one region for all n tasks, the master handing each task to threads spinning on a
//      counter (a task = one atomic store + each thread's completion count),
//   3: as 2, each thread's completion its own flag (a line of its own, the task's number
//      stored), which the master reads in passes over all of them, instead of every thread
//      incrementing one shared counter (whose line then moves between the cores in turn).
// Returns microseconds per task.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <vector>

namespace {

struct alignas(64) Counter {
  std::atomic<int64_t> v{0};
};

// the task: every cache line of the buffer read (the previous task's writes, by other threads),
// this share's elements rewritten
inline void task_body(float* buf, int64_t n, int64_t begin, int64_t end, int64_t step) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; i += 16) sum += buf[i];
  for (int64_t i = begin; i < end; ++i) buf[i] = buf[i] * 0.5f + sum * 1e-9f + step;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

double run(int64_t mode, int64_t tasks, int64_t elems, int64_t threads) {
  at::set_num_threads(threads);
  std::vector<float> buf(elems, 1.f);
  float* b = buf.data();
  const double t0 = now_us();
  if (mode == 0) {
    for (int64_t s = 0; s < tasks; ++s) {
      at::parallel_for(0, threads, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          task_body(b, elems, elems * t / threads, elems * (t + 1) / threads, s);
        }
      });
    }
  } else if (mode == 1) {
    for (int64_t s = 0; s < tasks; ++s) task_body(b, elems, 0, elems, s);
  } else {  // 2, 3: one region, the master handing out tasks; completion as the mode says
    const bool flags_each = mode == 3;
    Counter gen, done;
    std::vector<Counter> flags(threads);
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      if (tid == 0) {
        for (int64_t s = 0; s < tasks; ++s) {
          done.v.store(0, std::memory_order_relaxed);
          gen.v.store(s + 1, std::memory_order_release);
          task_body(b, elems, 0, elems / nt, s);
          for (;;) {  // 3: a pass over every flag, its loads independent of each other
            int finished = 0;
            if (flags_each) {
              for (int t = 1; t < nt; ++t) {
                finished += flags[t].v.load(std::memory_order_acquire) == s + 1;
              }
            } else {
              finished = static_cast<int>(done.v.load(std::memory_order_acquire));
            }
            if (finished >= nt - 1) break;
            _mm_pause();
          }
        }
        gen.v.store(-1, std::memory_order_release);
      } else {
        int64_t seen = 0;
        for (;;) {
          int64_t g;
          while ((g = gen.v.load(std::memory_order_acquire)) == seen) _mm_pause();
          if (g < 0) break;
          seen = g;
          task_body(b, elems, elems * tid / nt, elems * (tid + 1) / nt, g - 1);
          if (flags_each) {
            flags[tid].v.store(g, std::memory_order_release);
          } else {
            done.v.fetch_add(1, std::memory_order_acq_rel);
          }
        }
      }
    }
  }
  return (now_us() - t0) / tasks;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
