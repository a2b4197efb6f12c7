//===- JitCacheTest.h - Fixture and helpers of the JIT cache tests -*- C++
//-*-===//
//
// Shared by the tests of the two JIT caches, the host compiler's
// (tests/cpu/HostJitTest.cpp) and NVRTC's (tests/cuda): a fresh cache
// directory per test, files replaced the way a crash or another process
// would, and a cache lock held by "another process" (and what a compile
// waiting on it must say).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMMON_JITCACHETEST_H
#define VFLOW_TESTS_COMMON_JITCACHETEST_H

#include "ChildProcess.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace vflow::testing {

/// A fresh cache directory per test (named for the process and the test),
/// removed afterwards; options() compile quietly into it. `Options` is the
/// JIT's options struct (rt::HostJitOptions, rt::cuda::NvrtcOptions).
template <typename Options> class JitCacheTest : public ::testing::Test {
protected:
  /// `label` names the JIT in the directory's name ("hostjit", "cudajit").
  explicit JitCacheTest(const char *label) : label(label) {}
  void SetUp() override {
    dir = ::testing::TempDir() + "vflow-" + label + "-" +
          std::to_string(static_cast<long>(::getpid())) + "-" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  Options options() const {
    Options o;
    o.cacheDir = dir;
    o.quiet = true;
    return o;
  }
  /// options() with the cache's messages on (what some tests check).
  Options loudOptions() const {
    Options o = options();
    o.quiet = false;
    return o;
  }
  std::string dir;

private:
  const char *label;
};

/// Replaces `path` by a new file holding `bytes` (a new inode, so a library
/// this process still maps is never changed under it).
inline void replaceFile(const std::string &path, const std::string &bytes) {
  std::string tmp = path + ".test-tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << bytes;
  }
  std::filesystem::rename(tmp, path);
}

/// Runs `body` in a child process (runInChild, with `limit` seconds) while
/// this process holds the cache lock `lockPath`, as another process
/// compiling would. Returns the child's output and sets `seconds` to how
/// long it took; the output says so when the lock could not be taken.
inline std::string runWhileLocked(const std::string &lockPath, double limit,
                                  const std::function<std::string()> &body,
                                  double &seconds) {
  seconds = 0;
  int fd = ::open(lockPath.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 || ::flock(fd, LOCK_EX) != 0) {
    if (fd >= 0)
      ::close(fd);
    return "cannot lock " + lockPath;
  }
  auto start = std::chrono::steady_clock::now();
  std::string out = runInChild(limit, body);
  seconds = secondsSince(start);
  ::close(fd);
  return out;
}

/// Runs `compile` (a compile whose lock timeout is `timeout` seconds) in a
/// child process while the cache lock `lockPath` is held, as by another
/// process: it gives up after `minSeconds` to 20 s with the error "gave up
/// after <timeout> s waiting for the JIT cache lock <lockPath><then>".
/// Returns what the child printed.
inline std::string expectLockTimeout(const std::string &lockPath,
                                     double timeout, double minSeconds,
                                     const std::string &then,
                                     const std::function<void()> &compile) {
  double seconds;
  std::string out = runWhileLocked(
      lockPath, 60,
      [&] {
        compile();
        return std::string("compiled");
      },
      seconds);
  char after[32];
  std::snprintf(after, sizeof(after), "%g", timeout);
  EXPECT_NE(out.find(std::string("error: vflow: gave up after ") + after +
                     " s waiting for the JIT cache lock " + lockPath + then),
            std::string::npos)
      << out;
  EXPECT_GE(seconds, minSeconds);
  EXPECT_LT(seconds, 20);
  return out;
}

} // namespace vflow::testing

#endif // VFLOW_TESTS_COMMON_JITCACHETEST_H
