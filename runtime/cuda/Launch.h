//===- Launch.h - Programmatic launches of runtime kernels ------*- C++ -*-===//
//
// The runtime's own kernels (attention, merge, the session's mass carry)
// are launched as programmatic dependents of the grid before them where the
// device and the kernel's binary support it (sm_90 and later): the launch
// and the CTAs' setup then overlap the earlier grid's tail. Such a kernel
// keeps GridDependency.cuh's contract (vd::awaitEarlierGrids).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_LAUNCH_H
#define VFLOW_RUNTIME_CUDA_LAUNCH_H

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Driver.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>

namespace vflow::rt::cuda {

/// Whether `kernel` (a __global__ function of this library) runs on the
/// current device from code generated for sm_90 or later (its PTX arch), so
/// that its griddepcontrol instructions exist (cached per kernel and device).
bool runsGridControl(const void *kernel);

/// Launches `kernel` on `stream`, as a programmatic dependent of the grid
/// before it when runsGridControl(kernel) and programmaticLaunchesEnabled().
/// Throws Error naming `what`.
template <class... Params, class... Args>
void launchAfterEarlierGrids(const char *what, void (*kernel)(Params...),
                             dim3 grid, dim3 block, size_t sharedBytes,
                             cudaStream_t stream, Args &&...args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = sharedBytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs =
      programmaticLaunchesEnabled() &&
              runsGridControl(reinterpret_cast<const void *>(kernel))
          ? 1
          : 0;
  cudaError_t status =
      cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status != cudaSuccess)
    throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_LAUNCH_H
