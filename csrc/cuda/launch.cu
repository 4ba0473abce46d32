// pdl_enabled: VLLM_CUDA_PDL (launch.cuh) and the current device's compute capability.
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda/launch.cuh"

namespace vllm_cuda {

namespace {

// Compute capability major of `device`, queried once per device.
int device_major(int device) {
  static std::mutex mutex;
  static std::vector<int> majors;
  const std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(majors.size())) majors.resize(device + 1, -1);
  if (majors[device] < 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&majors[device], cudaDevAttrComputeCapabilityMajor,
                                          device));
  }
  return majors[device];
}

}  // namespace

bool pdl_enabled() {
  const char* v = std::getenv("VLLM_CUDA_PDL");
  if (v == nullptr || std::strcmp(v, "0") == 0) return false;
  TORCH_CHECK(std::strcmp(v, "1") == 0, "VLLM_CUDA_PDL must be 0 or 1, got '", v, "'");
  return device_major(c10::cuda::current_device()) >= 9;
}

}  // namespace vllm_cuda
