// The gated activation's one element, shared by silu_and_mul and the GEMV that applies it to
// its input (gated_linear_small), so that both round alike: silu(gate) is rounded to T before
// the product, as torch's silu(gate) * up is, and the product to T, as a stored activation is.
#pragma once

template <typename T>
__device__ __forceinline__ T silu_mul(float gate, float up) {
  const float silu = static_cast<float>(static_cast<T>(gate / (1.f + __expf(-gate))));
  return static_cast<T>(silu * up);
}
