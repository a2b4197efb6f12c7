//===- Driver.h - Modules, launches and devices (CUDA driver) ---*- C++ -*-===//
//
// The CUDA driver API, loaded with dlopen ("libcuda.so.1") on first use, so
// that the runtime builds and links where no driver is installed. Modules are
// loaded into the current device's primary context, the one the CUDA runtime
// API (cudaMalloc, streams, graphs) uses; their functions launch on any
// cudaStream_t of that device.
//
// This header needs neither cuda.h nor cuda_runtime_api.h: functions and
// streams are passed as void* (CUfunction, cudaStream_t).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_DRIVER_H
#define VFLOW_RUNTIME_CUDA_DRIVER_H

#include <cstddef>
#include <string>

namespace vflow {
namespace rt {
namespace cuda {

/// Whether kernels are launched as programmatic dependents where the device
/// and the binary allow it (default: yes). setProgrammaticLaunches(false)
/// launches every kernel, generated or the runtime's, in plain stream order
/// from then on, in the whole process: a profiler's per-kernel times then do
/// not include a kernel's wait for the one before it (the bench and the
/// profiling tools set it from VFLOW_PROGRAMMATIC_LAUNCH at their edge).
bool programmaticLaunchesEnabled();
void setProgrammaticLaunches(bool enabled);

struct CudaBinary;

/// A loaded CUDA module; unloaded by the destructor. Movable, not copyable.
class Module {
public:
  /// Loads the cubin of `binary` if it has one, else its PTX (the driver
  /// compiles it; its error log is in the Error). Initializes the current
  /// device's primary context when no context is current. Throws
  /// vflow::rt::Error when there is no driver or the load fails.
  static Module load(const CudaBinary &binary);

  Module() = default;
  ~Module();
  Module(Module &&other) noexcept;
  Module &operator=(Module &&other) noexcept;
  Module(const Module &) = delete;
  Module &operator=(const Module &) = delete;

  /// The kernel `name` (extern "C" or mangled) as a CUfunction; throws Error
  /// naming the kernel when the module lacks it.
  void *function(const std::string &name) const;

private:
  void *handle = nullptr; // CUmodule
  std::string label;      // the binary's path or target, for messages
};

/// Launches `function` on `stream` (a cudaStream_t; null: the default
/// stream) with `args` as cuLaunchKernel takes them (one pointer per
/// parameter). Raises the function's dynamic shared memory limit when
/// `sharedBytes` exceeds 48 KiB. `programmatic`: as a programmatic
/// dependent of the grid before it in the stream (sm_90+; the kernel must
/// keep GridDependency.cuh's vd::awaitEarlierGrids contract). Throws Error when
/// the launch fails.
void launchKernel(void *function, unsigned gridX, unsigned gridY,
                  unsigned gridZ, unsigned blockX, unsigned blockY,
                  unsigned blockZ, unsigned sharedBytes, void *stream,
                  void **args, bool programmatic = false);

/// How many CTAs of `function` (`blockThreads` threads each, no dynamic
/// shared memory) one multiprocessor holds at once.
int residentBlocksPerMultiprocessor(void *function, unsigned blockThreads);

struct DeviceInfo {
  int ordinal = 0, major = 0, minor = 0, multiprocessors = 0;
  size_t l2Bytes = 0, sharedPerBlockOptin = 0;
  std::string name;
  /// "sm_<major><minor>", e.g. "sm_90".
  std::string arch;
};

/// The CUDA runtime's current device; initializes its primary context.
/// Throws Error when there is no driver or no device.
DeviceInfo currentDevice();

/// True when a driver and a device can be used; otherwise false with the
/// reason. Never throws.
bool gpuAvailable(std::string *whyNot = nullptr);

/// currentDevice().arch: the NvrtcOptions::arch to compile for this device.
std::string archOfCurrentDevice();

} // namespace cuda
} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_CUDA_DRIVER_H
