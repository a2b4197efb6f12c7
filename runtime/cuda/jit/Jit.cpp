//===- Jit.cpp - CUDA C++ to a cached cubin or PTX with NVRTC -------------===//

#include "vflow/Runtime/cuda/Jit.h"
#include "JitSupport.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/HostJit.h"
#include "vflow/Runtime/cuda/GpuFlowInfo.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include <cuda.h> // CUDA_VERSION: the NVRTC major version to look for
#include <dlfcn.h>
#include <nvrtc.h>

using namespace vflow::rt;
using namespace vflow::rt::cuda;
namespace fs = std::filesystem;

namespace {

/// NVRTC's entry points, resolved with dlsym; `error` says why it could not
/// be loaded (empty when it was).
struct Nvrtc {
  std::string error, version;
  decltype(&::nvrtcVersion) getVersion = nullptr;
  decltype(&::nvrtcGetErrorString) errorString = nullptr;
  decltype(&::nvrtcCreateProgram) createProgram = nullptr;
  decltype(&::nvrtcCompileProgram) compileProgram = nullptr;
  decltype(&::nvrtcGetProgramLogSize) programLogSize = nullptr;
  decltype(&::nvrtcGetProgramLog) programLog = nullptr;
  decltype(&::nvrtcGetPTXSize) ptxSize = nullptr;
  decltype(&::nvrtcGetPTX) ptx = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubinSize = nullptr;
  decltype(&::nvrtcGetCUBIN) cubin = nullptr;
  decltype(&::nvrtcDestroyProgram) destroyProgram = nullptr;
  /// The sm_<N> numbers this NVRTC compiles for (empty: it cannot say;
  /// nvrtcGetSupportedArchs is NVRTC 11.2+).
  std::vector<int> archs;
};

/// The libraries to try, in order: by soname (the loader's search path),
/// then under $CUDA_HOME and /usr/local/cuda.
std::vector<std::string> nvrtcCandidates() {
  std::string major = "libnvrtc.so." + std::to_string(CUDA_VERSION / 1000);
  std::vector<std::string> names = {major, "libnvrtc.so"};
  std::vector<std::string> dirs;
  if (const char *home = std::getenv("CUDA_HOME"); home && *home)
    dirs.push_back(std::string(home) + "/lib64/");
  dirs.push_back("/usr/local/cuda/lib64/");
  for (const std::string &dir : dirs)
    for (const char *file : {major.c_str(), "libnvrtc.so"})
      names.push_back(dir + file);
  return names;
}

Nvrtc loadNvrtc() {
  Nvrtc api;
  std::string tried;
  void *library = jit::openFirstLibrary(nvrtcCandidates(), tried);
  if (!library) {
    api.error = "vflow: cannot load NVRTC (the CUDA runtime compiler); "
                "install the CUDA toolkit or set CUDA_HOME. Tried:" +
                tried;
    return api;
  }
  auto resolve = [&](auto &function, const char *symbol) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(
        ::dlsym(library, symbol));
    if (!function && api.error.empty())
      api.error = std::string("vflow: the NVRTC library has no symbol ") +
                  symbol + " (too old?)";
  };
  resolve(api.getVersion, "nvrtcVersion");
  resolve(api.errorString, "nvrtcGetErrorString");
  resolve(api.createProgram, "nvrtcCreateProgram");
  resolve(api.compileProgram, "nvrtcCompileProgram");
  resolve(api.programLogSize, "nvrtcGetProgramLogSize");
  resolve(api.programLog, "nvrtcGetProgramLog");
  resolve(api.ptxSize, "nvrtcGetPTXSize");
  resolve(api.ptx, "nvrtcGetPTX");
  resolve(api.cubinSize, "nvrtcGetCUBINSize");
  resolve(api.cubin, "nvrtcGetCUBIN");
  resolve(api.destroyProgram, "nvrtcDestroyProgram");
  auto numArchs = reinterpret_cast<decltype(&::nvrtcGetNumSupportedArchs)>(
      ::dlsym(library, "nvrtcGetNumSupportedArchs"));
  auto getArchs = reinterpret_cast<decltype(&::nvrtcGetSupportedArchs)>(
      ::dlsym(library, "nvrtcGetSupportedArchs"));
  int count = 0;
  if (numArchs && getArchs && numArchs(&count) == NVRTC_SUCCESS && count > 0) {
    api.archs.resize(size_t(count));
    if (getArchs(api.archs.data()) != NVRTC_SUCCESS)
      api.archs.clear();
  }
  int major = 0, minor = 0;
  if (api.error.empty() && api.getVersion(&major, &minor) == NVRTC_SUCCESS)
    api.version = std::to_string(major) + "." + std::to_string(minor);
  else if (api.error.empty())
    api.error = "vflow: nvrtcVersion failed";
  return api;
}

const Nvrtc &nvrtc() {
  static const Nvrtc api = loadNvrtc();
  return api;
}

const Nvrtc &requireNvrtc() {
  const Nvrtc &api = nvrtc();
  if (!api.error.empty())
    throw Error(api.error);
  return api;
}

/// "sm_90" -> "sm_90" for a cubin, "compute_90" for PTX; throws Error when
/// `arch` is not sm_<digits> with an optional 'a'.
std::string codeTarget(const NvrtcOptions &options) {
  const std::string &arch = options.arch;
  size_t end = arch.size() - (!arch.empty() && arch.back() == 'a');
  bool ok = arch.compare(0, 3, "sm_") == 0 && end >= 5;
  for (size_t i = 3; ok && i < end; ++i)
    ok = std::isdigit(static_cast<unsigned char>(arch[i]));
  if (!ok)
    throw Error("vflow: bad CUDA architecture '" + arch +
                "': expected sm_<digits> with an optional 'a' (sm_80, sm_90, "
                "sm_90a); set NvrtcOptions::cubin = false for PTX");
  return options.cubin ? arch : "compute_" + arch.substr(3);
}

/// Throws Error when this NVRTC cannot compile for `arch` (sm_<digits>[a]),
/// naming the architectures it can; says nothing when NVRTC cannot tell.
void checkSupportedArch(const Nvrtc &api, const std::string &arch) {
  if (api.archs.empty())
    return;
  size_t end = arch.size() - (arch.back() == 'a');
  int wanted = std::atoi(arch.substr(3, end - 3).c_str());
  if (std::find(api.archs.begin(), api.archs.end(), wanted) != api.archs.end())
    return;
  std::string list;
  for (int a : api.archs)
    list += (list.empty() ? "sm_" : ", sm_") + std::to_string(a);
  throw Error("vflow: NVRTC " + api.version + " cannot compile for " + arch +
              "; it supports " + list);
}

/// Destroys an NVRTC program when it goes out of scope.
struct Program {
  const Nvrtc &api;
  nvrtcProgram handle = nullptr;
  ~Program() {
    if (handle)
      api.destroyProgram(&handle);
  }
};

void check(const Nvrtc &api, nvrtcResult result, const char *what) {
  if (result != NVRTC_SUCCESS)
    throw Error(std::string("vflow: ") + what +
                " failed: " + api.errorString(result));
}

/// Runs NVRTC on `source`; fills the binary's code, log and compile time.
/// `sourcePath` (may be empty) is named in the error for reading.
void runNvrtc(const Nvrtc &api, const std::string &label,
              const std::string &source, const std::vector<std::string> &flags,
              bool cubin, const std::string &sourcePath, CudaBinary &binary) {
  auto start = std::chrono::steady_clock::now();
  std::vector<const char *> headerTexts, headerNames;
  for (const auto &[name, text] : embeddedCudaHeaders()) {
    headerNames.push_back(name.c_str());
    headerTexts.push_back(text.c_str());
  }
  Program program{api};
  std::string fileName = label + ".cu";
  check(api,
        api.createProgram(&program.handle, source.c_str(), fileName.c_str(),
                          static_cast<int>(headerTexts.size()),
                          headerTexts.data(), headerNames.data()),
        "nvrtcCreateProgram");
  std::vector<const char *> options;
  for (const std::string &flag : flags)
    options.push_back(flag.c_str());
  nvrtcResult result = api.compileProgram(
      program.handle, static_cast<int>(options.size()), options.data());

  size_t size = 0;
  check(api, api.programLogSize(program.handle, &size),
        "nvrtcGetProgramLogSize");
  binary.log.assign(size, '\0');
  check(api, api.programLog(program.handle, binary.log.data()),
        "nvrtcGetProgramLog");
  while (!binary.log.empty() && binary.log.back() == '\0')
    binary.log.pop_back();
  if (result != NVRTC_SUCCESS) {
    std::string options;
    for (const std::string &flag : flags)
      options += " " + flag;
    throw Error("vflow: NVRTC failed to compile " + label + " for " +
                binary.target + " (" + api.errorString(result) + ")" +
                (sourcePath.empty() ? "" : "; source: " + sourcePath) +
                "\noptions:" + options + "\n" + binary.log);
  }
  if (cubin) {
    check(api, api.cubinSize(program.handle, &size), "nvrtcGetCUBINSize");
    binary.cubin.resize(size);
    check(api, api.cubin(program.handle, binary.cubin.data()), "nvrtcGetCUBIN");
  } else {
    check(api, api.ptxSize(program.handle, &size), "nvrtcGetPTXSize");
    binary.ptx.assign(size, '\0');
    check(api, api.ptx(program.handle, binary.ptx.data()), "nvrtcGetPTX");
    while (!binary.ptx.empty() && binary.ptx.back() == '\0')
      binary.ptx.pop_back();
  }
  binary.compileSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
}

} // namespace

const std::vector<std::pair<std::string, std::string>> &
vflow::rt::cuda::embeddedCudaHeaders() {
  static const std::vector<std::pair<std::string, std::string>> headers = {
#include "EmbeddedCudaHeaders.inc"
  };
  return headers;
}

std::string vflow::rt::cuda::nvrtcVersionString() {
  return requireNvrtc().version;
}

bool vflow::rt::cuda::nvrtcAvailable(std::string *whyNot) {
  const Nvrtc &api = nvrtc();
  if (whyNot)
    *whyNot = api.error;
  return api.error.empty();
}

CudaBinary vflow::rt::cuda::compileCuda(const std::string &name,
                                        const std::string &source,
                                        const NvrtcOptions &options) {
  CudaBinary binary;
  binary.target = codeTarget(options);
  double timeout = jit::jitTimeoutSeconds(options.timeoutSeconds);
  const Nvrtc &api = requireNvrtc();
  checkSupportedArch(api, options.arch);
  std::string label =
      jit::readableName(options.label.empty() ? name : options.label);
  // Fused multiply-adds stay off: results match the CPU backend's, which
  // compiles with -ffp-contract=off.
  std::vector<std::string> flags = {
      "-std=c++17", "--gpu-architecture=" + binary.target, "-default-device",
      "-lineinfo", "-fmad=false"};
  flags.insert(flags.end(), options.extra.begin(), options.extra.end());

  if (!options.useCache) {
    if (!options.quiet)
      std::fprintf(stderr, "vflow: compiling %s for %s with NVRTC...\n",
                   label.c_str(), binary.target.c_str());
    runNvrtc(api, label, source, flags, options.cubin, "", binary);
    return binary;
  }

  jit::CacheKey key;
  key.add("vflow nvrtc jit 1");
  key.add(source);
  key.add(std::to_string(flags.size()));
  for (const std::string &flag : flags)
    key.add(flag);
  key.add(api.version);
  for (const auto &[include, text] : embeddedCudaHeaders()) {
    key.add(include);
    key.add(text);
  }
  fs::path dir = jit::privateCacheDirectory(
      options.cacheDir.empty() ? HostJit::defaultCacheDir() : options.cacheDir,
      "cuda-v1");
  std::string stem = label + "-" + binary.target + "-" + key.hex();
  jit::CacheEntry entry(dir, stem, key.hex(),
                        {options.cubin ? ".cubin" : ".ptx", ".log"});
  binary.path = entry.file(0).string();
  // Callers get the bytes that were checked, never the file read again.
  auto useCached = [&] {
    const std::vector<std::string> &contents = entry.contents();
    if (options.cubin)
      binary.cubin.assign(contents[0].begin(), contents[0].end());
    else
      binary.ptx = contents[0];
    binary.log = contents[1];
    binary.cacheHit = true;
    return binary;
  };
  if (entry.read())
    return useCached();

  jit::FileLock lock(dir / (stem + ".lock"), label, timeout);
  // Another process may have finished it while we waited.
  if (entry.read())
    return useCached();
  if (!entry.problem().empty())
    entry.discard(options.quiet);
  if (!options.quiet)
    std::fprintf(stderr,
                 "vflow: compiling %s for %s with NVRTC (cached in %s)...\n",
                 label.c_str(), binary.target.c_str(), dir.c_str());
  fs::path cu = dir / (stem + ".cu");
  jit::writeAtomically(cu, source);
  runNvrtc(api, label, source, flags, options.cubin, cu.string(), binary);
  entry.write({options.cubin
                   ? std::string(binary.cubin.begin(), binary.cubin.end())
                   : binary.ptx,
               binary.log});
  return binary;
}

const GpuBinary &vflow::rt::cuda::addPtx(FlowArtifact &flow,
                                         const std::string &arch, int group,
                                         int headDim, DType kvDType,
                                         bool quiet) {
  try {
    NvrtcOptions options;
    options.arch = arch;
    options.cubin = false;
    options.quiet = quiet;
    options.extra = gpuSpecializationMacros(flow.gpu, group, headDim, kvDType);
    CudaBinary binary = compileCuda(flow.name, flow.gpu.source, options);
    flow.gpu.binaries.push_back(
        {binary.target, group, headDim, kvDType, std::move(binary.ptx)});
    return flow.gpu.binaries.back();
  } catch (const std::exception &e) {
    throw Error("flow '" + flow.name + "': " + e.what());
  }
}
