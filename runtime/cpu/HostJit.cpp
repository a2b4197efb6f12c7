//===- HostJit.cpp - Compile C++ to a shared object, cached on disk -------===//

#include "vflow/Runtime/HostJit.h"

#include "../JitSupport.h"
#include "vflow/Runtime/Error.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace vflow::rt;
using namespace vflow::rt::jit;
namespace fs = std::filesystem;

namespace {

#include "EmbeddedHeaders.inc"

std::string shellQuote(const std::string &s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

/// Runs a shell command; returns its exit status and its output.
int runCommand(const std::string &command, std::string &output) {
  FILE *pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe)
    throw Error("vflow: cannot run the host compiler: " +
                std::string(std::strerror(errno)));
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    output.append(buffer, n);
  int status = ::pclose(pipe);
  if (status == -1)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

} // namespace

const std::string &HostJit::embeddedHeader(const std::string &name) {
  static const std::map<std::string, std::string> headers = {
      {"KernelABI.h", kKernelABIHeader}, {"Random.h", kRandomHeader}};
  auto it = headers.find(name);
  if (it == headers.end())
    throw Error("vflow: no embedded header '" + name + "'");
  return it->second;
}

std::string HostJit::defaultCacheDir() {
  if (const char *dir = std::getenv("VFLOW_CACHE_DIR"); dir && *dir)
    return dir;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/vflow";
  if (const char *home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/vflow";
  return (fs::temp_directory_path() / "vflow-cache").string();
}

HostJit::HostJit(const std::string &label, const std::string &source,
                 HostJitOptions options)
    : name(readableName(label)) {
  std::string compiler = options.compiler;
  if (compiler.empty()) {
    const char *cxx = std::getenv("CXX");
    compiler = cxx && *cxx ? cxx : "c++";
  }
  std::vector<std::string> flags = options.flags;
  if (flags.empty())
    flags = {"-O2"};
  std::string command = compiler;
  for (const std::string &flag : flags)
    command += " " + shellQuote(flag);
  command += " -std=c++17 -shared -fPIC -ffp-contract=off";

  const std::string &abi = embeddedHeader("KernelABI.h");
  const std::string &random = embeddedHeader("Random.h");
  Hasher headerHash;
  headerHash.add(abi);
  headerHash.add(random);
  Hasher key;
  key.add(source);
  key.add(command);
  key.add(abi);
  key.add(random);

  fs::path dir = fs::path(options.cacheDir.empty() ? defaultCacheDir()
                                                   : options.cacheDir) /
                 "cpu-v1";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error("vflow: cannot create the JIT cache directory " + dir.string() +
                ": " + ec.message());
  std::string stem = name + "-" + key.hex();
  fs::path library = dir / (stem + ".so");
  path = library.string();

  if (!fs::exists(library)) {
    FileLock lock(dir / (stem + ".lock"));
    // Another process may have finished it while we waited.
    if (!fs::exists(library)) {
      if (!options.quiet)
        std::fprintf(stderr,
                     "vflow: compiling %s for the CPU (cached in %s)...\n",
                     name.c_str(), dir.c_str());
      fs::path include = dir / ("include-" + headerHash.hex());
      fs::path runtime = include / "vflow" / "Runtime";
      fs::create_directories(runtime, ec);
      if (ec)
        throw Error("vflow: cannot create " + runtime.string() + ": " +
                    ec.message());
      for (const char *header : {"KernelABI.h", "Random.h"})
        if (!fs::exists(runtime / header))
          writeAtomically(runtime / header, embeddedHeader(header));
      fs::path cpp = dir / (stem + ".cpp");
      writeAtomically(cpp, source);
      fs::path tmp = library;
      tmp += ".tmp." + std::to_string(::getpid());
      std::string full = command + " -I" + shellQuote(include.string()) +
                         " -o " + shellQuote(tmp.string()) + " " +
                         shellQuote(cpp.string());
      std::string output;
      int status = runCommand(full, output);
      if (status != 0) {
        fs::remove(tmp, ec);
        throw Error("vflow: the host compiler failed on " + name +
                    " (exit status " + std::to_string(status) + ")\n" + full +
                    "\n" + output);
      }
      fs::rename(tmp, library, ec);
      if (ec)
        throw Error("vflow: cannot move the compiled object to " + path + ": " +
                    ec.message());
      compiled = true;
    }
  }
  handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = ::dlerror();
    throw Error("vflow: cannot load " + path + ": " +
                (why ? why : "unknown error") +
                " (delete the file to recompile it)");
  }
}

HostJit::~HostJit() {
  if (handle)
    ::dlclose(handle);
}

void *HostJit::lookupSymbol(const std::string &symbol) const {
  ::dlerror();
  void *address = ::dlsym(handle, symbol.c_str());
  const char *why = ::dlerror();
  if (why || !address)
    throw Error("vflow: " + path + " (" + name + ") has no symbol '" + symbol +
                "'" + (why ? std::string(": ") + why : std::string()));
  return address;
}
