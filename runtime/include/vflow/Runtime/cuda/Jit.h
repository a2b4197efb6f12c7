//===- Jit.h - CUDA C++ to a cached cubin or PTX with NVRTC -----*- C++ -*-===//
//
// The GPU backend's JIT: compiles one generated CUDA translation unit with
// NVRTC (loaded with dlopen at run time, so nothing links against it) into a
// cubin for one architecture, or into PTX. Results are cached on disk under
// <cache dir>/cuda-v1 like the host JIT's (docs/cuda-jit.md): named
// `<label>-<target>-<key>`, where the key (a SHA-256) covers the source, the
// options, the target, the NVRTC version and the embedded device headers.
// A cached object is used only when its manifest (`<...>.sum`) says it was
// made for this key and its size and SHA-256 match, and callers get the
// bytes that were checked; anything else is recompiled. A per-key file lock
// (flock), waited on for at most the JIT timeout, keeps concurrent
// processes from compiling twice.
//
// This header needs neither cuda.h nor nvrtc.h.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_JIT_H
#define VFLOW_RUNTIME_CUDA_JIT_H

#include "vflow/Runtime/Artifact.h"

#include <string>
#include <utility>
#include <vector>

namespace vflow {
namespace rt {
namespace cuda {

struct NvrtcOptions {
  /// The architecture: "sm_<digits>" with an optional "a" (sm_80, sm_90a).
  std::string arch = "sm_90";
  /// True: a cubin (SASS) for `arch`. False: PTX only, for compute_<digits>,
  /// which the driver compiles when it loads it.
  bool cubin = true;
  /// More NVRTC options, after the fixed ones (docs/cuda-jit.md).
  std::vector<std::string> extra;
  /// The cache directory; empty means HostJit::defaultCacheDir().
  std::string cacheDir;
  /// No "compiling ..." message on stderr.
  bool quiet = false;
  /// The readable name in the key and in messages; empty means the name
  /// passed to compileCuda().
  std::string label;
  /// False: always compile, and write nothing to disk.
  bool useCache = true;
  /// The limit, in seconds, on waiting for another process's compile of
  /// the same key (its lock); 0 means $VFLOW_JIT_TIMEOUT, else 600. NVRTC
  /// itself runs in this process and is not interrupted.
  double timeoutSeconds = 0;
};

struct CudaBinary {
  /// The PTX (when compiled with cubin = false); empty otherwise.
  std::string ptx;
  /// The cubin (when compiled with cubin = true); empty otherwise.
  std::vector<char> cubin;
  /// NVRTC's log (warnings); usually empty.
  std::string log;
  /// The cached object (empty when useCache is false).
  std::string path;
  /// The code target: "sm_90" for a cubin, "compute_80" for PTX.
  std::string target;
  /// True when it came from the cache; compileSeconds is then 0.
  bool cacheHit = false;
  double compileSeconds = 0;
};

/// Compiles `source` (or finds it in the cache). Throws vflow::rt::Error
/// when NVRTC cannot be loaded, when the arch is malformed, when the
/// compile fails (with NVRTC's log, whose lines are numbered), when the
/// cache directory is not private and when waiting for its lock times out.
CudaBinary compileCuda(const std::string &name, const std::string &source,
                       const NvrtcOptions &options = {});

/// Compiles `flow`'s CUDA to PTX for one specialization (query heads per
/// KV head, head dimension, KV dtype) and `arch` ("sm_90"), cached, and
/// keeps it in the flow's binaries (a session on a matching device loads it
/// instead of compiling). Throws Error naming the flow when it cannot.
const GpuBinary &addPtx(FlowArtifact &flow, const std::string &arch, int group,
                        int headDim, DType kvDType, bool quiet = false);

/// The NVRTC version, "13.0"; throws Error when NVRTC cannot be loaded.
std::string nvrtcVersionString();

/// True when NVRTC can be loaded; otherwise false with the reason (which
/// libraries were tried and why they failed).
bool nvrtcAvailable(std::string *whyNot = nullptr);

/// The device headers that generated code may include, embedded at build
/// time: (include name, text), e.g. ("vflow/FlowDevice.cuh", ...).
const std::vector<std::pair<std::string, std::string>> &embeddedCudaHeaders();

} // namespace cuda
} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_CUDA_JIT_H
