//===- ChildProcess.h - Test helpers for code that might hang ---*- C++ -*-===//
//
// Shared by the JIT cache tests (tests/cpu/HostJitTest.cpp and
// tests/cuda/JitTest.cpp): run a piece of a test in a child process with a
// time limit, so that a regression that hangs fails instead of blocking CI.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMMON_CHILDPROCESS_H
#define VFLOW_TESTS_COMMON_CHILDPROCESS_H

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace vflow::testing {

inline double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

inline std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Runs `body` in a child process, so that a hang can be caught: returns
/// what the child wrote on stderr followed by what `body` returned (or
/// "error: <what>" when it threw), or ends with "TIMED OUT" when the child
/// has not finished after `seconds` (it is then killed).
inline std::string runInChild(double seconds,
                              const std::function<std::string()> &body) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return "pipe failed";
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 2);
    std::string text;
    try {
      text = body();
    } catch (const std::exception &e) {
      text = std::string("error: ") + e.what();
    }
    std::fflush(stderr);
    ssize_t ignored = ::write(2, text.data(), text.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  auto start = std::chrono::steady_clock::now();
  char buffer[4096];
  for (;;) {
    double left = seconds - secondsSince(start);
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      out += "TIMED OUT";
      break;
    }
    struct pollfd ready = {fds[0], POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(left * 1000) + 1) <= 0)
      continue;
    ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n <= 0)
      break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return out;
}

} // namespace vflow::testing

#endif // VFLOW_TESTS_COMMON_CHILDPROCESS_H
