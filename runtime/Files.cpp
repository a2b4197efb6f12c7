//===- Files.cpp - Writing user files without losing what was there -------===//

#include "vflow/Runtime/Files.h"
#include "vflow/Runtime/Error.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace vflow::rt;

std::string vflow::rt::errnoText(int errnum) { return std::strerror(errnum); }

namespace {

/// The directory part of `path` ("." when it has none).
std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string baseNameOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

mode_t currentUmask() {
  mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

bool writeAll(int fd, const std::string &bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

} // namespace

void vflow::rt::checkPathText(const std::string &path,
                              const std::string &what) {
  if (path.empty())
    throw Error(what + ": the path is empty");
  size_t nul = path.find('\0');
  if (nul == std::string::npos)
    return;
  std::string shown;
  for (char c : path.substr(0, 200))
    shown += c == '\0' ? std::string("\\0") : std::string(1, c);
  throw Error(what + ": the path '" + shown + "' holds a NUL byte at offset " +
              std::to_string(nul) + "; a file name cannot contain one");
}

void vflow::rt::writeFileAtomically(const std::string &path,
                                    const std::string &bytes) {
  if (path.empty())
    throw Error("cannot write a file with an empty name");
  checkPathText(path, "cannot write '" + path.substr(0, path.find('\0')) + "'");
  struct stat target;
  bool exists = ::stat(path.c_str(), &target) == 0;
  if (exists && !S_ISREG(target.st_mode))
    throw Error("cannot write '" + path +
                "': it exists and is not a regular "
                "file");
  std::string pattern =
      directoryOf(path) + "/." + baseNameOf(path) + ".tmp-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0)
    throw Error("cannot write '" + path +
                "': cannot create a temporary file "
                "next to it: " +
                errnoText(errno));
  std::string tmp(name.data());
  auto fail = [&](const std::string &why) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + path + "': " + why +
                (err ? ": " + errnoText(err) : std::string()));
  };
  mode_t mode = exists ? (target.st_mode & 07777) : (0666 & ~currentUmask());
  errno = 0;
  if (::fchmod(fd, mode) != 0)
    fail("cannot set its permissions");
  if (!writeAll(fd, bytes))
    fail("writing failed");
  if (::fsync(fd) != 0)
    fail("flushing failed");
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + path +
                "': closing failed: " + errnoText(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + path + "': " + errnoText(err));
  }
}

bool vflow::rt::sameFile(const std::string &a, const std::string &b) {
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0)
    return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
