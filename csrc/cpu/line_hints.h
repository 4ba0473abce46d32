// Cache-line hints between a decode step's loops. A loop's rows are written by some cores and
// read by others in the next loop (a linear's output columns by the attention's or the next
// linear's threads, a folded norm's rows by every thread of its linear): at batch 8 every thread
// of a linear reads the whole input, 4-12 KB, from the lines other cores hold in their own
// caches. Two hints, each a 0/1 setting read at every decode_layers call (ScopedLineHints):
//   VLLM_CPU_INPUT_PREFETCH: a packed linear's thread asks for all its input rows into its L2 at
//     once before its first task (the tiles otherwise miss a few lines at a time, k-step by
//     k-step).
//   VLLM_CPU_DEMOTE: a thread pushes the lines it wrote for other threads (a linear's output
//     columns, a folded norm's rows, the attention's output rows) from its own caches to the
//     shared L3 (`cldemote`; a no-op on CPUs without it), so that readers find them there
//     instead of asking the writing core.
// Hints only: the same bits either way.
#pragma once

#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu/switches.h"

namespace vllm_cpu {

struct LineHints {
  bool prefetch_input = false;
  bool demote_output = false;
};

// The hints of the decode step running now (off outside one).
inline LineHints& line_hints() {
  static LineHints hints;
  return hints;
}

// The hints from the environment for a decode_layers call, restored after it.
class ScopedLineHints {
 public:
  ScopedLineHints() : saved_(line_hints()) {
    line_hints() = {switch_or("VLLM_CPU_INPUT_PREFETCH", false),
                    switch_or("VLLM_CPU_DEMOTE", false)};
  }
  ~ScopedLineHints() { line_hints() = saved_; }
  ScopedLineHints(const ScopedLineHints&) = delete;
  ScopedLineHints& operator=(const ScopedLineHints&) = delete;

 private:
  LineHints saved_;
};

// f(line) for every 64-byte line holding bytes [0, bytes) of each of `rows` rows ld_bytes apart
// from base.
template <typename F>
inline void for_each_line(const void* base, int64_t rows, int64_t ld_bytes, int64_t bytes, F&& f) {
  if (bytes <= 0) return;
  const auto start = reinterpret_cast<uintptr_t>(base);
  for (int64_t r = 0; r < rows; ++r) {
    const uintptr_t first = (start + r * ld_bytes) & ~uintptr_t{63};
    const uintptr_t last = start + r * ld_bytes + bytes - 1;
    for (uintptr_t line = first; line <= last; line += 64) f(reinterpret_cast<const char*>(line));
  }
}

// The rows' lines into this core's L2.
inline void prefetch_rows(const void* base, int64_t rows, int64_t ld_bytes, int64_t bytes) {
#if defined(__x86_64__)
  for_each_line(base, rows, ld_bytes, bytes,
                [](const char* line) { _mm_prefetch(line, _MM_HINT_T1); });
#else
  (void)base, (void)rows, (void)ld_bytes, (void)bytes;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("cldemote"))) inline void demote_line(const char* line) {
  _cldemote(const_cast<char*>(line));
}
#else
inline void demote_line(const char*) {}
#endif

// The rows' lines from this core's caches to the shared L3 (written here, read by others next).
inline void demote_rows(const void* base, int64_t rows, int64_t ld_bytes, int64_t bytes) {
  for_each_line(base, rows, ld_bytes, bytes, demote_line);
}

}  // namespace vllm_cpu
