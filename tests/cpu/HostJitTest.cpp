//===- HostJitTest.cpp - The host JIT and the kernel ABI helpers ----------===//

#include "vflow/Runtime/HostJit.h"
#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/KernelABI.h"
#include "vflow/Runtime/Random.h"
#include "vflow/Runtime/Sha256.h"

#include "../common/JitCacheTest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace vflow;
namespace fs = std::filesystem;

using vflow::rules::bitsFloat;
using vflow::rules::floatBits;
using vflow::testing::expectLockTimeout;
using vflow::testing::readText;
using vflow::testing::replaceFile;
using vflow::testing::runInChild;
using vflow::testing::secondsSince;

namespace {

const char *kSource = R"(#include "vflow/Runtime/KernelABI.h"
#include "vflow/Runtime/Random.h"
#include "vflow/Runtime/Random.h"
extern "C" float twice(float x) { return vflow::kabi::mul(x, 2.0f); }
extern "C" float firstGaussian() { return vflow::rt::gaussianValues(3, 1)[0]; }
)";

/// The same functions with other results: another cache entry.
const char *kOtherSource = R"(extern "C" float twice(float x) { return x * 3; }
extern "C" float firstGaussian() { return 0; }
)";

/// A fresh cache directory per test, removed afterwards.
class HostJitTest : public vflow::testing::JitCacheTest<rt::HostJitOptions> {
protected:
  HostJitTest() : JitCacheTest("hostjit") {}
  /// Compiles kSource once (into the cache) and returns its object's path.
  std::string coldLibrary() const {
    rt::HostJit cold("twice", kSource, options());
    return cold.libraryPath();
  }
  /// Loads kSource with the cache's messages on, expects it rebuilt (not
  /// taken from the cache) and working; returns the messages.
  std::string rebuildLoudly() const {
    ::testing::internal::CaptureStderr();
    {
      rt::HostJit jit("twice", kSource, loudOptions());
      EXPECT_TRUE(jit.compiledNow());
      EXPECT_EQ(jit.lookup<float (*)(float)>("twice")(1.5f), 3.0f);
    }
    return ::testing::internal::GetCapturedStderr();
  }
};

/// Sets (or, with null, unsets) an environment variable for one scope.
class ScopedEnv {
public:
  ScopedEnv(const char *name, const char *value) : name(name) {
    const char *old = std::getenv(name);
    had = old != nullptr;
    if (had)
      saved = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had)
      ::setenv(name, saved.c_str(), 1);
    else
      ::unsetenv(name);
  }

private:
  const char *name;
  bool had = false;
  std::string saved;
};

/// Both roundings agree bit for bit (NaN: both NaN with the same bits).
void expectSameRounding(uint32_t bits, int &failures) {
  float x = bitsFloat(bits);
  struct {
    rt::DType type;
    float (*fn)(float);
  } cases[] = {{rt::DType::BF16, kabi::roundBF16},
               {rt::DType::F16, kabi::roundF16},
               {rt::DType::FP8E4M3, kabi::roundFP8E4M3},
               {rt::DType::FP8E5M2, kabi::roundFP8E5M2},
               {rt::DType::F32, kabi::roundF32}};
  for (const auto &c : cases) {
    uint32_t want = floatBits(rt::roundToDType(c.type, x));
    uint32_t got = floatBits(c.fn(x));
    if (want != got && failures++ < 10)
      ADD_FAILURE() << rt::dtypeName(c.type) << " of 0x" << std::hex << bits
                    << ": runtime 0x" << want << ", KernelABI.h 0x" << got;
  }
}

} // namespace

TEST_F(HostJitTest, CompilesLoadsAndHitsTheCache) {
  auto start = std::chrono::steady_clock::now();
  rt::HostJit cold("twice", kSource, options());
  EXPECT_TRUE(cold.compiledNow());
  EXPECT_TRUE(fs::exists(cold.libraryPath()));
  EXPECT_EQ(cold.libraryPath().rfind(dir + "/cpu-v1/twice-", 0), 0u)
      << cold.libraryPath();
  auto twice = cold.lookup<float (*)(float)>("twice");
  EXPECT_EQ(twice(1.5f), 3.0f);
  auto gauss = cold.lookup<float (*)()>("firstGaussian");
  EXPECT_EQ(gauss(), rt::gaussianValues(3, 1)[0]);
  double coldSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  start = std::chrono::steady_clock::now();
  rt::HostJit warm("twice", kSource, options());
  double warmSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_FALSE(warm.compiledNow());
  EXPECT_EQ(warm.libraryPath(), cold.libraryPath());
  EXPECT_LT(warmSeconds, 0.1);
  EXPECT_LT(warmSeconds, coldSeconds);
  EXPECT_EQ(warm.lookup<float (*)(float)>("twice")(2.0f), 4.0f);

  // Another source is another object.
  rt::HostJit other("twice", std::string(kSource) + "// changed\n", options());
  EXPECT_TRUE(other.compiledNow());
  EXPECT_NE(other.libraryPath(), cold.libraryPath());
  // The headers were written next to the objects.
  bool found = false;
  for (const auto &entry : fs::recursive_directory_iterator(dir))
    found |= entry.path().filename() == "KernelABI.h";
  EXPECT_TRUE(found);
}

TEST_F(HostJitTest, ReportsCompileErrors) {
  try {
    rt::HostJit bad("broken", "extern \"C\" int f() { return undeclared; }\n",
                    options());
    FAIL() << "a broken source compiled";
  } catch (const rt::Error &e) {
    std::string what = e.what();
    EXPECT_NE(what.find("host compiler failed on broken"), std::string::npos)
        << what;
    EXPECT_NE(what.find("undeclared"), std::string::npos) << what;
  }
}

TEST_F(HostJitTest, RejectsMissingSymbols) {
  rt::HostJit jit("twice", kSource, options());
  try {
    jit.lookupSymbol("vflow_nothing_index");
    FAIL() << "found a missing symbol";
  } catch (const rt::Error &e) {
    EXPECT_NE(std::string(e.what()).find("no symbol 'vflow_nothing_index'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(HostJitTest, EmbedsTheHeaders) {
  EXPECT_NE(rt::HostJit::embeddedHeader("KernelABI.h").find("VflowIndexArgs"),
            std::string::npos);
  EXPECT_NE(rt::HostJit::embeddedHeader("Random.h").find("SplitMix64"),
            std::string::npos);
  EXPECT_THROW(rt::HostJit::embeddedHeader("Nope.h"), rt::Error);
}

// The cache: what is on disk is used only when it is exactly what was
// built for this input (docs/backends.md, "The JIT cache").

TEST_F(HostJitTest, WritesAManifestForEachObject) {
  rt::HostJit jit("twice", kSource, options());
  std::string library = jit.libraryPath();
  ASSERT_EQ(fs::path(library).extension(), ".so");
  std::string stem = fs::path(library).stem().string();
  EXPECT_EQ(stem.size(), std::string("twice-").size() + 64) << stem;
  std::string manifest = readText(dir + "/cpu-v1/" + stem + ".sum");
  std::string object = readText(library);
  EXPECT_EQ(manifest, "vflow-jit-entry 1 key=" + stem.substr(6) + "\nfile=" +
                          stem + ".so bytes=" + std::to_string(object.size()) +
                          " sha256=" + rt::sha256Hex(object) + "\n");
  // Private: the folders are 0700, the files 0600.
  struct stat st;
  for (const std::string &folder : {dir, dir + "/cpu-v1"}) {
    ASSERT_EQ(::lstat(folder.c_str(), &st), 0) << folder;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << folder;
  }
  ASSERT_EQ(::lstat(library.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(HostJitTest, PlantedObjectIsNeverLoaded) {
  std::string library = coldLibrary();
  // A library whose constructor leaves a marker file, built outside vflow,
  // planted in place of the cached object.
  std::string marker = dir + "/planted-ran";
  std::string planted = dir + "/planted.so";
  {
    std::ofstream out(dir + "/planted.cpp");
    out << "#include <cstdio>\n"
           "__attribute__((constructor)) static void plant() {\n"
           "  if (FILE *f = std::fopen(\""
        << marker
        << "\", \"w\")) std::fclose(f);\n"
           "}\n"
           "extern \"C\" float twice(float) { return 1000; }\n";
  }
  const char *cxx = std::getenv("CXX");
  std::string build = std::string(cxx && *cxx ? cxx : "c++") +
                      " -shared -fPIC -o " + planted + " " + dir +
                      "/planted.cpp";
  ASSERT_EQ(std::system(build.c_str()), 0) << build;
  replaceFile(library, readText(planted));

  std::string messages = rebuildLoudly();
  EXPECT_FALSE(fs::exists(marker)) << "the planted library ran";
  EXPECT_NE(
      messages.find("vflow: the cached entry " + library + " is invalid ("),
      std::string::npos)
      << messages;
  EXPECT_NE(messages.find("); rebuilding it\n"), std::string::npos) << messages;
  EXPECT_NE(messages.find("vflow: compiling twice for the CPU"),
            std::string::npos)
      << messages;

  // The planted library does run its constructor when loaded, so the
  // marker check above can fail.
  void *handle = ::dlopen(planted.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << ::dlerror();
  EXPECT_TRUE(fs::exists(marker));
  ::dlclose(handle);
}

TEST_F(HostJitTest, ChangedByteIsAHashMismatch) {
  std::string library = coldLibrary();
  std::string bytes = readText(library);
  bytes[bytes.size() / 2] ^= 0x5a;
  replaceFile(library, bytes);
  std::string messages = rebuildLoudly();
  EXPECT_NE(messages.find("is invalid (SHA-256 mismatch"), std::string::npos)
      << messages;
  // Rebuilt: the next one is a clean hit.
  ::testing::internal::CaptureStderr();
  rt::HostJit again("twice", kSource, loudOptions());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_FALSE(again.compiledNow());
}

TEST_F(HostJitTest, AnotherEntrysObjectAndManifestAreRejected) {
  std::string mine, other;
  {
    rt::HostJit a("twice", kSource, options());
    rt::HostJit b("twice", kOtherSource, options());
    EXPECT_EQ(b.lookup<float (*)(float)>("twice")(1.5f), 4.5f);
    mine = a.libraryPath();
    other = b.libraryPath();
  }
  ASSERT_NE(mine, other);
  // A valid entry of another key, object and manifest, in place of ours:
  // the same name, the same kind of build, another input.
  auto sum = [](const std::string &so) {
    return so.substr(0, so.size() - 3) + ".sum";
  };
  replaceFile(mine, readText(other));
  replaceFile(sum(mine), readText(sum(other)));
  std::string messages = rebuildLoudly();
  EXPECT_NE(messages.find("its manifest was written for another key"),
            std::string::npos)
      << messages;
}

TEST_F(HostJitTest, TruncatedOrUnlistedObjectIsRebuilt) {
  std::string library = coldLibrary();
  std::string bytes = readText(library);
  replaceFile(library, bytes.substr(0, bytes.size() / 3));
  std::string messages = rebuildLoudly();
  EXPECT_NE(messages.find("is invalid (size mismatch: " +
                          std::to_string(bytes.size() / 3) + " bytes on disk"),
            std::string::npos)
      << messages;

  // An object without its manifest (as a crash between the two writes, or
  // an older vflow, would leave it) is not used either.
  fs::remove(library.substr(0, library.size() - 3) + ".sum");
  messages = rebuildLoudly();
  EXPECT_NE(messages.find("is invalid (it has no manifest"), std::string::npos)
      << messages;
}

TEST_F(HostJitTest, FifoInPlaceOfTheObjectIsReplacedWithoutWaiting) {
  std::string library = coldLibrary();
  fs::remove(library);
  ASSERT_EQ(::mkfifo(library.c_str(), 0600), 0);
  auto start = std::chrono::steady_clock::now();
  std::string out = runInChild(60, [&] {
    rt::HostJit jit("twice", kSource, loudOptions());
    return "result " +
           std::to_string(jit.lookup<float (*)(float)>("twice")(1.5f));
  });
  EXPECT_EQ(out.find("TIMED OUT"), std::string::npos) << out;
  EXPECT_NE(out.find("is invalid (it is a FIFO, not a regular file)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("result 3.0"), std::string::npos) << out;
  EXPECT_LT(secondsSince(start), 30);
  struct stat st;
  ASSERT_EQ(::lstat(library.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));

  // A directory there cannot be replaced: an error that names it.
  fs::remove(library);
  fs::create_directory(library);
  try {
    rt::HostJit jit("twice", kSource, options());
    FAIL() << "loaded past a directory";
  } catch (const rt::Error &e) {
    std::string what = e.what();
    EXPECT_NE(what.find("cannot remove the invalid JIT cache entry " + library),
              std::string::npos)
        << what;
  }
}

TEST_F(HostJitTest, LockHeldByAnotherProcessTimesOut) {
  std::string library = coldLibrary();
  std::string stem = library.substr(0, library.size() - 3);
  fs::remove(library);
  fs::remove(stem + ".sum");
  std::string lockPath = stem + ".lock";
  std::string out = expectLockTimeout(lockPath, 2.5, 2.4, "", [&] {
    rt::HostJitOptions o = options();
    o.timeoutSeconds = 2.5;
    rt::HostJit jit("twice", kSource, o);
  });
  EXPECT_NE(out.find("vflow: waiting for another process compiling twice "
                     "(lock " +
                     lockPath + ")...\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("if no vflow process is running, delete the lock file"),
            std::string::npos)
      << out;

  // Released: the same build goes through.
  rt::HostJit jit("twice", kSource, options());
  EXPECT_TRUE(jit.compiledNow());
}

TEST_F(HostJitTest, ConcurrentProcessesCompileOnce) {
  rt::HostJitOptions o = options();
  std::vector<pid_t> children;
  std::vector<int> reads;
  for (int i = 0; i < 3; ++i) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid == 0) {
      char answer = 'e';
      try {
        rt::HostJit jit("twice", kSource, o);
        if (jit.lookup<float (*)(float)>("twice")(1.5f) == 3.0f)
          answer = jit.compiledNow() ? 'c' : 'h';
      } catch (...) {
      }
      ssize_t ignored = ::write(fds[1], &answer, 1);
      (void)ignored;
      ::_exit(0);
    }
    ::close(fds[1]);
    children.push_back(pid);
    reads.push_back(fds[0]);
  }
  std::string answers;
  for (size_t i = 0; i < children.size(); ++i) {
    char answer = '?';
    if (::read(reads[i], &answer, 1) != 1)
      answer = '?';
    ::close(reads[i]);
    ::waitpid(children[i], nullptr, 0);
    answers += answer;
  }
  std::sort(answers.begin(), answers.end());
  EXPECT_EQ(answers, "chh");
}

TEST_F(HostJitTest, CompilerThatNeverExitsIsKilled) {
  std::string pidFile = dir + "-compiler.pid";
  rt::HostJitOptions o = options();
  o.compiler = "sh -c 'echo $$ > " + pidFile + "; exec sleep 1000'";
  o.timeoutSeconds = 1;
  auto start = std::chrono::steady_clock::now();
  std::string out = runInChild(60, [&] {
    rt::HostJit jit("stuck", kSource, o);
    return std::string("loaded");
  });
  double seconds = secondsSince(start);
  EXPECT_NE(out.find("error: vflow: the host compiler did not finish "
                     "compiling stuck within 1 s and was killed"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("sleep 1000"), std::string::npos) << out;
  EXPECT_GE(seconds, 0.9);
  EXPECT_LT(seconds, 20);
  // The compiler is gone, or a zombie nobody has reaped yet (a killed
  // process may take a moment to die on a busy machine).
  std::string pid = readText(pidFile);
  fs::remove(pidFile);
  ASSERT_FALSE(pid.empty());
  pid.erase(pid.find_last_not_of("\n") + 1);
  std::string state;
  for (auto wait = std::chrono::steady_clock::now(); secondsSince(wait) < 10;
       std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
    std::string stat = readText("/proc/" + pid + "/stat");
    size_t close = stat.rfind(')');
    state = close == std::string::npos ? "gone" : stat.substr(close + 2, 1);
    if (state == "gone" || state == "Z")
      break;
  }
  EXPECT_TRUE(state == "gone" || state == "Z")
      << "compiler " << pid << ": " << state;
}

TEST_F(HostJitTest, JitTimeoutIsValidated) {
  for (const char *bad : {"abc", "0", "-1", "5s", "nan", "inf"}) {
    ScopedEnv env("VFLOW_JIT_TIMEOUT", bad);
    try {
      rt::HostJit jit("twice", kSource, options());
      FAIL() << "VFLOW_JIT_TIMEOUT=" << bad << " accepted";
    } catch (const rt::Error &e) {
      EXPECT_NE(std::string(e.what()).find(
                    std::string("VFLOW_JIT_TIMEOUT must be a positive number "
                                "of seconds")),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
  rt::HostJitOptions o = options();
  o.timeoutSeconds = -1;
  EXPECT_THROW(rt::HostJit("twice", kSource, o), rt::Error);
  ScopedEnv env("VFLOW_JIT_TIMEOUT", "0.5e3");
  rt::HostJit jit("twice", kSource, options());
  EXPECT_TRUE(jit.compiledNow());
}

/// Expects constructing a HostJit on `cacheDir` to throw an Error whose
/// message holds each of `parts`.
void expectRefused(const std::string &cacheDir,
                   const std::vector<std::string> &parts) {
  rt::HostJitOptions o;
  o.cacheDir = cacheDir;
  o.quiet = true;
  try {
    rt::HostJit jit("twice", kSource, o);
    ADD_FAILURE() << "used the cache in " << cacheDir;
  } catch (const rt::Error &e) {
    for (const std::string &part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
  }
}

TEST_F(HostJitTest, SharedCacheDirectoryIsRefused) {
  fs::create_directories(dir);
  for (mode_t mode : {0775, 0757, 0777}) {
    ASSERT_EQ(::chmod(dir.c_str(), mode), 0);
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%04o", unsigned(mode));
    expectRefused(dir,
                  {"JIT cache directory " + dir +
                       " is writable by group or others (mode " + octal + ")",
                   "chmod 700 " + dir, "VFLOW_CACHE_DIR"});
  }
  // A private one that already exists is fine (0755 too: only writers
  // matter).
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  rt::HostJit jit("twice", kSource, options());
  EXPECT_TRUE(jit.compiledNow());

  // So is the backend folder in it, and it may not be a link.
  ASSERT_EQ(::chmod((dir + "/cpu-v1").c_str(), 0722), 0);
  expectRefused(dir, {dir + "/cpu-v1 is writable by group or others"});
  fs::rename(dir + "/cpu-v1", dir + "/elsewhere");
  ASSERT_EQ(::chmod((dir + "/elsewhere").c_str(), 0700), 0);
  fs::create_directory_symlink(dir + "/elsewhere", dir + "/cpu-v1");
  expectRefused(dir, {dir + "/cpu-v1 in the JIT cache is a symbolic link"});
}

TEST_F(HostJitTest, ForeignCacheDirectoryIsRefused) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to give a directory to another user";
  fs::create_directories(dir + "/cpu-v1");
  ASSERT_EQ(::chown(dir.c_str(), 4242, static_cast<gid_t>(-1)), 0);
  expectRefused(dir, {"JIT cache directory " + dir + " is owned by uid 4242",
                      "not by this user (uid 0)", "VFLOW_CACHE_DIR"});
  ASSERT_EQ(::chown(dir.c_str(), 0, static_cast<gid_t>(-1)), 0);
  ASSERT_EQ(::chown((dir + "/cpu-v1").c_str(), 4242, static_cast<gid_t>(-1)),
            0);
  expectRefused(dir, {dir + "/cpu-v1 is owned by uid 4242"});
  // Another user's link to a private directory is not followed.
  ASSERT_EQ(::chown((dir + "/cpu-v1").c_str(), 0, static_cast<gid_t>(-1)), 0);
  std::string link = dir + "-link";
  fs::remove(link);
  fs::create_directory_symlink(dir, link);
  ASSERT_EQ(::lchown(link.c_str(), 4242, static_cast<gid_t>(-1)), 0);
  expectRefused(link, {link + " is a symbolic link owned by uid 4242"});
  fs::remove(link);
}

TEST_F(HostJitTest, DefaultCacheDirectory) {
  std::string uid = std::to_string(::geteuid());
  ScopedEnv tmp("TMPDIR", dir.c_str());
  {
    ScopedEnv cache("VFLOW_CACHE_DIR", "/a");
    ScopedEnv xdg("XDG_CACHE_HOME", "/b");
    EXPECT_EQ(rt::HostJit::defaultCacheDir(), "/a");
  }
  {
    ScopedEnv cache("VFLOW_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", "/b");
    EXPECT_EQ(rt::HostJit::defaultCacheDir(), "/b/vflow");
  }
  {
    ScopedEnv cache("VFLOW_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", "/c");
    EXPECT_EQ(rt::HostJit::defaultCacheDir(), "/c/.cache/vflow");
  }
  // With none of them, a folder of this user's in $TMPDIR, made private.
  ScopedEnv cache("VFLOW_CACHE_DIR", nullptr);
  ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
  ScopedEnv home("HOME", nullptr);
  std::string fallback = dir + "/vflow-cache-" + uid;
  EXPECT_EQ(rt::HostJit::defaultCacheDir(), fallback);
  rt::HostJitOptions o = options();
  o.cacheDir.clear();
  rt::HostJit jit("twice", kSource, o);
  EXPECT_EQ(jit.libraryPath().rfind(fallback + "/cpu-v1/twice-", 0), 0u)
      << jit.libraryPath();
  struct stat st;
  for (const std::string &folder : {dir, fallback}) {
    ASSERT_EQ(::lstat(folder.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u) << folder;
    EXPECT_EQ(st.st_uid, ::geteuid());
  }
  {
    ScopedEnv noTmp("TMPDIR", nullptr);
    EXPECT_EQ(rt::HostJit::defaultCacheDir(), "/tmp/vflow-cache-" + uid);
  }
}

TEST(KernelABI, RoundingMatchesTheRuntime) {
  int failures = 0;
  // A sweep over all floats, every bf16 rounding boundary (low 16 bits),
  // and every f16/fp8 boundary (low 12 bits; fp8's lie above them).
  for (uint64_t b = 0; b < (1ull << 32); b += 1021)
    expectSameRounding(static_cast<uint32_t>(b), failures);
  for (uint32_t hi = 0; hi < (1u << 16); ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      expectSameRounding(hi << 16 | lo, failures);
  for (uint32_t hi = 0; hi < (1u << 20); ++hi)
    for (uint32_t lo : {0x000u, 0x7FFu, 0x800u, 0x801u, 0xFFFu})
      expectSameRounding(hi << 12 | lo, failures);
  EXPECT_EQ(failures, 0);
}

TEST(KernelABI, SelectionRules) {
  const float nan = kabi::kNaN;
  // Ties go to the lower index; NaN ranks last; kept blocks are excluded.
  float score[] = {9, 1, 5, 5, nan, 5, 0, 9};
  kabi::Kept kept{8, 1, 1};
  EXPECT_EQ(kabi::selectTopK(score, kept, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(kabi::selectTopK(score, kept, 5),
            (std::vector<int64_t>{1, 2, 3, 5, 6}));
  EXPECT_EQ(kabi::selectTopK(score, kept, 100).size(), 6u);
  EXPECT_EQ(kabi::selectTopK(score, kept, 0).size(), 0u);
  EXPECT_EQ(kabi::selectThreshold(score, kept, 5, -1),
            (std::vector<int64_t>{2, 3, 5}));
  EXPECT_EQ(kabi::selectThreshold(score, kept, 5, 1),
            (std::vector<int64_t>{2}));
  EXPECT_EQ(kabi::selectThreshold(score, kept, nan, -1).size(), 0u);
  EXPECT_EQ(kabi::selectUnion({1, 4}, {2, 4, 6}),
            (std::vector<int64_t>{1, 2, 4, 6}));
  float line[] = {3, nan, 7, 1};
  EXPECT_EQ(kabi::kthLargestLine(line, 1, 4, 1), 7);
  EXPECT_EQ(kabi::kthLargestLine(line, 1, 4, 3), 1);
  EXPECT_TRUE(std::isnan(kabi::kthLargestLine(line, 1, 4, 9)));
  EXPECT_EQ(kabi::kthLargestLine(line, 1, 4, 0), kabi::kInf);
  EXPECT_EQ(kabi::roundBudget(-1), 0);
  EXPECT_EQ(kabi::roundBudget(nan), 0);
  EXPECT_EQ(kabi::roundBudget(2.9), 2);
}
