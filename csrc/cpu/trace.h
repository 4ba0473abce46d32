// A timeline of the CPU decode step's threads, for benchmarks/lab/cpu_step_trace.py: where
// VLLM_CPU_TRACE_FILE names a file (read once a process), each thread records time-stamped
// events (the team's hand-overs, the stage marks, a folded norm's rows and wait, a packed
// linear's tiles) into a buffer of its own, and Team::run appends them all to the file after
// its region. Unset, every trace() is one load of a static and a branch.
#pragma once

#include <omp.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace vllm_cpu {

enum TraceEvent : int32_t {
  kTrTeamStart,    // master: a Team::run region begins
  kTrIssue,        // master: a loop (arg: its number) handed to the team
  kTrOwnDone,      // master: its own chunk done
  kTrAllDone,      // master: every worker's flag seen
  kTrSeen,         // worker: the loop (arg) seen
  kTrDone,         // worker: its chunk done
  kTrMark,         // master: a stage clock's mark (arg: the DecodeStage)
  kTrNormMine,     // a folded norm's thread: the rows it claimed done
  kTrNormWait,     // ... and every row done (the wait over)
  kTrTiles,        // a packed linear's thread: its tasks done (before its fold's chunk_done)
  kTrTeamEnd,      // master: the region's step done
  kTrTail,         // a thread: every chunk of a loop with a tail done (its tail begins)
};

// The file named by VLLM_CPU_TRACE_FILE (read once a process), or nullptr (unset or empty).
inline const char* trace_file() {
  static const char* path = [] {
    const char* p = std::getenv("VLLM_CPU_TRACE_FILE");
    return p != nullptr && *p != '\0' ? p : nullptr;
  }();
  return path;
}

struct TraceRecord {
  uint64_t tsc;
  int32_t thread, event;
  int64_t arg;
};

// A thread's records, listed in a registry while the thread lives.
class TraceBuffer {
 public:
  static TraceBuffer& mine() {
    thread_local TraceBuffer buffer;
    return buffer;
  }
  static std::mutex& lock() {
    static std::mutex m;
    return m;
  }
  static std::vector<TraceBuffer*>& all() {
    static std::vector<TraceBuffer*> buffers;
    return buffers;
  }
  std::vector<TraceRecord> records;

 private:
  TraceBuffer() {
    records.reserve(1 << 16);
    const std::lock_guard<std::mutex> g(lock());
    all().push_back(this);
  }
  ~TraceBuffer() {
    const std::lock_guard<std::mutex> g(lock());
    auto& b = all();
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i] == this) {
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
};

inline uint64_t trace_clock() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

inline void trace(TraceEvent event, int64_t arg = 0) {
  if (trace_file() == nullptr) return;
  TraceBuffer::mine().records.push_back(
      {trace_clock(), static_cast<int32_t>(omp_get_thread_num()), event, arg});
}

// Every thread's records appended to the file (one line each: thread event arg tsc), after a
// line "# clock TSC NS" pairing the time-stamp counter with steady_clock's nanoseconds (two such
// lines give the counter's rate); the buffers emptied. Called where no thread records.
inline void trace_flush() {
  if (trace_file() == nullptr) return;
  const std::lock_guard<std::mutex> g(TraceBuffer::lock());
  FILE* f = std::fopen(trace_file(), "a");
  if (f == nullptr) {  // (nothing kept: the buffers do not grow)
    for (TraceBuffer* b : TraceBuffer::all()) b->records.clear();
    return;
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  std::fprintf(f, "# clock %llu %lld\n", static_cast<unsigned long long>(trace_clock()),
               static_cast<long long>(ns));
  for (TraceBuffer* b : TraceBuffer::all()) {
    for (const TraceRecord& r : b->records) {
      std::fprintf(f, "%d %d %lld %llu\n", r.thread, r.event, static_cast<long long>(r.arg),
                   static_cast<unsigned long long>(r.tsc));
    }
    b->records.clear();
  }
  std::fclose(f);
}

}  // namespace vllm_cpu
