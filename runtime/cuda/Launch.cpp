//===- Launch.cpp - Programmatic launches of the runtime's kernels --------===//

#include "Launch.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

namespace {
std::atomic<bool> programmatic{true};
} // namespace

bool vflow::rt::cuda::programmaticLaunchesEnabled() { return programmatic; }

void vflow::rt::cuda::setProgrammaticLaunches(bool enabled) {
  programmatic = enabled;
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
