//===- HostJit.h - C++ to a cached shared object ----------------*- C++ -*-===//
//
// The CPU backend's JIT: compiles one generated translation unit with the
// host C++ compiler into a shared object and loads it. Objects are cached on
// disk under <cache dir>/cpu-v1, named `<name>-<hash>.so`, where the hash
// covers the source, the compiler command and the runtime headers the
// source includes (KernelABI.h and Random.h, embedded in this library and
// written next to the objects, so no source tree is needed at run time).
// A per-object file lock (flock) keeps concurrent processes from compiling
// the same object twice or reading a half-written one.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_HOSTJIT_H
#define VFLOW_RUNTIME_HOSTJIT_H

#include <string>
#include <vector>

namespace vflow {
namespace rt {

struct HostJitOptions {
  /// The cache directory; empty means HostJit::defaultCacheDir().
  std::string cacheDir;
  /// The compiler; empty means $CXX, else `c++`. May hold arguments
  /// ("ccache g++").
  std::string compiler;
  /// Optimization and code generation flags; empty means `-O2`.
  std::vector<std::string> flags;
  /// No "compiling ..." message on stderr.
  bool quiet = false;
  /// For CpuFlow: the readable name of the object instead of the flow's
  /// (e.g. one source that holds several flows, compiled once).
  std::string label;
};

class HostJit {
public:
  /// Compiles `source` (or finds it in the cache) and loads it. `name` is a
  /// readable label (e.g. the flow name) used in file names and messages.
  /// Throws vflow::rt::Error with the compiler's output when it fails.
  HostJit(const std::string &name, const std::string &source,
          HostJitOptions options = {});
  ~HostJit();
  HostJit(const HostJit &) = delete;
  HostJit &operator=(const HostJit &) = delete;

  /// The address of an exported symbol; throws Error when it is missing.
  void *lookupSymbol(const std::string &symbol) const;
  /// lookupSymbol() as a typed (function) pointer.
  template <typename T> T lookup(const std::string &symbol) const {
    return reinterpret_cast<T>(lookupSymbol(symbol));
  }

  /// The shared object that was loaded.
  const std::string &libraryPath() const { return path; }
  /// True when this construction ran the compiler (a cache miss).
  bool compiledNow() const { return compiled; }

  /// $VFLOW_CACHE_DIR, else $XDG_CACHE_HOME/vflow, else ~/.cache/vflow.
  static std::string defaultCacheDir();
  /// The text of a runtime header embedded for generated code:
  /// "KernelABI.h" or "Random.h".
  static const std::string &embeddedHeader(const std::string &name);

private:
  std::string name, path;
  void *handle = nullptr;
  bool compiled = false;
};

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_HOSTJIT_H
