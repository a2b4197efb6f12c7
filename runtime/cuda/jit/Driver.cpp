//===- Driver.cpp - Modules, launches and devices (CUDA driver) -----------===//

#include "vflow/Runtime/cuda/Driver.h"
#include "JitSupport.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Jit.h"

#include <cstdint>
#include <utility>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

// The driver entry points used here. Each is resolved by the name cuda.h
// maps it to (e.g. a _v2 name), so the two always agree.
#define VFLOW_DRIVER_FUNCTIONS(X)                                              \
  X(cuInit)                                                                    \
  X(cuDeviceGetCount)                                                          \
  X(cuCtxGetCurrent)                                                           \
  X(cuModuleLoadDataEx)                                                        \
  X(cuModuleUnload)                                                            \
  X(cuModuleGetFunction)                                                       \
  X(cuLaunchKernelEx)                                                          \
  X(cuFuncSetAttribute)                                                        \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                               \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)
#define VFLOW_STRINGIFY_EXPANDED(name) VFLOW_STRINGIFY(name)
#define VFLOW_STRINGIFY(name) #name

/// The driver's entry points; `error` says why it cannot be used (no
/// library, a missing symbol, cuInit failed), empty when it can.
struct DriverApi {
  std::string error;
#define VFLOW_DECLARE(name) decltype(&::name) name = nullptr;
  VFLOW_DRIVER_FUNCTIONS(VFLOW_DECLARE)
#undef VFLOW_DECLARE
};

std::string resultText(const DriverApi &api, CUresult result) {
  const char *name = nullptr, *text = nullptr;
  if (api.cuGetErrorName(result, &name) != CUDA_SUCCESS)
    name = nullptr;
  if (api.cuGetErrorString(result, &text) != CUDA_SUCCESS)
    text = nullptr;
  // The toolkit's stub library (lib64/stubs) knows no error names.
  if (result == CUDA_ERROR_STUB_LIBRARY && !name) {
    name = "CUDA_ERROR_STUB_LIBRARY";
    text = "the CUDA toolkit's stub libcuda.so was loaded, not a driver";
  }
  return std::string(name ? name : "CUDA error " + std::to_string(result)) +
         (text ? std::string(" (") + text + ")" : std::string());
}

DriverApi loadDriver() {
  DriverApi api;
  std::string tried;
  void *library = jit::openFirstLibrary({"libcuda.so.1", "libcuda.so"}, tried);
  if (!library) {
    api.error = "vflow: no CUDA driver: cannot load libcuda.so.1 (is an "
                "NVIDIA driver installed?). Tried:" +
                tried;
    return api;
  }
#define VFLOW_RESOLVE(name)                                                    \
  api.name = reinterpret_cast<decltype(api.name)>(                             \
      ::dlsym(library, VFLOW_STRINGIFY_EXPANDED(name)));                       \
  if (!api.name && api.error.empty())                                          \
    api.error =                                                                \
        "vflow: the CUDA driver has no symbol " VFLOW_STRINGIFY_EXPANDED(      \
            name) " (too old?)";
  VFLOW_DRIVER_FUNCTIONS(VFLOW_RESOLVE)
#undef VFLOW_RESOLVE
  if (api.error.empty())
    if (CUresult result = api.cuInit(0); result != CUDA_SUCCESS)
      api.error = "vflow: cannot initialize the CUDA driver: cuInit failed: " +
                  resultText(api, result);
  return api;
}

/// The loaded and initialized driver; throws Error when there is none.
const DriverApi &driver() {
  static const DriverApi api = loadDriver();
  if (!api.error.empty())
    throw Error(api.error);
  return api;
}

void check(const DriverApi &api, CUresult result, const std::string &what) {
  if (result != CUDA_SUCCESS)
    throw Error("vflow: " + what + " failed: " + resultText(api, result));
}

void check(cudaError_t result, const std::string &what) {
  if (result != cudaSuccess)
    throw Error("vflow: " + what + " failed: " + cudaGetErrorName(result) +
                " (" + cudaGetErrorString(result) + ")");
}

/// Makes a context current: when none is, the CUDA runtime's primary context
/// of its current device (the one cudaMalloc and streams use).
void ensureContext(const DriverApi &api) {
  CUcontext context = nullptr;
  check(api, api.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  if (context)
    return;
  check(cudaFree(nullptr), "initializing the CUDA runtime (cudaFree(0))");
  check(api, api.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  if (!context)
    throw Error("vflow: no CUDA context is current after cudaFree(0)");
}

} // namespace

Module Module::load(const CudaBinary &binary) {
  const DriverApi &api = driver();
  ensureContext(api);
  Module module;
  module.label = (binary.path.empty() ? "an uncached binary" : binary.path) +
                 " (" + binary.target + ")";
  CUmodule handle = nullptr;
  if (!binary.cubin.empty()) {
    check(api,
          api.cuModuleLoadDataEx(&handle, binary.cubin.data(), 0, nullptr,
                                 nullptr),
          "loading the cubin " + module.label);
  } else if (!binary.ptx.empty()) {
    char errors[16384] = {};
    CUjit_option keys[] = {CU_JIT_ERROR_LOG_BUFFER,
                           CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *values[] = {errors, reinterpret_cast<void *>(
                                  static_cast<uintptr_t>(sizeof(errors)))};
    CUresult result =
        api.cuModuleLoadDataEx(&handle, binary.ptx.c_str(), 2, keys, values);
    if (result != CUDA_SUCCESS)
      throw Error("vflow: loading the PTX " + module.label +
                  " failed: " + resultText(api, result) + "\n" + errors);
  } else {
    throw Error("vflow: cannot load an empty CUDA binary");
  }
  module.handle = handle;
  return module;
}

Module::~Module() {
  // Errors are ignored: at exit the driver may already be shut down.
  if (handle)
    driver().cuModuleUnload(static_cast<CUmodule>(handle));
}

Module::Module(Module &&other) noexcept
    : handle(std::exchange(other.handle, nullptr)),
      label(std::move(other.label)) {}

Module &Module::operator=(Module &&other) noexcept {
  std::swap(handle, other.handle);
  std::swap(label, other.label);
  return *this;
}

void *Module::function(const std::string &name) const {
  if (!handle)
    throw Error("vflow: kernel '" + name + "' looked up in an empty Module");
  const DriverApi &api = driver();
  CUfunction function = nullptr;
  CUresult result = api.cuModuleGetFunction(
      &function, static_cast<CUmodule>(handle), name.c_str());
  if (result != CUDA_SUCCESS)
    throw Error("vflow: the CUDA module " + label + " has no kernel '" + name +
                "': " + resultText(api, result) +
                " (kernels are looked up by their extern \"C\" or mangled "
                "name)");
  return function;
}

void vflow::rt::cuda::launchKernel(void *function, unsigned gridX,
                                   unsigned gridY, unsigned gridZ,
                                   unsigned blockX, unsigned blockY,
                                   unsigned blockZ, unsigned sharedBytes,
                                   void *stream, void **args,
                                   bool programmatic) {
  const DriverApi &api = driver();
  auto shape = [&] {
    return " (grid " + std::to_string(gridX) + "x" + std::to_string(gridY) +
           "x" + std::to_string(gridZ) + ", block " + std::to_string(blockX) +
           "x" + std::to_string(blockY) + "x" + std::to_string(blockZ) + ", " +
           std::to_string(sharedBytes) + " bytes of shared memory)";
  };
  CUfunction f = static_cast<CUfunction>(function);
  if (sharedBytes > 48 * 1024)
    check(api,
          api.cuFuncSetAttribute(
              f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
              static_cast<int>(sharedBytes)),
          "raising the dynamic shared memory limit" + shape());
  // One launch call for both: the attribute counts only when programmatic.
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = gridX;
  config.gridDimY = gridY;
  config.gridDimZ = gridZ;
  config.blockDimX = blockX;
  config.blockDimY = blockY;
  config.blockDimZ = blockZ;
  config.sharedMemBytes = sharedBytes;
  config.hStream = static_cast<CUstream>(stream);
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  check(api, api.cuLaunchKernelEx(&config, f, args, nullptr),
        std::string(programmatic ? "launching a kernel as a programmatic "
                                   "dependent"
                                 : "launching a kernel") +
            shape());
}

int vflow::rt::cuda::residentBlocksPerMultiprocessor(void *function,
                                                     unsigned blockThreads) {
  const DriverApi &api = driver();
  int blocks = 0;
  check(api,
        api.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &blocks, static_cast<CUfunction>(function), int(blockThreads), 0),
        "asking a kernel's occupancy (" + std::to_string(blockThreads) +
            " threads per block)");
  return blocks;
}

DeviceInfo vflow::rt::cuda::currentDevice() {
  driver();
  check(cudaFree(nullptr), "initializing the CUDA runtime (cudaFree(0))");
  DeviceInfo info;
  check(cudaGetDevice(&info.ordinal), "cudaGetDevice");
  cudaDeviceProp properties;
  check(cudaGetDeviceProperties(&properties, info.ordinal),
        "cudaGetDeviceProperties");
  info.major = properties.major;
  info.minor = properties.minor;
  info.multiprocessors = properties.multiProcessorCount;
  info.l2Bytes = static_cast<size_t>(properties.l2CacheSize);
  info.sharedPerBlockOptin = properties.sharedMemPerBlockOptin;
  info.name = properties.name;
  info.arch = "sm_" + std::to_string(info.major * 10 + info.minor);
  return info;
}

bool vflow::rt::cuda::gpuAvailable(std::string *whyNot) {
  try {
    const DriverApi &api = driver();
    int count = 0;
    check(api, api.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0)
      throw Error("vflow: the CUDA driver reports no device");
    // The runtime API needs a driver at least as new as itself.
    check(cudaGetDeviceCount(&count), "initializing the CUDA runtime");
  } catch (const std::exception &error) {
    if (whyNot)
      *whyNot = error.what();
    return false;
  }
  if (whyNot)
    whyNot->clear();
  return true;
}

std::string vflow::rt::cuda::archOfCurrentDevice() {
  return currentDevice().arch;
}
