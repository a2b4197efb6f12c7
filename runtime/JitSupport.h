//===- JitSupport.h - dlopen and on-disk cache helpers ----------*- C++ -*-===//
//
// What the runtime's JITs share (private to the runtime): loading the first
// library of a list, and the pieces of an on-disk object cache that trusts
// nothing it did not check. The CPU JIT (cpu/HostJit.cpp), the NVRTC JIT and
// the driver layer (cuda/jit/) use them.
//
// - The cache root and every folder vflow makes in it are private: created
//   with mode 0700, and refused unless they are directories owned by this
//   user that neither group nor others can write (privateCacheDirectory).
// - An entry is one or more files and a manifest, `<stem>.sum`, written
//   after them; it names the key the entry was made for and each file's
//   size and SHA-256. An entry is used only when all of that matches what is
//   on disk (CacheEntry::read); anything else is removed and rebuilt.
// - Every wait is bounded: the per-entry lock (FileLock) and the host
//   compiler (runShellCommand) give up after jitTimeoutSeconds().
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_JITSUPPORT_H
#define VFLOW_RUNTIME_JITSUPPORT_H

#include "vflow/Runtime/Sha256.h"

#include <cstddef>
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

/// A cache key: SHA-256 over length-prefixed parts, so ("ab", "c") and
/// ("a", "bc") differ. hex() is 64 hex digits.
class CacheKey {
public:
  void add(const std::string &part);
  std::string hex() const { return hash.hex(); }

private:
  Sha256 hash;
};

/// `name` with every character other than [A-Za-z0-9_-] replaced by '_',
/// at most 64 characters; "flow" when empty.
std::string readableName(const std::string &name);

/// The limit on every JIT wait, in seconds: `configured` when it is > 0,
/// else $VFLOW_JIT_TIMEOUT, else 600. Throws Error when `configured` is
/// negative or the variable is not a positive number.
double jitTimeoutSeconds(double configured);

/// $VFLOW_CACHE_DIR, else $XDG_CACHE_HOME/vflow, else $HOME/.cache/vflow,
/// else $TMPDIR (or /tmp)/vflow-cache-<uid>. Not created here.
std::string defaultCacheRoot();

/// Creates the cache root `root` (and missing parents) and `root/backend`
/// with mode 0700 where missing, checks that both are private (see above;
/// the root may be a symbolic link that this user or root owns, `backend`
/// may not), and returns `root/backend`. Throws Error naming the directory,
/// what is wrong with it and how to fix it.
std::filesystem::path privateCacheDirectory(const std::string &root,
                                            const std::string &backend);

/// Creates `dir` (mode 0700) when missing, inside a private cache
/// directory, and checks it like `backend` above. Throws Error.
void privateSubdirectory(const std::filesystem::path &dir);

/// Writes `size` bytes to `path` atomically (a fresh temporary file with
/// mode 0600, then rename), so no reader ever sees a half-written file.
/// Throws Error on failure.
void writeAtomically(const std::filesystem::path &path, const char *data,
                     size_t size);
inline void writeAtomically(const std::filesystem::path &path,
                            const std::string &text) {
  writeAtomically(path, text.data(), text.size());
}

/// Reads a regular file without following a symbolic link and without
/// blocking on a FIFO or device. False with the reason in `why` when `path`
/// is missing ("" then), not a regular file, or cannot be read.
bool readRegularFile(const std::filesystem::path &path, std::string &out,
                     std::string &why);

/// One entry of an on-disk cache: the files `<dir>/<stem><suffix>` for each
/// suffix (the first is the object: ".so", ".cubin") and the manifest
/// `<dir>/<stem>.sum`. Reading and writing an entry should happen under its
/// FileLock, except a first read(), which may fail for an entry being
/// written and must then be repeated under the lock.
class CacheEntry {
public:
  CacheEntry(std::filesystem::path dir, std::string stem, std::string key,
             std::vector<std::string> suffixes);
  ~CacheEntry();
  CacheEntry(const CacheEntry &) = delete;
  CacheEntry &operator=(const CacheEntry &) = delete;

  /// True when the entry is valid: the manifest was written for this key
  /// and every file is a regular file of the size and SHA-256 it names.
  /// contents() then holds the bytes that were checked, and objectFd() a
  /// descriptor open on the object file they were read from. False
  /// otherwise, with problem() saying why ("" when there is no entry).
  bool read();
  const std::string &problem() const { return why; }
  const std::vector<std::string> &contents() const { return bytes; }
  int objectFd() const { return fd; }

  /// Removes the files of an invalid entry, first saying so on stderr
  /// (unless `quiet`): "vflow: the cached entry <file> is invalid (<why>);
  /// rebuilding it". Throws Error when a file cannot be removed (e.g. it is
  /// a directory).
  void discard(bool quiet);

  /// Writes `contents` (one per suffix) and then the manifest, each
  /// atomically. Throws Error on failure.
  void write(const std::vector<std::string> &contents);

  std::filesystem::path file(size_t i) const;
  std::filesystem::path manifest() const;

private:
  std::string manifestText(const std::vector<std::string> &contents) const;
  void closeFd();

  std::filesystem::path dir;
  std::string stem, key;
  std::vector<std::string> suffixes;
  std::vector<std::string> bytes;
  std::string why;
  int fd = -1;
};

/// dlopen()s (RTLD_NOW | RTLD_LOCAL) the file open on `fd`, which was
/// checked, so that what is loaded is exactly what was checked, whatever
/// happens to `path` meanwhile: through /proc/self/fd, with a duplicate of
/// `fd` kept open for the life of the process so that name never means
/// another file. Falls back to `path` when /proc is unavailable. Null with
/// dlerror()'s reason in `why` when it cannot be loaded.
void *openCheckedLibrary(int fd, const std::filesystem::path &path,
                         std::string &why);

/// Holds an exclusive flock on a file (created if needed) while alive.
/// Waits at most `timeoutSeconds`; after 2 s it says on stderr that it is
/// waiting for another process compiling `what`, and at the limit it throws
/// Error naming the lock and saying it can be deleted when no vflow process
/// runs.
class FileLock {
public:
  FileLock(const std::filesystem::path &path, const std::string &what,
           double timeoutSeconds);
  ~FileLock();
  FileLock(const FileLock &) = delete;
  FileLock &operator=(const FileLock &) = delete;

private:
  int fd = -1;
};

/// What runShellCommand saw.
struct CommandResult {
  /// The exit status; 128 + the signal's number when a signal ended it.
  int status = -1;
  /// True when it ran past the limit and was killed.
  bool timedOut = false;
  /// Its stdout and stderr, interleaved (the first MiB).
  std::string output;
};

/// Runs `command` with /bin/sh -c in its own process group, stdin from
/// /dev/null, collecting its output through a pipe. When it has not
/// finished after `timeoutSeconds`, the whole group is killed. Throws
/// Error when it cannot be started.
CommandResult runShellCommand(const std::string &command,
                              double timeoutSeconds);

/// `seconds` for a message: "600 s", "0.5 s".
std::string secondsText(double seconds);

} // namespace jit
} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_JITSUPPORT_H
