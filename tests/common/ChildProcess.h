//===- ChildProcess.h - Test helpers for code that might hang ---*- C++ -*-===//
//
// Running a piece of a test in a child process, so that a hang, a crash or
// running out of memory fails the test instead of taking it down or
// blocking CI:
//   - runInChild: a time limit, what the child printed comes back (the JIT
//     cache tests, tests/cpu/HostJitTest.cpp and tests/cuda/JitTest.cpp);
//   - runLimited: a memory limit (RLIMIT_AS) and a time limit, the outcome
//     classified (finished, refused with a clear error, failed) for the
//     fuzzers (tests/fuzz/BackendFuzz.cpp, LoaderFuzz.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_COMMON_CHILDPROCESS_H
#define VFLOW_TESTS_COMMON_CHILDPROCESS_H

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
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

/// What became of a body runLimited ran.
struct ChildOutcome {
  enum class Kind {
    /// The body returned.
    Finished,
    /// It threw a std::runtime_error (vflow::rt::Error is one): a clear
    /// refusal; `message` is its what().
    Refused,
    /// It died from a signal (a crash, abort, the memory limit hit by the
    /// stack), ran past the time limit, ran out of memory (std::bad_alloc:
    /// limits are to be checked before allocating) or threw anything else;
    /// `message` says which.
    Failed,
  };
  Kind kind = Kind::Failed;
  std::string message;
};

struct ChildLimits {
  /// The child's address space (RLIMIT_AS), bytes; 0: none.
  double memoryBytes = 0;
  /// Wall-clock seconds before the child's process group is killed.
  double seconds = 60;
  /// Keep the child's stdout and stderr (else they go to /dev/null; the
  /// environment variable VFLOW_FUZZ_CHILD_OUTPUT keeps them too).
  bool keepOutput = false;
};

/// Runs `body` in a child process (its own process group) under `limits`
/// and classifies how it ended (ChildOutcome). The refusal's message comes
/// back through a pipe (its first 4096 bytes).
inline ChildOutcome runLimited(const std::function<void()> &body,
                               const ChildLimits &limits) {
  // Exit codes of the child.
  constexpr int kFinished = 0, kRefused = 10, kUnexpected = 20;
  constexpr size_t kMessageBytes = 4096;
  ChildOutcome result;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result.message = "pipe failed";
    return result;
  }
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    result.message = "fork failed";
    return result;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::close(fds[0]);
    if (limits.memoryBytes > 0) {
      rlimit mem{rlim_t(limits.memoryBytes), rlim_t(limits.memoryBytes)};
      ::setrlimit(RLIMIT_AS, &mem);
    }
    if (!limits.keepOutput && !std::getenv("VFLOW_FUZZ_CHILD_OUTPUT")) {
      if (!std::freopen("/dev/null", "w", stdout) ||
          !std::freopen("/dev/null", "w", stderr))
        ::_exit(kUnexpected);
    }
    auto report = [&](int code, const std::string &text) {
      ssize_t ignored =
          ::write(fds[1], text.data(), std::min(text.size(), kMessageBytes));
      (void)ignored;
      std::fflush(nullptr);
      ::_exit(code);
    };
    try {
      body();
      report(kFinished, "");
    } catch (const std::bad_alloc &) {
      report(kUnexpected, "std::bad_alloc (ran out of memory: an "
                          "allocation was not bounded before it was made)");
    } catch (const std::runtime_error &e) {
      report(kRefused, e.what());
    } catch (const std::exception &e) {
      report(kUnexpected, std::string("an unexpected exception: ") + e.what());
    } catch (...) {
      report(kUnexpected, "an exception not derived from std::exception");
    }
  }
  ::close(fds[1]);
  auto start = std::chrono::steady_clock::now();
  std::string message;
  int status = 0;
  bool timedOut = false;
  char buffer[4096];
  for (;;) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid)
      break;
    if (secondsSince(start) > limits.seconds) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timedOut = true;
      break;
    }
    // Drain the pipe while waiting (a message never fills it, but a body
    // that forks could keep it open); poll doubles as the sleep.
    struct pollfd ready = {fds[0], POLLIN, 0};
    if (::poll(&ready, 1, 20) > 0 && (ready.revents & POLLIN)) {
      ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
      if (n > 0)
        message.append(buffer, size_t(n));
    }
  }
  for (;;) {
    struct pollfd ready = {fds[0], POLLIN, 0};
    if (::poll(&ready, 1, 0) <= 0)
      break;
    ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n <= 0)
      break;
    message.append(buffer, size_t(n));
  }
  ::close(fds[0]);
  if (timedOut) {
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", limits.seconds);
    result.message =
        std::string("ran past the time limit of ") + seconds + " s";
    return result;
  }
  if (WIFSIGNALED(status)) {
    result.message = "died from signal " + std::to_string(WTERMSIG(status)) +
                     " (" + strsignal(WTERMSIG(status)) + ")";
    return result;
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == kFinished) {
    result.kind = ChildOutcome::Kind::Finished;
  } else if (code == kRefused) {
    result.kind = ChildOutcome::Kind::Refused;
    result.message = message;
  } else {
    result.message = "exit " + std::to_string(code) + ": " + message;
  }
  return result;
}

} // namespace vflow::testing

#endif // VFLOW_TESTS_COMMON_CHILDPROCESS_H
