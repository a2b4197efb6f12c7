//===- JitSupport.cpp - dlopen and on-disk cache helpers ------------------===//

#include "JitSupport.h"
#include "vflow/Runtime/Error.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace vflow {
namespace rt {
namespace jit {

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

void Hasher::add(const std::string &text) {
  for (unsigned char c : text) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ c) * 0x100000001b3ull;
    b ^= b >> 29;
  }
  a = (a ^ 0xff) * 0x100000001b3ull;
  b = (b ^ 0xff) * 0x100000001b3ull;
}

std::string Hasher::hex() const {
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "%016llx%016llx",
                static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return buffer;
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

void createDirectories(const fs::path &dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error("vflow: cannot create the JIT cache directory " + dir.string() +
                ": " + ec.message());
}

void writeAtomically(const fs::path &path, const char *data, size_t size) {
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(data, static_cast<std::streamsize>(size));
    if (!out)
      throw Error("vflow: cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error("vflow: cannot rename " + tmp.string() + " to " +
                path.string() + ": " + ec.message());
  }
}

template <typename Bytes> bool readFile(const fs::path &path, Bytes &out) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in)
    return false;
  std::streamoff size = in.tellg();
  if (size < 0)
    return false;
  out.resize(static_cast<size_t>(size));
  in.seekg(0);
  return static_cast<bool>(in.read(out.data(), size));
}
template bool readFile(const fs::path &, std::string &);
template bool readFile(const fs::path &, std::vector<char> &);

FileLock::FileLock(const fs::path &path) {
  fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error("vflow: cannot open the JIT cache lock " + path.string() +
                ": " + std::strerror(errno));
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      int err = errno;
      ::close(fd);
      throw Error("vflow: cannot lock " + path.string() + ": " +
                  std::strerror(err));
    }
  }
}

FileLock::~FileLock() {
  ::flock(fd, LOCK_UN);
  ::close(fd);
}

} // namespace jit
} // namespace rt
} // namespace vflow
