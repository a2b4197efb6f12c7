//===- JitTest.cpp - NVRTC compiles, the disk cache, embedded headers -----===//

#include "vflow/Runtime/cuda/Jit.h"
#include "CudaTestUtil.h"
#include "vflow/Runtime/Error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

using namespace vflow::rt;
using namespace vflow::rt::test;
namespace fs = std::filesystem;

namespace {

using JitTest = CudaJitTest;

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

TEST_F(JitTest, CubinIsCachedOnDisk) {
  cuda::CudaBinary cold = cuda::compileCuda("axpy", kAxpySource, options());
  EXPECT_FALSE(cold.cacheHit);
  EXPECT_GT(cold.compileSeconds, 0);
  EXPECT_EQ(cold.target, "sm_90");
  EXPECT_TRUE(cold.ptx.empty());
  ASSERT_GT(cold.cubin.size(), 4u);
  EXPECT_EQ(std::string(cold.cubin.data(), 4), "\x7f"
                                               "ELF");
  // <dir>/cuda-v1/axpy-sm_90-<32 hex digits>.cubin, next to its source,
  // its log and its lock; no temporary file is left.
  fs::path path = cold.path;
  EXPECT_EQ(path.parent_path(), fs::path(dir) / "cuda-v1");
  std::string stem = path.stem().string();
  ASSERT_TRUE(startsWith(stem, "axpy-sm_90-")) << stem;
  EXPECT_EQ(stem.size(), std::string("axpy-sm_90-").size() + 32);
  EXPECT_EQ(path.extension(), ".cubin");
  EXPECT_EQ(cacheFiles(dir),
            (std::vector<std::string>{stem + ".cu", stem + ".cubin",
                                      stem + ".lock", stem + ".log"}));

  auto start = std::chrono::steady_clock::now();
  cuda::CudaBinary warm = cuda::compileCuda("axpy", kAxpySource, options());
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_TRUE(warm.cacheHit);
  EXPECT_LT(seconds, 0.020);
  EXPECT_EQ(warm.compileSeconds, 0);
  EXPECT_EQ(warm.path, cold.path);
  EXPECT_EQ(warm.cubin, cold.cubin);
  EXPECT_EQ(warm.log, cold.log);
}

TEST_F(JitTest, PtxForCompute80) {
  cuda::NvrtcOptions o = options();
  o.arch = "sm_80";
  o.cubin = false;
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
  cuda::NvrtcOptions o = options();
  o.quiet = false;
  ::testing::internal::CaptureStderr();
  cuda::compileCuda("loud", kAxpySource, o);
  std::string cold = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cold, "vflow: compiling loud for sm_90 with NVRTC (cached in " +
                      (fs::path(dir) / "cuda-v1").string() + ")...\n");
  ::testing::internal::CaptureStderr();
  cuda::compileCuda("loud", kAxpySource, o);
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
