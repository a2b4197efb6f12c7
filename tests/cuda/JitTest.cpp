//===- JitTest.cpp - NVRTC compiles, the disk cache, embedded headers -----===//

#include "vflow/Runtime/cuda/Jit.h"
#include "CudaTestUtil.h"
#include "vflow/Runtime/Error.h"
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
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace vflow::rt;
using namespace vflow::rt::test;
namespace fs = std::filesystem;

using vflow::testing::expectLockTimeout;
using vflow::testing::readText;
using vflow::testing::replaceFile;
using vflow::testing::runInChild;

namespace {

class JitTest : public CudaJitTest {
protected:
  /// PTX for compute_80 (no cubin): compiles without a GPU of that arch.
  cuda::NvrtcOptions ptxOptions() const {
    cuda::NvrtcOptions o = options();
    o.arch = "sm_80";
    o.cubin = false;
    return o;
  }
  /// Compiles axpy with `o` and the cache's messages on; `messages` gets
  /// what it printed.
  cuda::CudaBinary compileLoudly(cuda::NvrtcOptions o, std::string &messages) {
    o.quiet = false;
    ::testing::internal::CaptureStderr();
    cuda::CudaBinary binary = cuda::compileCuda("axpy", kAxpySource, o);
    messages = ::testing::internal::GetCapturedStderr();
    return binary;
  }
};

bool startsWith(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// The files of the cache's cuda-v1 folder, by name.
std::vector<std::string> cacheFiles(const std::string &dir) {
  std::vector<std::string> names;
  for (const auto &entry : fs::directory_iterator(fs::path(dir) / "cuda-v1"))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// `path` with its extension replaced.
std::string withExtension(const std::string &path, const std::string &ext) {
  return fs::path(path).replace_extension(ext).string();
}

TEST_F(JitTest, CubinIsCachedOnDisk) {
  cuda::CudaBinary cold = cuda::compileCuda("axpy", kAxpySource, options());
  EXPECT_FALSE(cold.cacheHit);
  EXPECT_GT(cold.compileSeconds, 0);
  EXPECT_EQ(cold.target, "sm_90");
  EXPECT_TRUE(cold.ptx.empty());
  ASSERT_GT(cold.cubin.size(), 4u);
  EXPECT_EQ(std::string(cold.cubin.data(), 4), "\x7f"
                                               "ELF");
  // <dir>/cuda-v1/axpy-sm_90-<64 hex digits>.cubin, next to its source,
  // its log, its manifest and its lock; no temporary file is left.
  fs::path path = cold.path;
  EXPECT_EQ(path.parent_path(), fs::path(dir) / "cuda-v1");
  std::string stem = path.stem().string();
  ASSERT_TRUE(startsWith(stem, "axpy-sm_90-")) << stem;
  EXPECT_EQ(stem.size(), std::string("axpy-sm_90-").size() + 64);
  EXPECT_EQ(path.extension(), ".cubin");
  EXPECT_EQ(cacheFiles(dir), (std::vector<std::string>{
                                 stem + ".cu", stem + ".cubin", stem + ".lock",
                                 stem + ".log", stem + ".sum"}));
  // The manifest: the key, then each file's size and SHA-256.
  std::string cubin(cold.cubin.begin(), cold.cubin.end());
  EXPECT_EQ(readText(withExtension(cold.path, ".sum")),
            "vflow-jit-entry 1 key=" + stem.substr(11) + "\nfile=" + stem +
                ".cubin bytes=" + std::to_string(cubin.size()) +
                " sha256=" + sha256Hex(cubin) + "\nfile=" + stem +
                ".log bytes=" + std::to_string(cold.log.size()) +
                " sha256=" + sha256Hex(cold.log) + "\n");

  // A hit reads and checks files: far less than the compile it saves (a
  // ratio, best of three, so that a busy machine does not fail it; an
  // absolute 20 ms did, at 20.6 ms beside a build).
  cuda::CudaBinary warm;
  double seconds = 1e9;
  for (int run = 0; run < 3; ++run) {
    auto start = std::chrono::steady_clock::now();
    warm = cuda::compileCuda("axpy", kAxpySource, options());
    seconds = std::min(seconds, std::chrono::duration<double>(
                                    std::chrono::steady_clock::now() - start)
                                    .count());
  }
  EXPECT_TRUE(warm.cacheHit);
  EXPECT_GT(cold.compileSeconds, 0);
  EXPECT_LT(seconds, cold.compileSeconds / 5);
  EXPECT_EQ(warm.compileSeconds, 0);
  EXPECT_EQ(warm.path, cold.path);
  EXPECT_EQ(warm.cubin, cold.cubin);
  EXPECT_EQ(warm.log, cold.log);
}

TEST_F(JitTest, PtxForCompute80) {
  cuda::NvrtcOptions o = ptxOptions();
  cuda::CudaBinary binary = cuda::compileCuda("axpy", kAxpySource, o);
  EXPECT_EQ(binary.target, "compute_80");
  EXPECT_TRUE(binary.cubin.empty());
  EXPECT_EQ(fs::path(binary.path).extension(), ".ptx");
  EXPECT_NE(binary.ptx.find(".entry vflow_test_axpy"), std::string::npos);
  EXPECT_NE(binary.ptx.find(".target sm_80"), std::string::npos);
  // -fmad=false: a * x + y stays a rounded multiply and a rounded add, as on
  // the CPU backend (-ffp-contract=off).
  EXPECT_NE(binary.ptx.find("mul.rn.f32"), std::string::npos) << binary.ptx;
  EXPECT_EQ(binary.ptx.find("fma."), std::string::npos) << binary.ptx;
  EXPECT_TRUE(cuda::compileCuda("axpy", kAxpySource, o).cacheHit);
}

TEST_F(JitTest, KeyCoversSourceArchOptionsAndLabel) {
  std::string base = cuda::compileCuda("axpy", kAxpySource, options()).path;
  std::string changed = std::string(kAxpySource) + "// changed\n";
  EXPECT_NE(cuda::compileCuda("axpy", changed, options()).path, base);

  cuda::NvrtcOptions sm80 = options();
  sm80.arch = "sm_80";
  std::string other = cuda::compileCuda("axpy", kAxpySource, sm80).path;
  EXPECT_NE(other, base);
  EXPECT_TRUE(startsWith(fs::path(other).filename().string(), "axpy-sm_80-"));

  cuda::NvrtcOptions extra = options();
  extra.extra = {"-DVFLOW_TEST=1"};
  EXPECT_NE(cuda::compileCuda("axpy", kAxpySource, extra).path, base);

  cuda::NvrtcOptions labelled = options();
  labelled.label = "my flow/1";
  std::string path = cuda::compileCuda("axpy", kAxpySource, labelled).path;
  EXPECT_TRUE(startsWith(fs::path(path).filename().string(), "my_flow_1-"))
      << path;
}

TEST_F(JitTest, CompileErrorCarriesTheLog) {
  const char *source = "extern \"C\" __global__ void k(int *out) {\n"
                       "  int x = 1;\n"
                       "  undefined_name = x;\n"
                       "}\n";
  expectError([&] { cuda::compileCuda("broken", source, options()); },
              "NVRTC failed to compile broken for sm_90", "broken.cu(3)",
              "undefined_name", "broken-sm_90-");
  // The source stays in the cache for reading; no object was written.
  for (const std::string &name : cacheFiles(dir))
    EXPECT_NE(fs::path(name).extension(), ".cubin") << name;
}

TEST_F(JitTest, BadArchIsRejected) {
  for (const char *arch :
       {"sm90", "sm_", "sm_9", "sm_90b", "compute_80", "SM_90", "", "sm_9x"}) {
    cuda::NvrtcOptions o = options();
    o.arch = arch;
    expectError([&] { cuda::compileCuda("axpy", kAxpySource, o); },
                std::string("bad CUDA architecture '") + arch + "'",
                "sm_<digits>");
  }
  cuda::NvrtcOptions o = options();
  o.arch = "sm_90a";
  EXPECT_EQ(cuda::compileCuda("axpy", kAxpySource, o).target, "sm_90a");
}

TEST_F(JitTest, UnsupportedArchNamesTheSupportedOnes) {
  for (bool cubin : {true, false}) {
    cuda::NvrtcOptions o = options();
    o.arch = "sm_10";
    o.cubin = cubin;
    expectError([&] { cuda::compileCuda("axpy", kAxpySource, o); },
                "cannot compile for sm_10", "it supports sm_");
  }
}

TEST_F(JitTest, EmbeddedHeaderIsIncludedByName) {
  const auto &headers = cuda::embeddedCudaHeaders();
  auto it = std::find_if(headers.begin(), headers.end(), [](const auto &h) {
    return h.first == "vflow/FlowDevice.cuh";
  });
  ASSERT_NE(it, headers.end());
  EXPECT_FALSE(it->second.empty());
  const char *source = "#include \"vflow/FlowDevice.cuh\"\n"
                       "#include \"vflow/FlowDevice.cuh\"\n"
                       "extern \"C\" __global__ void vflow_test_empty() {}\n";
  cuda::CudaBinary binary = cuda::compileCuda("header", source, options());
  EXPECT_FALSE(binary.cubin.empty());
}

TEST_F(JitTest, ColdCompilePrintsAMessage) {
  ::testing::internal::CaptureStderr();
  cuda::compileCuda("loud", kAxpySource, loudOptions());
  std::string cold = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cold, "vflow: compiling loud for sm_90 with NVRTC (cached in " +
                      (fs::path(dir) / "cuda-v1").string() + ")...\n");
  ::testing::internal::CaptureStderr();
  cuda::compileCuda("loud", kAxpySource, loudOptions());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST_F(JitTest, NoCacheWritesNothing) {
  cuda::NvrtcOptions o = options();
  o.useCache = false;
  for (int i = 0; i < 2; ++i) {
    cuda::CudaBinary binary = cuda::compileCuda("axpy", kAxpySource, o);
    EXPECT_FALSE(binary.cacheHit);
    EXPECT_TRUE(binary.path.empty());
    EXPECT_FALSE(binary.cubin.empty());
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(JitTest, DefaultCacheDirIsVflowCacheDir) {
  const char *old = std::getenv("VFLOW_CACHE_DIR");
  std::string saved = old ? old : "";
  ::setenv("VFLOW_CACHE_DIR", dir.c_str(), 1);
  cuda::NvrtcOptions o = options();
  o.cacheDir.clear();
  std::string path = cuda::compileCuda("axpy", kAxpySource, o).path;
  if (old)
    ::setenv("VFLOW_CACHE_DIR", saved.c_str(), 1);
  else
    ::unsetenv("VFLOW_CACHE_DIR");
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir) / "cuda-v1");
}

TEST_F(JitTest, ConcurrentCompilesCompileOnce) {
  std::vector<cuda::CudaBinary> results(4);
  std::vector<std::thread> threads;
  for (cuda::CudaBinary &result : results)
    threads.emplace_back(
        [&] { result = cuda::compileCuda("axpy", kAxpySource, options()); });
  for (std::thread &thread : threads)
    thread.join();
  int cold = 0;
  for (const cuda::CudaBinary &result : results) {
    cold += !result.cacheHit;
    EXPECT_EQ(result.cubin, results[0].cubin);
  }
  EXPECT_EQ(cold, 1);
}

// The cache returns only what was compiled for exactly this input
// (docs/cuda-jit.md, "The cache").

TEST_F(JitTest, GarbagePtxIsRecompiledNotReturned) {
  cuda::NvrtcOptions o = ptxOptions();
  cuda::CudaBinary cold = cuda::compileCuda("axpy", kAxpySource, o);
  replaceFile(cold.path, "GARBAGE\n");
  std::string messages;
  cuda::CudaBinary again = compileLoudly(o, messages);
  EXPECT_FALSE(again.cacheHit);
  EXPECT_EQ(again.ptx, cold.ptx);
  EXPECT_EQ(again.ptx.find("GARBAGE"), std::string::npos);
  EXPECT_NE(messages.find("vflow: the cached entry " + cold.path +
                          " is invalid (size mismatch: 8 bytes on disk"),
            std::string::npos)
      << messages;
  EXPECT_NE(messages.find("rebuilding it\nvflow: compiling axpy for "
                          "compute_80 with NVRTC"),
            std::string::npos)
      << messages;
  EXPECT_EQ(readText(cold.path), cold.ptx);
  // Fixed on disk: a clean hit now.
  cuda::CudaBinary hit = cuda::compileCuda("axpy", kAxpySource, o);
  EXPECT_TRUE(hit.cacheHit);
  EXPECT_EQ(hit.ptx, cold.ptx);
}

TEST_F(JitTest, ChangedCubinOrLogIsRecompiled) {
  cuda::CudaBinary cold = cuda::compileCuda("axpy", kAxpySource, options());
  std::string cubin(cold.cubin.begin(), cold.cubin.end());
  std::string changed = cubin;
  changed[changed.size() / 2] ^= 0x11;
  replaceFile(cold.path, changed);
  std::string messages;
  cuda::CudaBinary again = compileLoudly(options(), messages);
  EXPECT_FALSE(again.cacheHit);
  EXPECT_EQ(again.cubin, cold.cubin);
  EXPECT_NE(messages.find("is invalid (SHA-256 mismatch"), std::string::npos)
      << messages;

  std::string log = withExtension(cold.path, ".log");
  replaceFile(log, "planted warning\n");
  again = compileLoudly(options(), messages);
  EXPECT_FALSE(again.cacheHit);
  EXPECT_EQ(again.log, cold.log);
  EXPECT_NE(messages.find("is invalid (" + fs::path(log).filename().string() +
                          ": size mismatch"),
            std::string::npos)
      << messages;
}

TEST_F(JitTest, AnotherEntryIsNotTakenForThisOne) {
  cuda::CudaBinary mine = cuda::compileCuda("axpy", kAxpySource, options());
  cuda::NvrtcOptions other = options();
  other.extra = {"-DVFLOW_OTHER=1"};
  cuda::CudaBinary theirs = cuda::compileCuda("axpy", kAxpySource, other);
  ASSERT_NE(mine.path, theirs.path);
  for (const char *ext : {".cubin", ".log", ".sum"})
    replaceFile(withExtension(mine.path, ext),
                readText(withExtension(theirs.path, ext)));
  std::string messages;
  cuda::CudaBinary again = compileLoudly(options(), messages);
  EXPECT_FALSE(again.cacheHit);
  EXPECT_NE(messages.find("its manifest was written for another key"),
            std::string::npos)
      << messages;
}

TEST_F(JitTest, FifoInPlaceOfTheObjectIsReplaced) {
  cuda::CudaBinary cold = cuda::compileCuda("axpy", kAxpySource, options());
  fs::remove(cold.path);
  ASSERT_EQ(::mkfifo(cold.path.c_str(), 0600), 0);
  std::string out = runInChild(60, [&] {
    cuda::CudaBinary again = cuda::compileCuda("axpy", kAxpySource, options());
    return std::string(again.cubin == cold.cubin ? "same cubin"
                                                 : "another cubin");
  });
  EXPECT_EQ(out, "same cubin");
  struct stat st;
  ASSERT_EQ(::lstat(cold.path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(JitTest, LockHeldByAnotherProcessTimesOut) {
  cuda::CudaBinary cold = cuda::compileCuda("axpy", kAxpySource, options());
  fs::remove(cold.path);
  std::string lockPath = withExtension(cold.path, ".lock");
  expectLockTimeout(lockPath, 0.5, 0.45,
                    ", held by another process compiling axpy", [&] {
                      cuda::NvrtcOptions o = options();
                      o.timeoutSeconds = 0.5;
                      cuda::compileCuda("axpy", kAxpySource, o);
                    });
  EXPECT_FALSE(cuda::compileCuda("axpy", kAxpySource, options()).cacheHit);
}

TEST_F(JitTest, SharedCacheDirectoryIsRefused) {
  fs::create_directories(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  expectError([&] { cuda::compileCuda("axpy", kAxpySource, options()); },
              "JIT cache directory " + dir +
                  " is writable by group or others (mode 0777)",
              "chmod 700");
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  cuda::NvrtcOptions o = options();
  o.timeoutSeconds = -2;
  expectError([&] { cuda::compileCuda("axpy", kAxpySource, o); },
              "JIT timeout must be a positive number");
  EXPECT_FALSE(cuda::compileCuda("axpy", kAxpySource, options()).cacheHit);
}

TEST_F(JitTest, NvrtcVersion) {
  std::string why = "unset";
  EXPECT_TRUE(cuda::nvrtcAvailable(&why));
  EXPECT_EQ(why, "");
  std::string version = cuda::nvrtcVersionString();
  size_t dot = version.find('.');
  ASSERT_NE(dot, std::string::npos) << version;
  EXPECT_GT(std::atoi(version.c_str()), 0) << version;
}

} // namespace
