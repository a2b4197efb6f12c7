//===- HostJit.cpp - Compile C++ to a shared object, cached on disk -------===//

#include "vflow/Runtime/HostJit.h"

#include "../JitSupport.h"
#include "vflow/Runtime/Error.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <dlfcn.h>
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

/// The headers generated code may include (as "vflow/Runtime/<name>").
const char *const kEmbeddedHeaderNames[] = {"KernelABI.h", "NumericRules.h",
                                            "Random.h"};

} // namespace

const std::string &HostJit::embeddedHeader(const std::string &name) {
  static const std::map<std::string, std::string> headers = {
      {"KernelABI.h", kKernelABIHeader},
      {"NumericRules.h", kNumericRulesHeader},
      {"Random.h", kRandomHeader}};
  auto it = headers.find(name);
  if (it == headers.end())
    throw Error("vflow: no embedded header '" + name + "'");
  return it->second;
}

std::string HostJit::defaultCacheDir() { return defaultCacheRoot(); }

HostJit::HostJit(const std::string &label, const std::string &source,
                 HostJitOptions options)
    : name(readableName(label)) {
  double timeout = jitTimeoutSeconds(options.timeoutSeconds);
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

  CacheKey headerKey;
  CacheKey key;
  key.add("vflow host jit 1");
  key.add(source);
  key.add(command);
  for (const char *header : kEmbeddedHeaderNames) {
    headerKey.add(embeddedHeader(header));
    key.add(embeddedHeader(header));
  }

  fs::path dir = privateCacheDirectory(
      options.cacheDir.empty() ? defaultCacheDir() : options.cacheDir,
      "cpu-v1");
  std::string stem = name + "-" + key.hex();
  CacheEntry entry(dir, stem, key.hex(), {".so"});
  path = entry.file(0).string();

  if (!entry.read()) {
    FileLock lock(dir / (stem + ".lock"), name, timeout);
    // Another process may have finished it while we waited.
    if (!entry.read()) {
      if (!entry.problem().empty())
        entry.discard(options.quiet);
      if (!options.quiet)
        std::fprintf(stderr,
                     "vflow: compiling %s for the CPU (cached in %s)...\n",
                     name.c_str(), dir.c_str());
      // The headers are rewritten before every compile: what the compiler
      // reads is exactly what the key covers.
      fs::path include = dir / ("include-" + headerKey.hex());
      fs::path runtime = include / "vflow" / "Runtime";
      for (const fs::path &folder : {include, include / "vflow", runtime})
        privateSubdirectory(folder);
      for (const char *header : kEmbeddedHeaderNames)
        writeAtomically(runtime / header, embeddedHeader(header));
      fs::path cpp = dir / (stem + ".cpp");
      writeAtomically(cpp, source);
      fs::path tmp = path + ".tmp." + std::to_string(::getpid());
      std::string full = command + " -I" + shellQuote(include.string()) +
                         " -o " + shellQuote(tmp.string()) + " " +
                         shellQuote(cpp.string());
      CommandResult run = runShellCommand(full, timeout);
      std::string object, why;
      bool produced =
          !run.timedOut && run.status == 0 && readRegularFile(tmp, object, why);
      std::error_code ec;
      fs::remove(tmp, ec);
      if (run.timedOut)
        throw Error("vflow: the host compiler did not finish compiling " +
                    name + " within " + secondsText(timeout) +
                    " and was killed (VFLOW_JIT_TIMEOUT or "
                    "HostJitOptions::timeoutSeconds sets the limit)\n" +
                    full + "\n" + run.output);
      if (run.status != 0)
        throw Error("vflow: the host compiler failed on " + name +
                    " (exit status " + std::to_string(run.status) + ")\n" +
                    full + "\n" + run.output);
      if (!produced)
        throw Error("vflow: the host compiler wrote no object for " + name +
                    " (" + tmp.string() + ": " +
                    (why.empty() ? "missing" : why) + ")\n" + full + "\n" +
                    run.output);
      entry.write({object});
      if (!entry.read())
        throw Error("vflow: the JIT cache entry " + path +
                    " does not check right after it was written (" +
                    entry.problem() + ")");
      compiled = true;
    }
  }
  std::string why;
  handle = openCheckedLibrary(entry.objectFd(), path, why);
  if (!handle)
    throw Error("vflow: cannot load " + path + ": " + why);
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
