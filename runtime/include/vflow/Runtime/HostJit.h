//===- HostJit.h - C++ to a cached shared object ----------------*- C++ -*-===//
//
// The CPU backend's JIT: compiles one generated translation unit with the
// host C++ compiler into a shared object and loads it. Objects are cached on
// disk under <cache dir>/cpu-v1, named `<name>-<key>.so`, where the key (a
// SHA-256) covers the source, the compiler command and the runtime headers
// the source includes (KernelABI.h and Random.h, embedded in this library
// and written next to the objects, so no source tree is needed at run time).
//
// The cache trusts nothing it did not check (docs/backends.md, "The JIT
// cache"): its folders must be private to this user; an object is loaded
// only when its manifest (`<name>-<key>.sum`) says it was built for this key
// and its size and SHA-256 match, and then from the very bytes that were
// checked; anything else is rebuilt. A per-object file lock (flock) keeps
// concurrent processes from compiling the same object twice. Waiting for
// the lock and for the compiler is bounded by the JIT timeout.
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
  /// The limit, in seconds, on waiting for another process's compile (the
  /// lock) and on the host compiler, which is then killed; 0 means
  /// $VFLOW_JIT_TIMEOUT, else 600.
  double timeoutSeconds = 0;
};

class HostJit {
public:
  /// Compiles `source` (or finds it in the cache) and loads it. `name` is a
  /// readable label (e.g. the flow name) used in file names and messages.
  /// Throws vflow::rt::Error with the compiler's output when it fails, when
  /// it or the lock times out, and when the cache directory is not private.
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

  /// $VFLOW_CACHE_DIR, else $XDG_CACHE_HOME/vflow, else ~/.cache/vflow,
  /// else $TMPDIR (or /tmp)/vflow-cache-<uid>. Created with mode 0700 and
  /// checked to be private when used, not here.
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
