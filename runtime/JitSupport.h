//===- JitSupport.h - dlopen and on-disk cache helpers ----------*- C++ -*-===//
//
// What the runtime's JITs share (private to the runtime): loading the first
// library of a list, and the pieces of an on-disk object cache (a 128-bit
// key hash, readable file names, atomic writes, whole-file reads, an
// exclusive per-key file lock). The CPU JIT (cpu/HostJit.cpp), the NVRTC JIT
// and the driver layer (cuda/jit/) use them.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_JITSUPPORT_H
#define VFLOW_RUNTIME_JITSUPPORT_H

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace vflow {
namespace rt {
namespace jit {

/// dlopen()s the first of `candidates` that loads (RTLD_NOW | RTLD_LOCAL;
/// never closed). Returns null when none does, and then `tried` lists each
/// candidate with dlerror()'s reason, one per line.
void *openFirstLibrary(const std::vector<std::string> &candidates,
                       std::string &tried);

/// Two FNV-1a 64-bit hashes with different offsets: 32 hex digits. Each
/// add() ends with a separator, so ("ab", "c") and ("a", "bc") differ.
class Hasher {
public:
  void add(const std::string &text);
  std::string hex() const;

private:
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
};

/// `name` with every character other than [A-Za-z0-9_-] replaced by '_',
/// at most 64 characters; "flow" when empty.
std::string readableName(const std::string &name);

/// Creates `dir` and its parents; throws Error when it cannot.
void createDirectories(const std::filesystem::path &dir);

/// Writes `size` bytes to `path` atomically (a temporary file, then rename),
/// so no reader ever sees a half-written file. Throws Error on failure.
void writeAtomically(const std::filesystem::path &path, const char *data,
                     size_t size);
inline void writeAtomically(const std::filesystem::path &path,
                            const std::string &text) {
  writeAtomically(path, text.data(), text.size());
}

/// Reads all of `path` into `out`; false when it cannot be opened or read.
template <typename Bytes>
bool readFile(const std::filesystem::path &path, Bytes &out);

/// Holds an exclusive flock on a file (created if needed) while alive.
class FileLock {
public:
  explicit FileLock(const std::filesystem::path &path);
  ~FileLock();
  FileLock(const FileLock &) = delete;
  FileLock &operator=(const FileLock &) = delete;

private:
  int fd = -1;
};

} // namespace jit
} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_JITSUPPORT_H
