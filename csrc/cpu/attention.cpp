// paged_attention on the CPU: each task is (sequence, kv head, chunk of query tokens); it reads
// each cached K and V row once for all the query heads of its GQA group (softmax(q k^T) v).
// rotary_cache_attention_loop (decode_layers): the same tasks rotate their own query and new key
// heads and write their new keys and values into the caches first, in the same loop.
#include <atomic>
#include <limits>
#include <memory>
#include <vector>

#include "core/checks.h"
#include "cpu/attention.h"
#include "cpu/new_tokens.h"
#include "cpu/team.h"
#include "cpu/vec.h"
#include "ops.h"

namespace vllm_cpu {
namespace {

// Query rows handled per task, so scores stay within [kMaxRows, context_len] floats.
constexpr int64_t kMaxRows = 64;
// Keys per part at least, where a decode task is split across threads.
constexpr int64_t kMinPartKeys = 64;
// How far ahead of the key being scored its successors' cache rows are prefetched.
constexpr int64_t kPrefetchKeys = 32;

struct Task {
  int64_t seq, kv_head, q_begin, q_end;  // query tokens [q_begin, q_end) of sequence seq
};

// One part of a decode task's keys, [k_begin, k_end) (a task split so that a step of few
// sequences and KV heads still spreads over the threads); partial: its rows' unnormalised
// results, HEAD_SIZE + 2 floats a row.
struct Part {
  int64_t task, k_begin, k_end;
  float* partial;
};

// The step's new tokens, where the attention's tasks rotate and cache them themselves: their
// query, key and value rows as the qkv linear left them (not rotated), row strides apart.
template <typename T>
struct NewTokens {
  const T* query;
  const T* key;
  const T* value;
  int64_t k_stride, v_stride;
  const int64_t* positions;
  const int64_t* slots;
  const T* cos_sin;  // [max_position, rot_dim]: cos then sin
  int64_t rot_dim;
  bool is_neox;
  T* key_cache;
  T* value_cache;
};

template <typename T, int HEAD_SIZE>
struct AttentionTask {
  static constexpr int kVecs = HEAD_SIZE / kVecSize;
  static_assert(HEAD_SIZE % kVecSize == 0, "head size must be a multiple of the vector width");

  const T* query;          // [num_tokens, num_heads, HEAD_SIZE], tokens q_stride elements apart
  const T* key_cache;      // [num_blocks, num_kv_heads, block_size, HEAD_SIZE]
  const T* value_cache;    // same
  const int* block_table;  // this sequence's row of block_tables
  T* out;                  // [num_tokens, num_heads, HEAD_SIZE]
  int64_t num_heads, num_kv_heads, block_size;
  int block_shift;  // log2(block_size): a key's block and row by shift and mask, not division
  float scale;
  int64_t q_stride;

  // Row r of a task (token r / group, group member r % group) is head kv_head * group + r %
  // group of token q_start + q_begin + r / group: row_offset is its element offset in the
  // output, query_at its query (tokens q_stride elements apart).
  int64_t row_token(const Task& task, int64_t q_start, int64_t group, int64_t r) const {
    return q_start + task.q_begin + r / group;
  }
  int64_t row_head(const Task& task, int64_t group, int64_t r) const {
    return task.kv_head * group + r % group;
  }
  int64_t row_offset(const Task& task, int64_t q_start, int64_t group, int64_t r) const {
    return (row_token(task, q_start, group, r) * num_heads + row_head(task, group, r)) * HEAD_SIZE;
  }
  const T* query_at(const Task& task, int64_t q_start, int64_t group, int64_t r) const {
    return query + row_token(task, q_start, group, r) * q_stride +
           row_head(task, group, r) * HEAD_SIZE;
  }

  const T* cache_row(const T* cache, int64_t kv_head, int64_t pos) const {
    const int64_t block = block_table[pos >> block_shift];
    return cache +
           ((block * num_kv_heads + kv_head) * block_size + (pos & (block_size - 1))) * HEAD_SIZE;
  }

  // Cache row pos of a KV head towards L2 ahead of its use: a sequence's blocks are scattered
  // pages, where the hardware prefetchers stop (2 cores, the engine's draft-20m batch-8
  // attention 0.29 -> 0.22 ms, unpaired; 32, 64 or 128 keys ahead measured alike).
  void prefetch_row(const T* cache, int64_t kv_head, int64_t pos) const {
    const char* row = reinterpret_cast<const char*>(cache_row(cache, kv_head, pos));
    for (size_t b = 0; b < HEAD_SIZE * sizeof(T); b += 64) __builtin_prefetch(row + b, 0, 2);
  }
  void prefetch_rows(const T* cache, int64_t kv_head, int64_t j, int64_t n, int64_t end) const {
    for (int64_t i = j; i < std::min(j + n, end); ++i) prefetch_row(cache, kv_head, i);
  }

  // The task's query heads of its tokens, rotated, into buf (laid out as query; the kernel then
  // reads them there): each part of a split task rotates its own copy.
  void rotate_queries(const Task& task, int64_t q_start, const NewTokens<T>& nt, T* buf) const {
    const int64_t group = num_heads / num_kv_heads;
    for (int64_t i = q_start + task.q_begin; i < q_start + task.q_end; ++i) {
      const T* cos = nt.cos_sin + nt.positions[i] * nt.rot_dim;
      for (int64_t h = task.kv_head * group; h < (task.kv_head + 1) * group; ++h) {
        const int64_t at = i * q_stride + h * HEAD_SIZE;
        std::copy(nt.query + at, nt.query + at + HEAD_SIZE, buf + at);
        rotate_head(buf + at, cos, cos + nt.rot_dim / 2, nt.rot_dim, nt.is_neox);
      }
    }
  }

  // The task's tokens' keys (rotated) and values of its KV head into their cache slots, as
  // rotary_embedding then reshape_and_cache write them.
  void cache_new_tokens(const Task& task, int64_t q_start, const NewTokens<T>& nt) const {
    for (int64_t i = q_start + task.q_begin; i < q_start + task.q_end; ++i) {
      const int64_t slot = nt.slots[i];
      if (slot < 0) continue;  // a padding token
      const int64_t row = ((slot / block_size) * num_kv_heads + task.kv_head) * block_size +
                          (slot & (block_size - 1));
      T* k = nt.key_cache + row * HEAD_SIZE;
      const T* cos = nt.cos_sin + nt.positions[i] * nt.rot_dim;
      std::copy_n(nt.key + i * nt.k_stride + task.kv_head * HEAD_SIZE, HEAD_SIZE, k);
      rotate_head(k, cos, cos + nt.rot_dim / 2, nt.rot_dim, nt.is_neox);
      std::copy_n(nt.value + i * nt.v_stride + task.kv_head * HEAD_SIZE, HEAD_SIZE,
                  nt.value_cache + row * HEAD_SIZE);
    }
  }

  // Row r's scores (its first first_visible + r / group) -> exp(s - max), unnormalised;
  // inv_sum[r] = 1 / their sum; row_max[r] = the max, where asked.
  static void softmax_rows(float* scores, int64_t rows, int64_t max_visible, int64_t first_visible,
                           int64_t group, float* inv_sum, float* row_max = nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      float* s = scores + r * max_visible;
      const int64_t n = first_visible + r / group;
      // the max a vector at a time (a scalar max's dependency chain took a fifth of a 7-row
      // GQA task's time); the tail's lanes padded with -inf
      const float neg_inf = -std::numeric_limits<float>::infinity();
      fVec vmax(neg_inf);
      for_each_vec(n, [&](int64_t j, int w) {
        fVec x = fVec::loadu(s + j, w);
        if (w < kVecSize) x = fVec::set(fVec(neg_inf), x, w);
        vmax = at::vec::maximum(vmax, x);
      });
      const float max_score = at::vec::vec_reduce_all<float>(
          [](const fVec& a, const fVec& b) { return at::vec::maximum(a, b); }, vmax);
      if (row_max != nullptr) row_max[r] = max_score;
      fVec sum(0.f);
      const fVec m(max_score);
      for_each_vec(n, [&](int64_t j, int w) {
        fVec e = (load_any(s + j, w) - m).exp();
        if (w < kVecSize) e = fVec::set(fVec(0.f), e, w);
        store_any(s + j, e, w);
        sum = sum + e;
      });
      inv_sum[r] = 1.f / at::vec::vec_reduce_all<float>(
                             [](const fVec& a, const fVec& b) { return a + b; }, sum);
    }
  }

#ifdef CPU_CAPABILITY_AVX512
  // Cache rows j .. j + 15 of the task's KV head (of cache: the keys or the values), in fp32,
  // into keys (HEAD_SIZE floats each).
  void load_rows_fp32(const T* cache, const Task& task, int64_t j, float* keys) const {
    for (int b = 0; b < 16; ++b) {
      const T* src = cache_row(cache, task.kv_head, j + b);
      for (int v = 0; v < kVecs; ++v) {
        load_float(src + v * kVecSize).store(keys + b * HEAD_SIZE + v * kVecSize);
      }
    }
  }

  // dst[b] = q . key b of a block (load_rows_fp32), b < 16: the 16 dot products' lanes added in
  // one reduction tree instead of a horizontal reduction per key (paired on 2-core Zen 4,
  // SmolLM2's heads, 256 keys: a decode step 1.09x, a 5-token verification 1.13x, batch 8
  // even).
  static void score_block(const fVec* q, const float* keys, float* dst) {
    __m512 dots[16];
    for (int b = 0; b < 16; ++b) {
      const float* k = keys + b * HEAD_SIZE;
      fVec dot = q[0] * fVec::loadu(k);
      for (int v = 1; v < kVecs; ++v) {
        dot = at::vec::fmadd(q[v], fVec::loadu(k + v * kVecSize), dot);
      }
      dots[b] = dot;
    }
    fVec(reduce16(dots)).store(dst);
  }
#endif

  // acc[r] += sum_j p[r, j] v_j over the keys every row sees (j < first_visible), 16 at a time:
  // their V rows in fp32 once (load_rows_fp32), then each row's weighted sum in registers, for
  // a task of more rows than run_rows keeps in registers (the accumulators were loaded and
  // stored for every key and row: Qwen2.5-0.5B's 7-row GQA groups at batch 8 spent 3x the
  // attention's KV bytes in them). Returns the first key left (k0 without AVX-512).
  int64_t pv_blocks(const Task& task, int64_t k0, int64_t k1, int64_t first_visible,
                    int64_t rows, int64_t width, const float* scores, float* acc) const {
    int64_t j = k0;
#ifdef CPU_CAPABILITY_AVX512
    const int64_t seen_by_all = std::min(k1, first_visible);
    float values[16 * HEAD_SIZE];
    for (; j + 16 <= seen_by_all; j += 16) {
      load_rows_fp32(value_cache, task, j, values);
      for (int64_t r = 0; r < rows; ++r) {
        float* a = acc + r * HEAD_SIZE;
        const float* p = scores + r * width + j - k0;
        fVec sum[kVecs];
        for (int v = 0; v < kVecs; ++v) sum[v] = fVec::loadu(a + v * kVecSize);
        for (int b = 0; b < 16; ++b) {
          const fVec w(p[b]);
          for (int v = 0; v < kVecs; ++v) {
            sum[v] = at::vec::fmadd(w, fVec::loadu(values + b * HEAD_SIZE + v * kVecSize), sum[v]);
          }
        }
        for (int v = 0; v < kVecs; ++v) sum[v].store(a + v * kVecSize);
      }
    }
#endif
    return j;
  }

  // The scores of the keys every row sees (j < first_visible), 16 at a time (score_block):
  // scores[r * width + j - k0] for rows r < rows and j from k0 up to the returned key, where the
  // per-key loop takes over (k0 without AVX-512). query_row(r, out): row r's scaled query.
  template <typename QueryRow>
  int64_t score_blocks(const Task& task, int64_t k0, int64_t k1, int64_t first_visible,
                       int64_t rows, int64_t width, float* scores, QueryRow&& query_row) const {
    int64_t j = k0;
#ifdef CPU_CAPABILITY_AVX512
    const int64_t seen_by_all = std::min(k1, first_visible);
    float keys[16 * HEAD_SIZE];
    prefetch_rows(key_cache, task.kv_head, j, kPrefetchKeys, k1);
    for (; j + 16 <= seen_by_all; j += 16) {
      // with each key, the key kPrefetchKeys on and this key's value (for the weighted sums
      // that follow) are requested: spread among the conversions, where a burst of 64 line
      // requests ahead of them had the core compute and fetch in turns (2 cores, SmolLM2-135M's
      // batch-8 attention over 30 layers with its caches out of the CPU's caches, as between a
      // step's layers: 3.9-4.1 -> 2.3-2.5 ms, benchmarks/lab/cpu_attention_cold.py). Written
      // out here: the same prefetches from a callback of load_rows_fp32 measured as slow as
      // the burst.
      for (int b = 0; b < 16; ++b) {
        if (j + kPrefetchKeys + b < k1) {
          prefetch_row(key_cache, task.kv_head, j + kPrefetchKeys + b);
        }
        prefetch_row(value_cache, task.kv_head, j + b);
        const T* src = cache_row(key_cache, task.kv_head, j + b);
        for (int v = 0; v < kVecs; ++v) {
          load_float(src + v * kVecSize).store(keys + b * HEAD_SIZE + v * kVecSize);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        fVec q[kVecs];
        query_row(r, q);
        score_block(q, keys, scores + r * width + j - k0);
      }
    }
#endif
    return j;
  }

  // A task of R <= 4 rows (a decode step's GQA group, or a short verification with one KV
  // head per query head): the scaled queries and the weighted sums stay in registers over all
  // keys, instead of being reloaded (and the sums stored back) for every key. part: one part
  // of a decode task's keys, [part->k_begin, part->k_end), whose unnormalised result (each
  // row's max score, sum of exponentials and weighted sum of values) goes to part->partial for
  // merge_parts; null: every key, the normalised result into out.
  template <int R>
  void run_rows(const Task& task, int64_t q_start, int64_t q_len, int64_t context_len,
                std::vector<float>& scores, const Part* part = nullptr) const {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t first_visible = context_len - q_len + task.q_begin + 1;
    const int64_t max_visible = first_visible + (task.q_end - task.q_begin) - 1;
    // keys [k0, k1); a part's rows (one decode token) all see every key of it
    const int64_t k0 = part != nullptr ? part->k_begin : 0;
    const int64_t k1 = part != nullptr ? part->k_end : max_visible;
    const int64_t width = k1 - k0;
    fVec q[R][kVecs];
    for (int r = 0; r < R; ++r) {
      const T* src = query_at(task, q_start, group, r);
      for (int v = 0; v < kVecs; ++v) q[r][v] = load_float(src + v * kVecSize) * fVec(scale);
    }
    // key j is seen by rows first_row(j).. (causal among the task's tokens); a cache row in fp32
    auto first_row = [&](int64_t j) -> int64_t {
      return j < first_visible ? 0 : (j - first_visible + 1) * group;
    };
    auto load_row = [&](const T* cache, int64_t j, fVec* dst) {
      const T* src = cache_row(cache, task.kv_head, j);
      for (int v = 0; v < kVecs; ++v) dst[v] = load_float(src + v * kVecSize);
    };
    scores.resize(R * width);
    int64_t j = score_blocks(task, k0, k1, first_visible, R, width, scores.data(),
                             [&](int64_t r, fVec* out) {
                               for (int v = 0; v < kVecs; ++v) out[v] = q[r][v];
                             });
    for (; j < k1; ++j) {
      fVec kv[kVecs];
      load_row(key_cache, j, kv);
      const int64_t seen_from = first_row(j);
      for (int r = 0; r < R; ++r) {  // whole range: the loop unrolls, q stays in registers
        if (r < seen_from) continue;
        fVec dot = q[r][0] * kv[0];
        for (int v = 1; v < kVecs; ++v) dot = at::vec::fmadd(q[r][v], kv[v], dot);
        scores[r * width + j - k0] = at::vec::vec_reduce_all<float>(
            [](const fVec& a, const fVec& b) { return a + b; }, dot);
      }
    }
    float inv_sum[R], row_max[R];
    softmax_rows(scores.data(), R, width, part != nullptr ? width : first_visible, group,
                 inv_sum, row_max);
    fVec acc[R][kVecs];
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < kVecs; ++v) acc[r][v] = fVec(0.f);
    }
    for (int64_t j = k0; j < k1; ++j) {
      fVec vv[kVecs];
      load_row(value_cache, j, vv);
      const int64_t seen_from = first_row(j);
      for (int r = 0; r < R; ++r) {
        if (r < seen_from) continue;
        const fVec p(scores[r * width + j - k0]);
        for (int v = 0; v < kVecs; ++v) acc[r][v] = at::vec::fmadd(p, vv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r) {
      if (part != nullptr) {  // [max, sum, HEAD_SIZE weighted sums] per row
        float* dst = part->partial + r * (HEAD_SIZE + 2);
        dst[0] = row_max[r];
        dst[1] = 1.f / inv_sum[r];
        for (int v = 0; v < kVecs; ++v) acc[r][v].store(dst + 2 + v * kVecSize);
        continue;
      }
      T* o = out + row_offset(task, q_start, group, r);
      const fVec inv(inv_sum[r]);
      for (int v = 0; v < kVecs; ++v) store_float(o + v * kVecSize, acc[r][v] * inv);
    }
  }

  // The parts of a decode task merged into its rows of out: each part's sums rescaled to the
  // rows' overall max score (exp(m_p - m)), added, normalised.
  void merge_parts(const Task& task, int64_t q_start, const Part* parts, int64_t num_parts) const {
    const int64_t group = num_heads / num_kv_heads;
    for (int64_t r = 0; r < group; ++r) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < num_parts; ++p) {
        m = std::max(m, parts[p].partial[r * (HEAD_SIZE + 2)]);
      }
      float sum = 0.f;
      fVec acc[kVecs];
      for (int v = 0; v < kVecs; ++v) acc[v] = fVec(0.f);
      for (int64_t p = 0; p < num_parts; ++p) {
        const float* src = parts[p].partial + r * (HEAD_SIZE + 2);
        const float w = std::exp(src[0] - m);
        sum += w * src[1];
        for (int v = 0; v < kVecs; ++v) {
          acc[v] = at::vec::fmadd(fVec(w), fVec::loadu(src + 2 + v * kVecSize), acc[v]);
        }
      }
      T* o = out + row_offset(task, q_start, group, r);
      const fVec inv(1.f / sum);
      for (int v = 0; v < kVecs; ++v) store_float(o + v * kVecSize, acc[v] * inv);
    }
  }

  // Rows r = (token i, group member g) -> head kv_head * group + g; row r of a token sees keys
  // [0, visible(i)) where visible(i) = context_len - q_len + i + 1 (causal among the new tokens).
  // part: one part of a decode task's keys, into part->partial (see run_rows).
  void run(const Task& task, int64_t q_start, int64_t q_len, int64_t context_len,
           std::vector<float>& q_rows, std::vector<float>& scores, std::vector<float>& acc,
           const Part* part = nullptr) const {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t num_tok = task.q_end - task.q_begin, rows = num_tok * group;
    switch (kVecs <= 8 ? rows : 0) {  // register-held rows while they fit (head size <= 128)
      case 1: return run_rows<1>(task, q_start, q_len, context_len, scores, part);
      case 2: return run_rows<2>(task, q_start, q_len, context_len, scores, part);
      case 3: return run_rows<3>(task, q_start, q_len, context_len, scores, part);
      case 4: return run_rows<4>(task, q_start, q_len, context_len, scores, part);
      default: break;
    }
    const int64_t first_visible = context_len - q_len + task.q_begin + 1;
    const int64_t max_visible = first_visible + num_tok - 1;
    // keys [k0, k1); a part's rows (one decode token) all see every key of it
    const int64_t k0 = part != nullptr ? part->k_begin : 0;
    const int64_t k1 = part != nullptr ? part->k_end : max_visible;
    const int64_t width = k1 - k0;
    q_rows.resize(rows * HEAD_SIZE);  // scaled queries in fp32
    scores.resize(rows * width);
    acc.assign(rows * HEAD_SIZE, 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      const T* q = query_at(task, q_start, group, r);
      float* dst = q_rows.data() + r * HEAD_SIZE;
      for (int v = 0; v < kVecs; ++v) {
        (load_float(q + v * kVecSize) * fVec(scale)).store(dst + v * kVecSize);
      }
    }
    // scores[r, j] = q_r . k_j for every visible j; each K row is loaded once.
    int64_t j = score_blocks(task, k0, k1, first_visible, rows, width, scores.data(),
                             [&](int64_t r, fVec* out) {
                               const float* src = q_rows.data() + r * HEAD_SIZE;
                               for (int v = 0; v < kVecs; ++v) {
                                 out[v] = fVec::loadu(src + v * kVecSize);
                               }
                             });
    for (; j < k1; ++j) {
      const T* k = cache_row(key_cache, task.kv_head, j);
      fVec kv[kVecs];
      for (int v = 0; v < kVecs; ++v) kv[v] = load_float(k + v * kVecSize);
      const int64_t first_row = j < first_visible ? 0 : (j - first_visible + 1) * group;
      for (int64_t r = first_row; r < rows; ++r) {
        const float* q = q_rows.data() + r * HEAD_SIZE;
        fVec dot = fVec::loadu(q) * kv[0];
        for (int v = 1; v < kVecs; ++v) {
          dot = at::vec::fmadd(fVec::loadu(q + v * kVecSize), kv[v], dot);
        }
        scores[r * width + j - k0] = at::vec::vec_reduce_all<float>(
            [](const fVec& a, const fVec& b) { return a + b; }, dot);
      }
    }
    // softmax over each row's visible prefix; acc keeps the unnormalised weighted sum.
    std::vector<float> inv_sum(rows), row_max(rows);
    softmax_rows(scores.data(), rows, width, part != nullptr ? width : first_visible, group,
                 inv_sum.data(), row_max.data());
    // acc[r] += p[r, j] * v_j; each V row is loaded once: 16 at a time into fp32 where every
    // row sees them (pv_blocks), then one by one.
    for (int64_t j = pv_blocks(task, k0, k1, first_visible, rows, width, scores.data(),
                               acc.data());
         j < k1; ++j) {
      const T* v_row = cache_row(value_cache, task.kv_head, j);
      fVec vv[kVecs];
      for (int v = 0; v < kVecs; ++v) vv[v] = load_float(v_row + v * kVecSize);
      const int64_t first_row = j < first_visible ? 0 : (j - first_visible + 1) * group;
      for (int64_t r = first_row; r < rows; ++r) {
        const fVec p(scores[r * width + j - k0]);
        float* a = acc.data() + r * HEAD_SIZE;
        for (int v = 0; v < kVecs; ++v) {
          at::vec::fmadd(p, vv[v], fVec::loadu(a + v * kVecSize)).store(a + v * kVecSize);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = acc.data() + r * HEAD_SIZE;
      if (part != nullptr) {  // [max, sum, HEAD_SIZE weighted sums] per row
        float* dst = part->partial + r * (HEAD_SIZE + 2);
        dst[0] = row_max[r];
        dst[1] = 1.f / inv_sum[r];
        std::copy(a, a + HEAD_SIZE, dst + 2);
        continue;
      }
      T* o = out + row_offset(task, q_start, group, r);
      const fVec inv(inv_sum[r]);
      for (int v = 0; v < kVecs; ++v) {
        store_float(o + v * kVecSize, fVec::loadu(a + v * kVecSize) * inv);
      }
    }
  }
};

// A call's tasks and their parts, made before any of them runs (from the sequences' lengths
// and block tables, not the query's values), then run over parts [begin, end) on any threads.
// nt: the step's new tokens, rotated and cached by the tasks themselves (every sequence's
// tokens one task: rotary_cache_attention_loop checks); null: already in query and the caches.
template <typename T, int HEAD_SIZE>
class AttentionPlan final : public AttentionLoop {
 public:
  AttentionPlan(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                const at::Tensor& value_cache, const at::Tensor& block_tables,
                const at::Tensor& context_lens, const at::Tensor& query_start_loc, double scale,
                const NewTokens<T>* nt)
      : kernel_{query.data_ptr<T>(), key_cache.data_ptr<T>(), value_cache.data_ptr<T>(), nullptr,
                out.data_ptr<T>(), query.size(1), key_cache.size(1), key_cache.size(2),
                0, static_cast<float>(scale), query.stride(0)},
        ctx_(context_lens.data_ptr<int>()), qsl_(query_start_loc.data_ptr<int>()),
        tables_(block_tables.data_ptr<int>()), max_blocks_(block_tables.size(1)),
        rotated_elems_(query.size(0) * query.stride(0)), has_nt_(nt != nullptr),
        key_layout_(key_cache), value_layout_(value_cache) {
    if (nt != nullptr) nt_ = *nt;
    const int64_t num_seqs = context_lens.size(0);
    const int64_t num_heads = query.size(1), num_kv_heads = key_cache.size(1);
    const int64_t group = num_heads / num_kv_heads;
    const int64_t max_tokens_per_task = std::max<int64_t>(1, kMaxRows / group);
    const int* ctx = ctx_;
    const int* qsl = qsl_;
    const int64_t block_size = key_cache.size(2);
    TORCH_CHECK(block_size > 0 && (block_size & (block_size - 1)) == 0,
                "paged_attention on the CPU takes a power-of-two block size, got ", block_size);
    kernel_.block_shift = __builtin_ctzll(static_cast<uint64_t>(block_size));
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t q_len = qsl[s + 1] - qsl[s];
      TORCH_CHECK(q_len >= 0 && qsl[s + 1] <= query.size(0), "query_start_loc is not a valid ",
                  "non-decreasing offset list into query's ", query.size(0),
                  " tokens at sequence ", s);
      TORCH_CHECK(ctx[s] >= q_len && ctx[s] <= max_blocks_ * block_size, "context_lens[", s,
                  "] = ", ctx[s], " must cover the sequence's ", q_len, " query tokens and fit its ",
                  max_blocks_, " block-table entries of ", block_size, " tokens");
      for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
        for (int64_t b = 0; b < q_len; b += max_tokens_per_task) {
          tasks_.push_back({s, kvh, b, std::min(q_len, b + max_tokens_per_task)});
        }
      }
    }
    // One thread for a small call: below ~64K multiply-adds and 32 KB of K/V together, waking
    // the pool costs more than it saves. Above, a task per thread: the K/V rows of a decode
    // step's sequences are cache misses (a layer's cache does not stay in cache between steps),
    // so even a few thousand keys are worth spreading (a 1M multiply-add bound kept a batch of 8
    // two-head sequences on one thread: 0.43 ms per layer on 2 cores, most of the draft's step).
    int64_t macs = 0, kv_bytes = 0;
    for (const Task& t : tasks_) {
      macs += static_cast<int64_t>(ctx[t.seq]) * (t.q_end - t.q_begin) * group * HEAD_SIZE;
      kv_bytes += static_cast<int64_t>(ctx[t.seq]) * 2 * HEAD_SIZE * static_cast<int64_t>(sizeof(T));
    }
    small_ = macs < (int64_t{1} << 16) && kv_bytes < (int64_t{32} << 10);
    // Fewer tasks than twice the threads (a decode step of few sequences and KV heads: SmolLM2's
    // 3 KV heads at batch 1 kept one of 2 threads idle half the attention's time, and would keep
    // 13 of 16 idle on the H200's host): each decode task's keys are split into parts of
    // kMinPartKeys keys or more, merged afterwards. A part with partial == nullptr is a whole
    // task.
    const int64_t threads = at::get_num_threads();
    const int64_t num_tasks = static_cast<int64_t>(tasks_.size());
    const bool split = !small_ && num_tasks < 2 * threads;
    int64_t num_partial = 0;  // parts with a partial result
    for (int64_t i = 0; i < num_tasks; ++i) {
      const Task& t = tasks_[i];
      const int64_t c = ctx[t.seq];
      int64_t n = 1;
      if (split && qsl[t.seq + 1] - qsl[t.seq] == 1) {
        n = std::min((2 * threads + num_tasks - 1) / num_tasks, c / kMinPartKeys);
      }
      if (n <= 1) {
        parts_.push_back({i, 0, 0, nullptr});
        continue;
      }
      for (int64_t p = 0; p < n; ++p) {
        parts_.push_back({i, c * p / n, c * (p + 1) / n, nullptr});
        ++num_partial;
      }
    }
    partials_.resize(num_partial * group * (HEAD_SIZE + 2));
    for (int64_t p = 0, k = 0; p < static_cast<int64_t>(parts_.size()); ++p) {
      if (parts_[p].k_end > 0) {
        parts_[p].partial = partials_.data() + (k++) * group * (HEAD_SIZE + 2);
      }
    }
    // a split task's first part and its parts' count; its merge runs on the thread that
    // finishes its last part to finish (the counter), in the loop
    first_part_.assign(num_tasks, 0);
    num_parts_.assign(num_tasks, 0);
    for (int64_t p = static_cast<int64_t>(parts_.size()) - 1; p >= 0; --p) {
      first_part_[parts_[p].task] = p;
      ++num_parts_[parts_[p].task];
    }
    finished_.reset(new std::atomic<int64_t>[num_tasks]);
    for (int64_t i = 0; i < num_tasks; ++i) finished_[i].store(0, std::memory_order_relaxed);
  }

  int64_t parts() const override { return static_cast<int64_t>(parts_.size()); }
  bool small() const override { return small_; }

  void next_layer(const at::Tensor& key_cache, const at::Tensor& value_cache) override {
    TORCH_CHECK(same_layout(key_cache, key_layout_) && same_layout(value_cache, value_layout_),
                "the next layer's attention takes caches of the planned layer's sizes, strides "
                "and dtype ", key_layout_.sizes(), ", got ", key_cache.sizes(), " and ",
                value_cache.sizes());
    kernel_.key_cache = key_cache.data_ptr<T>();
    kernel_.value_cache = value_cache.data_ptr<T>();
    if (has_nt_) {
      nt_.key_cache = key_cache.data_ptr<T>();
      nt_.value_cache = value_cache.data_ptr<T>();
    }
    for (size_t i = 0; i < tasks_.size(); ++i) finished_[i].store(0, std::memory_order_relaxed);
  }

  void run(int64_t begin, int64_t end) const override {
    // this thread's scratch, kept between calls (a tail runs one part a call)
    thread_local std::vector<float> q_rows, scores, acc;
    thread_local std::vector<T> rotated;  // nt: this thread's rotated query rows
    if (has_nt_) rotated.resize(static_cast<size_t>(rotated_elems_));
    auto local = kernel_;
    for (int64_t i = begin; i < end; ++i) {
      const Part& part = parts_[i];
      const Task& task = tasks_[part.task];
      const int64_t q_start = qsl_[task.seq];
      local.block_table = tables_ + task.seq * max_blocks_;
      if (has_nt_) {
        local.rotate_queries(task, q_start, nt_, rotated.data());
        local.query = rotated.data();
        // the part that reads the new keys writes them (a split task's last; tokens of one
        // sequence and KV head are one task)
        if (part.partial == nullptr || part.k_end == ctx_[task.seq]) {
          local.cache_new_tokens(task, q_start, nt_);
        }
      }
      local.run(task, q_start, qsl_[task.seq + 1] - q_start, ctx_[task.seq], q_rows, scores, acc,
                part.partial != nullptr ? &part : nullptr);
      if (part.partial != nullptr &&
          finished_[part.task].fetch_add(1, std::memory_order_acq_rel) ==
              num_parts_[part.task] - 1) {
        local.merge_parts(task, q_start, parts_.data() + first_part_[part.task],
                          num_parts_[part.task]);
      }
    }
  }

 private:
  AttentionTask<T, HEAD_SIZE> kernel_;
  const int* ctx_;
  const int* qsl_;
  const int* tables_;
  int64_t max_blocks_, rotated_elems_;
  static bool same_layout(const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && a.strides() == b.strides() &&
           a.scalar_type() == b.scalar_type() && a.device() == b.device();
  }

  bool has_nt_, small_ = false;
  at::Tensor key_layout_, value_layout_;  // the planned caches (next_layer's are alike)
  NewTokens<T> nt_{};
  std::vector<Task> tasks_;
  std::vector<Part> parts_;
  std::vector<float> partials_;
  std::vector<int64_t> first_part_, num_parts_;
  std::unique_ptr<std::atomic<int64_t>[]> finished_;
};

template <typename T>
std::unique_ptr<AttentionLoop> plan_for_head_size(int64_t head_size, at::Tensor& out,
                                                  const at::Tensor& query,
                                                  const at::Tensor& key_cache,
                                                  const at::Tensor& value_cache,
                                                  const at::Tensor& block_tables,
                                                  const at::Tensor& context_lens,
                                                  const at::Tensor& query_start_loc, double scale,
                                                  const NewTokens<T>* nt = nullptr) {
  switch (head_size) {
#define VLLM_CASE(D)                                                                          \
  case D:                                                                                     \
    return std::make_unique<AttentionPlan<T, D>>(out, query, key_cache, value_cache,          \
                                                 block_tables, context_lens, query_start_loc, \
                                                 scale, nt);
    VLLM_CASE(32)
    VLLM_CASE(64)
    VLLM_CASE(80)
    VLLM_CASE(96)
    VLLM_CASE(128)
    VLLM_CASE(256)
#undef VLLM_CASE
    default:
      TORCH_CHECK(false, "paged_attention supports head sizes 32, 64, 80, 96, 128 and 256, got ",
                  head_size);
  }
}

}  // namespace

bool rotary_cache_attention_applies(const at::Tensor& query_start_loc, int64_t num_heads,
                                    int64_t num_kv_heads) {
  if (num_kv_heads <= 0 || query_start_loc.dim() != 1 ||
      query_start_loc.scalar_type() != at::kInt || !query_start_loc.is_contiguous()) {
    return false;  // the ops' checks name it
  }
  const int64_t most =
      std::max<int64_t>(1, kMaxRows / std::max<int64_t>(1, num_heads / num_kv_heads));
  const int* qsl = query_start_loc.data_ptr<int>();
  for (int64_t s = 0; s + 1 < query_start_loc.size(0); ++s) {
    if (qsl[s + 1] - qsl[s] > most) return false;
  }
  return true;
}

std::unique_ptr<AttentionLoop> rotary_cache_attention_loop(
    at::Tensor& out, at::Tensor& query, at::Tensor& key, const at::Tensor& value,
    const at::Tensor& positions, const at::Tensor& cos_sin_cache, bool is_neox,
    at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& slot_mapping,
    const at::Tensor& block_tables, const at::Tensor& context_lens,
    const at::Tensor& query_start_loc, int64_t max_context_len, double scale) {
  const int64_t num_tokens = query.size(0), head_size = out.size(2);
  const int64_t num_heads = out.size(1), num_kv_heads = key_cache.size(1);
  at::Tensor q3 = query.view({num_tokens, num_heads, head_size});
  at::Tensor k3 = key.view({num_tokens, num_kv_heads, head_size});
  at::Tensor v3 = value.view({num_tokens, num_kv_heads, head_size});
  vllm::check_rotary_embedding_args(positions, query, key, head_size, cos_sin_cache);
  vllm::check_reshape_and_cache_args(k3, v3, key_cache, value_cache, slot_mapping);
  vllm::check_paged_attention_args(out, q3, key_cache, value_cache, block_tables, context_lens,
                                   query_start_loc);
  (void)max_context_len;  // the CPU reads context_lens directly
  TORCH_CHECK(rotary_cache_attention_applies(query_start_loc, num_heads, num_kv_heads),
              "rotary_cache_attention takes each sequence's tokens as one task of at most ",
              kMaxRows, " query rows");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  check_positions(pos, num_tokens, cos_sin_cache.size(0));
  check_slots(slots, num_tokens, key_cache.size(0) * key_cache.size(2));
  std::unique_ptr<AttentionLoop> loop;
  VLLM_CPU_DISPATCH_FLOAT_TYPES(query.scalar_type(), "rotary_cache_attention", [&] {
    const NewTokens<scalar_t> nt{query.data_ptr<scalar_t>(), key.data_ptr<scalar_t>(),
                                 value.data_ptr<scalar_t>(), key.stride(0), value.stride(0),
                                 pos, slots, cos_sin_cache.data_ptr<scalar_t>(),
                                 cos_sin_cache.size(1), is_neox,
                                 key_cache.data_ptr<scalar_t>(),
                                 value_cache.data_ptr<scalar_t>()};
    loop = plan_for_head_size<scalar_t>(head_size, out, q3, key_cache, value_cache, block_tables,
                                        context_lens, query_start_loc, scale, &nt);
  });
  return loop;
}

void run_attention_loop(const AttentionLoop& loop) {
  const int64_t parts = loop.parts();
  parallel_for(0, parts, loop.small() ? std::max<int64_t>(1, parts) : 1,
               [&](int64_t begin, int64_t end) { loop.run(begin, end); });
}

void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                     const at::Tensor& context_lens, const at::Tensor& query_start_loc,
                     int64_t max_context_len, double scale) {
  vllm::check_paged_attention_args(out, query, key_cache, value_cache, block_tables, context_lens,
                                   query_start_loc);
  (void)max_context_len;  // the CPU reads context_lens directly
  VLLM_CPU_DISPATCH_FLOAT_TYPES(query.scalar_type(), "paged_attention", [&] {
    run_attention_loop(*plan_for_head_size<scalar_t>(query.size(2), out, query, key_cache,
                                                     value_cache, block_tables, context_lens,
                                                     query_start_loc, scale));
  });
}

}  // namespace vllm_cpu
