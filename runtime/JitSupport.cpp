//===- JitSupport.cpp - dlopen and on-disk cache helpers ------------------===//

#include "JitSupport.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace vflow {
namespace rt {
namespace jit {

namespace {

std::string errnoText(int err) { return std::strerror(err); }

std::string octalMode(mode_t mode) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "%04o", unsigned(mode & 07777));
  return buffer;
}

/// "a FIFO", "a directory", ... for messages.
std::string fileKind(mode_t mode) {
  if (S_ISREG(mode))
    return "a regular file";
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISLNK(mode))
    return "a symbolic link";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode))
    return "a device";
  return "not a regular file";
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void sleepSeconds(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

/// Checks that `dir` is a private directory of this user. A symbolic link
/// is followed only when `mayBeLink` and this user or root owns it.
void checkPrivateDirectory(const fs::path &dir, bool mayBeLink) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0)
    throw Error("vflow: cannot inspect the JIT cache directory " +
                dir.string() + ": " + errnoText(errno));
  const uid_t me = ::geteuid();
  if (S_ISLNK(st.st_mode)) {
    if (!mayBeLink)
      throw Error("vflow: " + dir.string() +
                  " in the JIT cache is a symbolic link; vflow uses only the "
                  "directories it made there (remove the link)");
    if (st.st_uid != me && st.st_uid != 0)
      throw Error("vflow: the JIT cache directory " + dir.string() +
                  " is a symbolic link owned by uid " +
                  std::to_string(st.st_uid) + ", not by this user (uid " +
                  std::to_string(me) +
                  "); set VFLOW_CACHE_DIR to a directory you own");
    if (::stat(dir.c_str(), &st) != 0)
      throw Error("vflow: cannot inspect the JIT cache directory " +
                  dir.string() + ": " + errnoText(errno));
  }
  if (!S_ISDIR(st.st_mode))
    throw Error("vflow: the JIT cache directory " + dir.string() + " is " +
                fileKind(st.st_mode) +
                ", not a directory; remove it or set VFLOW_CACHE_DIR");
  if (st.st_uid != me)
    throw Error("vflow: the JIT cache directory " + dir.string() +
                " is owned by uid " + std::to_string(st.st_uid) +
                ", not by this user (uid " + std::to_string(me) +
                "), so another user could plant code in it; set "
                "VFLOW_CACHE_DIR to a directory you own (vflow creates it "
                "with mode 0700)");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    throw Error(
        "vflow: the JIT cache directory " + dir.string() +
        " is writable by group or others (mode " + octalMode(st.st_mode) +
        "), so another user could plant code in it; run `chmod 700 " +
        dir.string() + "` or set VFLOW_CACHE_DIR to a private directory");
}

/// mkdir(dir, 0700); fine when it exists (it is checked afterwards).
void makeDirectory(const fs::path &dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error("vflow: cannot create the JIT cache directory " + dir.string() +
                ": " + errnoText(errno));
}

/// Writes all of `data` to `fd`; false on an error (errno says which).
bool writeAll(int fd, const char *data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

/// Opens a regular file for reading: never follows a symbolic link, never
/// blocks (a FIFO is refused before it is opened). -1 with the reason in
/// `why` ("" when it does not exist).
int openRegularFile(const fs::path &path, struct stat &st, std::string &why) {
  why.clear();
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT)
      why = errnoText(errno);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    why = "it is " + fileKind(st.st_mode) + ", not a regular file";
    return -1;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    why = errno == ELOOP ? "it is a symbolic link, not a regular file"
                         : "cannot open it: " + errnoText(errno);
    return -1;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "it is " + fileKind(st.st_mode) + ", not a regular file";
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Reads exactly st.st_size bytes from `fd`; false with `why` otherwise.
bool readOpenFile(int fd, const struct stat &st, std::string &out,
                  std::string &why) {
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, &out[done], out.size() - done, off_t(done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      why = "cannot read it: " + errnoText(errno);
      return false;
    }
    if (n == 0) {
      why = "it shrank while being read";
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

std::atomic<unsigned> temporaryCounter{0};

} // namespace

void *openFirstLibrary(const std::vector<std::string> &candidates,
                       std::string &tried) {
  for (const std::string &name : candidates) {
    if (void *library = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL))
      return library;
    const char *why = ::dlerror();
    tried += "\n  " + name + ": " + (why ? why : "not found");
  }
  return nullptr;
}

void CacheKey::add(const std::string &part) {
  unsigned char length[8];
  uint64_t size = part.size();
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(size >> (8 * i));
  hash.update(length, sizeof(length));
  hash.update(part);
}

std::string readableName(const std::string &name) {
  std::string out;
  for (char c : name)
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'
               ? c
               : '_';
  if (out.empty())
    out = "flow";
  return out.substr(0, 64);
}

std::string secondsText(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g s", seconds);
  return buffer;
}

double jitTimeoutSeconds(double configured) {
  // A bound, so that a huge value cannot overflow a clock.
  constexpr double kLongest = 1e9;
  if (std::isnan(configured) || configured < 0)
    throw Error("vflow: the JIT timeout must be a positive number of "
                "seconds, not " +
                std::to_string(configured));
  if (configured > 0)
    return std::min(configured, kLongest);
  const char *text = std::getenv("VFLOW_JIT_TIMEOUT");
  if (!text || !*text)
    return 600;
  char *end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  while (end && std::isspace(static_cast<unsigned char>(*end)))
    ++end;
  if (end == text || *end || errno == ERANGE || !std::isfinite(seconds) ||
      seconds <= 0)
    throw Error(std::string("vflow: VFLOW_JIT_TIMEOUT must be a positive "
                            "number of seconds (the limit on waiting for a "
                            "JIT compile or its lock), not '") +
                text + "'");
  return std::min(seconds, kLongest);
}

std::string defaultCacheRoot() {
  if (const char *dir = std::getenv("VFLOW_CACHE_DIR"); dir && *dir)
    return dir;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/vflow";
  if (const char *home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/vflow";
  const char *tmp = std::getenv("TMPDIR");
  std::string base = tmp && *tmp ? tmp : "/tmp";
  return base + "/vflow-cache-" + std::to_string(::geteuid());
}

fs::path privateCacheDirectory(const std::string &root,
                               const std::string &backend) {
  if (root.empty())
    throw Error("vflow: the JIT cache directory is an empty path");
  fs::path rootPath = fs::path(root).lexically_normal();
  if (!rootPath.has_filename() && rootPath != rootPath.root_path())
    rootPath = rootPath.parent_path(); // "dir/": lstat must see "dir"
  // Every missing folder on the way is made private, like the root.
  fs::path partial;
  for (const fs::path &component : rootPath) {
    partial /= component;
    if (component.empty() || component == "/" || component == "." ||
        component == "..")
      continue;
    struct stat st;
    if (::lstat(partial.c_str(), &st) != 0)
      makeDirectory(partial);
  }
  checkPrivateDirectory(rootPath, /*mayBeLink=*/true);
  fs::path dir = rootPath / backend;
  privateSubdirectory(dir);
  return dir;
}

void privateSubdirectory(const fs::path &dir) {
  makeDirectory(dir);
  checkPrivateDirectory(dir, /*mayBeLink=*/false);
}

void writeAtomically(const fs::path &path, const char *data, size_t size) {
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(temporaryCounter++);
  int fd = ::open(tmp.c_str(),
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    throw Error("vflow: cannot create " + tmp.string() + ": " +
                errnoText(errno));
  bool ok = writeAll(fd, data, size);
  int err = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    throw Error("vflow: cannot write " + tmp.string() + ": " + errnoText(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    throw Error("vflow: cannot rename " + tmp.string() + " to " +
                path.string() + ": " + errnoText(err));
  }
}

bool readRegularFile(const fs::path &path, std::string &out, std::string &why) {
  struct stat st;
  int fd = openRegularFile(path, st, why);
  if (fd < 0)
    return false;
  bool ok = readOpenFile(fd, st, out, why);
  ::close(fd);
  return ok;
}

CacheEntry::CacheEntry(fs::path dir, std::string stem, std::string key,
                       std::vector<std::string> suffixes)
    : dir(std::move(dir)), stem(std::move(stem)), key(std::move(key)),
      suffixes(std::move(suffixes)) {}

CacheEntry::~CacheEntry() { closeFd(); }

void CacheEntry::closeFd() {
  if (fd >= 0)
    ::close(fd);
  fd = -1;
}

fs::path CacheEntry::file(size_t i) const { return dir / (stem + suffixes[i]); }

fs::path CacheEntry::manifest() const { return dir / (stem + ".sum"); }

std::string
CacheEntry::manifestText(const std::vector<std::string> &contents) const {
  std::string text = "vflow-jit-entry 1 key=" + key + "\n";
  for (size_t i = 0; i < suffixes.size(); ++i)
    text += "file=" + stem + suffixes[i] +
            " bytes=" + std::to_string(contents[i].size()) +
            " sha256=" + sha256Hex(contents[i]) + "\n";
  return text;
}

bool CacheEntry::read() {
  closeFd();
  bytes.clear();
  why.clear();
  std::string listed, problem;
  bool haveManifest = readRegularFile(manifest(), listed, problem);
  if (!haveManifest && !problem.empty()) {
    why = manifest().filename().string() + ": " + problem;
    return false;
  }
  std::vector<std::string> contents(suffixes.size());
  for (size_t i = 0; i < suffixes.size(); ++i) {
    // Problems of the object read "it is ...", of the others "<file>: ...".
    std::string which = i == 0 ? "" : file(i).filename().string() + ": ";
    struct stat st;
    int opened = openRegularFile(file(i), st, problem);
    if (opened < 0) {
      if (!problem.empty())
        why = which + problem;
      else if (haveManifest || i > 0)
        why = which + "it is missing";
      // else: no object and no manifest, no entry.
      closeFd();
      return false;
    }
    bool ok = readOpenFile(opened, st, contents[i], problem);
    if (ok && i == 0)
      fd = opened;
    else
      ::close(opened);
    if (!ok) {
      why = which + problem;
      closeFd();
      return false;
    }
  }
  if (!haveManifest) {
    why = "it has no manifest " + manifest().filename().string();
    closeFd();
    return false;
  }
  std::string expected = manifestText(contents);
  if (listed != expected) {
    // Say which part differs, for the message.
    std::istringstream want(expected), got(listed);
    std::string wantLine, gotLine;
    std::getline(want, wantLine);
    std::getline(got, gotLine);
    if (gotLine.compare(0, 18, "vflow-jit-entry 1 ") != 0)
      why = "its manifest " + manifest().filename().string() + " is malformed";
    else if (gotLine != wantLine)
      why = "its manifest was written for another key";
    else {
      why = "its manifest does not match it";
      for (size_t i = 0; i < suffixes.size(); ++i) {
        std::getline(want, wantLine);
        std::getline(got, gotLine);
        if (gotLine == wantLine)
          continue;
        std::string size = " bytes=" + std::to_string(contents[i].size()) + " ";
        why = (i == 0 ? "" : file(i).filename().string() + ": ") +
              (gotLine.find(size) == std::string::npos
                   ? "size mismatch: " + std::to_string(contents[i].size()) +
                         " bytes on disk, not the manifest's"
                   : "SHA-256 mismatch: its content is not what was "
                     "written");
        break;
      }
    }
    closeFd();
    return false;
  }
  bytes = std::move(contents);
  return true;
}

void CacheEntry::discard(bool quiet) {
  if (!quiet)
    std::fprintf(stderr,
                 "vflow: the cached entry %s is invalid (%s); rebuilding it\n",
                 file(0).c_str(), why.c_str());
  closeFd();
  bytes.clear();
  std::vector<fs::path> paths;
  for (size_t i = 0; i < suffixes.size(); ++i)
    paths.push_back(file(i));
  paths.push_back(manifest());
  for (const fs::path &path : paths)
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      throw Error("vflow: cannot remove the invalid JIT cache entry " +
                  path.string() + ": " + errnoText(errno) +
                  "; remove it by hand");
}

void CacheEntry::write(const std::vector<std::string> &contents) {
  if (contents.size() != suffixes.size())
    throw Error("vflow: internal error: a JIT cache entry of " +
                std::to_string(suffixes.size()) + " files written with " +
                std::to_string(contents.size()));
  for (size_t i = 0; i < suffixes.size(); ++i)
    writeAtomically(file(i), contents[i]);
  // The manifest last: until it is there, the entry is not valid.
  writeAtomically(manifest(), manifestText(contents));
}

void *openCheckedLibrary(int fd, const fs::path &path, std::string &why) {
  // A name given to dlopen stays attached to the library it loaded (glibc
  // answers a later dlopen of the same name with it), so a
  // /proc/self/fd/<n> name must never mean another file: each checked file
  // keeps one descriptor open for the life of the process.
  static std::mutex mutex;
  static std::map<std::pair<dev_t, ino_t>, int> pinned;
  struct stat st;
  void *handle = nullptr;
  if (::fstat(fd, &st) == 0) {
    std::lock_guard<std::mutex> hold(mutex);
    auto [it, inserted] = pinned.try_emplace({st.st_dev, st.st_ino}, -1);
    if (inserted)
      it->second = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    std::string name = "/proc/self/fd/" + std::to_string(it->second);
    struct stat viaProc;
    if (it->second >= 0 && ::stat(name.c_str(), &viaProc) == 0 &&
        viaProc.st_dev == st.st_dev && viaProc.st_ino == st.st_ino) {
      handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        const char *reason = ::dlerror();
        why = reason ? reason : "unknown error";
      }
      return handle;
    }
    if (inserted) {
      if (it->second >= 0)
        ::close(it->second);
      pinned.erase(it);
    }
  }
  // No /proc: load by name (the file was checked just before).
  handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *reason = ::dlerror();
    why = reason ? reason : "unknown error";
  }
  return handle;
}

FileLock::FileLock(const fs::path &path, const std::string &what,
                   double timeoutSeconds) {
  fd = ::open(path.c_str(),
              O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0)
    throw Error("vflow: cannot open the JIT cache lock " + path.string() +
                ": " +
                (errno == ELOOP ? std::string("it is a symbolic link")
                                : errnoText(errno)) +
                "; delete it if no vflow process is running");
  struct stat st = {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("vflow: the JIT cache lock " + path.string() + " is " +
                fileKind(st.st_mode) + ", not a regular file; delete it");
  }
  Clock::time_point start = Clock::now();
  bool told = false;
  double pause = 0.002;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (err == EINTR)
      continue;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      throw Error("vflow: cannot lock " + path.string() + ": " +
                  errnoText(err));
    }
    double waited = secondsSince(start);
    if (waited >= timeoutSeconds) {
      ::close(fd);
      throw Error("vflow: gave up after " + secondsText(timeoutSeconds) +
                  " waiting for the JIT cache lock " + path.string() +
                  ", held by another process compiling " + what +
                  "; if no vflow process is running, delete the lock file "
                  "(VFLOW_JIT_TIMEOUT sets the limit)");
    }
    if (!told && waited >= 2) {
      std::fprintf(stderr,
                   "vflow: waiting for another process compiling %s (lock "
                   "%s)...\n",
                   what.c_str(), path.c_str());
      told = true;
    }
    sleepSeconds(std::min(pause, timeoutSeconds - waited));
    pause = std::min(pause * 2, 0.05);
  }
}

FileLock::~FileLock() {
  ::flock(fd, LOCK_UN);
  ::close(fd);
}

CommandResult runShellCommand(const std::string &command,
                              double timeoutSeconds) {
  constexpr size_t kMaxOutput = 1 << 20;
  int pipeFds[2];
  if (::pipe2(pipeFds, O_CLOEXEC) != 0)
    throw Error("vflow: cannot run `" + command +
                "`: pipe: " + errnoText(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipeFds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipeFds[1], 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // Its own process group, so that a timeout kills what it started too;
  // default signal handling whatever this process does.
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP |
                                            POSIX_SPAWN_SETSIGDEF |
                                            POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attributes, 0);
  sigset_t defaults, none;
  sigemptyset(&defaults);
  for (int signal : {SIGPIPE, SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGCHLD})
    sigaddset(&defaults, signal);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &none);
  std::string shell = "sh", dashC = "-c", text = command;
  char *argv[] = {shell.data(), dashC.data(), text.data(), nullptr};
  pid_t pid = -1;
  int spawned =
      ::posix_spawn(&pid, "/bin/sh", &actions, &attributes, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(pipeFds[1]);
  if (spawned != 0) {
    ::close(pipeFds[0]);
    throw Error("vflow: cannot run `" + command +
                "`: /bin/sh: " + errnoText(spawned));
  }

  CommandResult result;
  Clock::time_point start = Clock::now();
  bool open = true, exited = false;
  int status = 0;
  char buffer[4096];
  while (open || !exited) {
    double left = timeoutSeconds - secondsSince(start);
    if (left <= 0) {
      result.timedOut = true;
      break;
    }
    int waitMs = static_cast<int>(std::ceil(std::min(left, 0.1) * 1000));
    if (open) {
      struct pollfd ready = {pipeFds[0], POLLIN, 0};
      int n = ::poll(&ready, 1, exited ? waitMs : std::min(waitMs, 20));
      if (n > 0) {
        ssize_t got = ::read(pipeFds[0], buffer, sizeof(buffer));
        if (got > 0 && result.output.size() < kMaxOutput)
          result.output.append(buffer, static_cast<size_t>(got));
        else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN))
          open = false;
      }
    } else {
      sleepSeconds(std::min(left, 0.005));
    }
    if (!exited) {
      pid_t done = ::waitpid(pid, &status, WNOHANG);
      if (done == pid || (done < 0 && errno == ECHILD))
        exited = true;
    }
  }
  ::close(pipeFds[0]);
  if (result.timedOut) {
    ::killpg(pid, SIGKILL);
    if (!exited) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    result.status = 128 + SIGKILL;
    return result;
  }
  result.status = WIFEXITED(status)     ? WEXITSTATUS(status)
                  : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                        : -1;
  return result;
}

} // namespace jit
} // namespace rt
} // namespace vflow
