// THE op table: each schema is defined once; the CPU kernel and (in CUDA builds) the CUDA kernel
// are registered under the same name, and PyTorch's dispatcher picks one by the tensors' device.
#include "core/registration.h"
#include "ops.h"

TORCH_LIBRARY(_C, m) {
  m.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  m.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
  m.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  m.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor! key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox) -> ()");
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
      "Tensor slot_mapping) -> ()");
  m.def(
      "rotary_embedding_and_cache(Tensor positions, Tensor! query, Tensor! key, Tensor value, "
      "int head_size, Tensor cos_sin_cache, bool is_neox, Tensor! key_cache, "
      "Tensor! value_cache, Tensor slot_mapping) -> ()");
  m.def(
      "copy_blocks(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor block_mapping) "
      "-> ()");
  m.def(
      "paged_attention(Tensor! out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor context_lens, Tensor query_start_loc, int max_context_len, "
      "float scale) -> ()");
  // a decode step of few rows (linear_small on both devices, decode_layers on the CPU only)
  m.def("linear_small(Tensor! out, Tensor input, Tensor weight, Tensor? bias) -> ()");
  m.def(
      "decode_layers(Tensor! hidden, Tensor positions, Tensor[] weights, Tensor final_norm, "
      "Tensor cos_sin_cache, Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, "
      "Tensor slot_mapping, Tensor block_tables, Tensor context_lens, Tensor query_start_loc, "
      "int max_context_len, int num_heads, int num_kv_heads, int head_size, float epsilon, "
      "float scale, bool is_neox, Tensor[] packed, Tensor(c!)? stage_ms=None) -> ()");
  m.def("pack_linear(Tensor weight) -> Tensor");
  m.def("linear_packed(Tensor! out, Tensor input, Tensor weight, Tensor packed, Tensor? bias) -> ()");
  // a greedy draft's tokens: each row's first maximal index of input @ weight^T (CPU only)
  m.def("linear_argmax(Tensor! out, Tensor input, Tensor weight, Tensor packed) -> ()");
  // a greedy draft's next steps in one call: embedding, decode_layers, linear_argmax (CPU only)
  m.def(
      "greedy_steps(Tensor! tokens, Tensor input_ids, Tensor positions, Tensor embedding, "
      "Tensor[] weights, Tensor final_norm, Tensor cos_sin_cache, Tensor(a!)[] key_caches, "
      "Tensor(b!)[] value_caches, Tensor block_tables, int num_heads, int num_kv_heads, "
      "int head_size, float epsilon, float scale, bool is_neox, Tensor[] packed, Tensor head, "
      "Tensor head_packed, Tensor(c!)? stage_ms=None, Tensor? query_start_loc=None, "
      "Tensor(d!)? step_ms=None) -> ()");
}

#define VLLM_REGISTER_KERNELS(m, ns)                          \
  m.impl("rms_norm", &ns::rms_norm);                          \
  m.impl("fused_add_rms_norm", &ns::fused_add_rms_norm);      \
  m.impl("silu_and_mul", &ns::silu_and_mul);                  \
  m.impl("rotary_embedding", &ns::rotary_embedding);          \
  m.impl("reshape_and_cache", &ns::reshape_and_cache);        \
  m.impl("rotary_embedding_and_cache", &ns::rotary_embedding_and_cache); \
  m.impl("copy_blocks", &ns::copy_blocks);                    \
  m.impl("paged_attention", &ns::paged_attention);            \
  m.impl("linear_small", &ns::linear_small)

TORCH_LIBRARY_IMPL(_C, CPU, m) {
  VLLM_REGISTER_KERNELS(m, vllm_cpu);
  m.impl("decode_layers", &vllm_cpu::decode_layers);
  m.impl("pack_linear", &vllm_cpu::pack_linear);
  m.impl("linear_packed", &vllm_cpu::linear_packed);
  m.impl("linear_argmax", &vllm_cpu::linear_argmax);
  m.impl("greedy_steps", &vllm_cpu::greedy_steps);
}

#ifdef VLLM_WITH_CUDA
TORCH_LIBRARY_IMPL(_C, CUDA, m) { VLLM_REGISTER_KERNELS(m, vllm_cuda); }
#endif

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
