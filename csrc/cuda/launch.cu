// pdl_enabled: VLLM_CUDA_PDL (launch.cuh) and the current device's compute capability;
// carveout_percent and prefer_carveout: VLLM_CUDA_CARVEOUT.
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <tuple>
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

int carveout_percent() {
  const char* v = std::getenv("VLLM_CUDA_CARVEOUT");
  if (v == nullptr || std::strcmp(v, "default") == 0) return -1;
  if (std::strcmp(v, "max") == 0) return cudaSharedmemCarveoutMaxShared;
  char* end = nullptr;
  const long percent = std::strtol(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && percent >= 0 && percent <= 100,
              "VLLM_CUDA_CARVEOUT must be default, max or a percentage 0-100, got '", v, "'");
  return static_cast<int>(percent);
}

void prefer_carveout(const void* kernel, int percent) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, int>> done;
  const int device = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.insert({kernel, device, percent}).second) {
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
  }
}

}  // namespace vllm_cuda
