//===- FuzzDriver.h - The loop the child-process fuzzers share --*- C++ -*-===//
//
// What tests/fuzz/BackendFuzz.cpp and LoaderFuzz.cpp share around their own
// cases: the command line (--seconds, --seed, --iterations, --memory-gib, a
// per-case time limit, --keep, --case, and flags of their own), a private
// work directory, and the loop that runs case after case in a child process
// (ChildProcess.h's runLimited), counts how they ended and stops at the
// first failure.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMMON_FUZZDRIVER_H
#define VFLOW_TESTS_COMMON_FUZZDRIVER_H

#include "ChildProcess.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace vflow::testing {

struct FuzzOptions {
  /// --seconds: the wall time of the whole run; --case-seconds or
  /// --program-seconds: one case's time limit; --memory-gib: one case's
  /// address space.
  double seconds = 60, caseSeconds = 60, memoryGiB = 6;
  /// Case i's seed is seed * 1000003 + i; iterations 0: until --seconds.
  uint64_t seed = 1, iterations = 0;
  /// --case N: run case N in this process and print what it did.
  uint64_t only = 0;
  /// --keep DIR: where a failing case is written ("" for here).
  std::string keep;

  /// The directory --keep names, or ".".
  std::string keepDir() const { return keep.empty() ? "." : keep; }
  /// The child limits of one case.
  ChildLimits limits() const {
    ChildLimits l;
    l.memoryBytes = memoryGiB * double(1ull << 30);
    l.seconds = caseSeconds;
    return l;
  }
};

/// Flags a fuzzer adds to the shared ones: flags with a value (a string)
/// and switches.
struct FuzzFlags {
  std::map<std::string, std::string *> values;
  std::map<std::string, bool *> switches;
};

/// Reads the shared flags into `opt` (the per-case time limit is flag
/// `caseFlag`) and `extra`'s. Prints what is wrong and `usage` and returns
/// false for an unknown flag, a flag without its value, or a limit that is
/// not positive.
inline bool parseFuzzArgs(int argc, char **argv, const std::string &caseFlag,
                          const std::string &usage, FuzzOptions &opt,
                          const FuzzFlags &extra = {}) {
  std::map<std::string, std::function<void(const char *)>> set = {
      {"--seconds", [&](const char *v) { opt.seconds = std::atof(v); }},
      {"--seed",
       [&](const char *v) { opt.seed = std::strtoull(v, nullptr, 10); }},
      {"--iterations",
       [&](const char *v) { opt.iterations = std::strtoull(v, nullptr, 10); }},
      {"--memory-gib", [&](const char *v) { opt.memoryGiB = std::atof(v); }},
      {caseFlag, [&](const char *v) { opt.caseSeconds = std::atof(v); }},
      {"--keep", [&](const char *v) { opt.keep = v; }},
      {"--case",
       [&](const char *v) { opt.only = std::strtoull(v, nullptr, 10); }}};
  for (const auto &[flag, value] : extra.values)
    set[flag] = [value = value](const char *v) { *value = v; };
  bool ok = true;
  for (int i = 1; i < argc && ok; ++i) {
    std::string a = argv[i];
    if (auto s = extra.switches.find(a); s != extra.switches.end()) {
      *s->second = true;
    } else if (auto s = set.find(a); s == set.end()) {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      ok = false;
    } else if (i + 1 == argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      ok = false;
    } else {
      s->second(argv[++i]);
    }
  }
  ok = ok && opt.seconds > 0 && opt.memoryGiB > 0 && opt.caseSeconds > 0;
  if (!ok)
    std::fprintf(stderr, "usage: %s\n", usage.c_str());
  return ok;
}

/// A fresh directory /tmp/<name>-XXXXXX, removed with what is in it at the
/// end; ok() is false (after a message) when it could not be made.
class FuzzWorkDir {
public:
  explicit FuzzWorkDir(const std::string &name) {
    std::string pattern = "/tmp/" + name + "-XXXXXX";
    if (::mkdtemp(pattern.data()))
      dir = pattern;
    else
      std::perror("mkdtemp");
  }
  ~FuzzWorkDir() {
    std::error_code ec;
    if (!dir.empty())
      std::filesystem::remove_all(dir, ec);
  }
  FuzzWorkDir(const FuzzWorkDir &) = delete;
  FuzzWorkDir &operator=(const FuzzWorkDir &) = delete;
  bool ok() const { return !dir.empty(); }
  const std::string &str() const { return dir; }

private:
  std::string dir;
};

/// Runs case after case (`runCase(seed)` runs one in a child process) until
/// opt.iterations cases have run or opt.seconds have passed, counting how
/// they ended; at the first failure calls `keepFailure(seed, outcome)` and
/// stops. A `runCase` that throws (the fuzzer's own bug) stops the run too.
/// Prints "<name>: N <cases>: N ran, N refused with a clear error" and
/// returns the exit status: 0, 1 for a failing case, 2 for the fuzzer's bug.
inline int
runFuzzCases(const FuzzOptions &opt, const std::string &name,
             const std::string &cases,
             const std::function<ChildOutcome(uint64_t seed)> &runCase,
             const std::function<void(uint64_t seed, const ChildOutcome &)>
                 &keepFailure) {
  auto start = std::chrono::steady_clock::now();
  uint64_t runs = 0, ran = 0, refused = 0;
  int status = 0;
  for (uint64_t i = 0; opt.iterations == 0 || i < opt.iterations; ++i) {
    if (secondsSince(start) > opt.seconds)
      break;
    const uint64_t seed = opt.seed * 1000003ull + i;
    ChildOutcome outcome;
    try {
      outcome = runCase(seed);
    } catch (const std::exception &e) {
      std::fprintf(stderr, "%s: making case %llu: %s\n", name.c_str(),
                   (unsigned long long)seed, e.what());
      status = 2;
      break;
    }
    ++runs;
    if (outcome.kind == ChildOutcome::Kind::Failed) {
      keepFailure(seed, outcome);
      status = 1;
      break;
    }
    const bool finished = outcome.kind == ChildOutcome::Kind::Finished;
    ++(finished ? ran : refused);
    if (std::getenv("VFLOW_FUZZ_VERBOSE"))
      std::fprintf(
          stderr, "case %llu: %s\n", (unsigned long long)seed,
          finished ? "ran"
                   : ("refused: " + outcome.message.substr(0, 300)).c_str());
  }
  std::printf("%s: %llu %s: %llu ran, %llu refused with a clear error%s\n",
              name.c_str(), (unsigned long long)runs, cases.c_str(),
              (unsigned long long)ran, (unsigned long long)refused,
              status ? "; FAILED" : "");
  return status;
}

} // namespace vflow::testing

#endif // VFLOW_TESTS_COMMON_FUZZDRIVER_H
