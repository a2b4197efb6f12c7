//===- Launch.cpp - Programmatic launches of the runtime's kernels --------===//

#include "Launch.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

bool vflow::rt::cuda::programmaticLaunchesEnabled() {
  static const bool enabled = [] {
    const char *value = std::getenv("VFLOW_PROGRAMMATIC_LAUNCH");
    return !(value && std::strcmp(value, "0") == 0);
  }();
  return enabled;
}

bool vflow::rt::cuda::runsGridControl(const void *kernel) {
  static std::mutex mutex;
  static std::map<std::pair<const void *, int>, bool> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return false;
  std::lock_guard<std::mutex> lock(mutex);
  auto [at, inserted] = known.try_emplace({kernel, device}, false);
  if (inserted) {
    // The PTX arch decides: PTX for an older arch JIT-compiled for this
    // device has no griddepcontrol (__CUDA_ARCH__ was below 900).
    cudaFuncAttributes attributes{};
    at->second = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess &&
                 attributes.ptxVersion >= 90;
  }
  return at->second;
}
