// The dtypes the CUDA kernels are instantiated for: fp32, fp16 and bf16.
#pragma once

#include <ATen/Dispatch.h>

#define VLLM_CUDA_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                   \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                          \
                     AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)  \
                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))
