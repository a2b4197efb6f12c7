//===- DriverTest.cpp - Modules, launches and devices ---------------------===//
//
// Without a GPU (CI): the driver layer says why, and throws clear errors.
// With one: modules load (cubin and PTX) and kernels launch on a stream of
// the CUDA runtime API.
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/cuda/Driver.h"
#include "CudaTestUtil.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/NumericRules.h"
#include "vflow/Runtime/cuda/Jit.h"

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace vflow::rt;
using namespace vflow::rt::test;

namespace {

TEST(DriverTest, GpuAvailableSaysWhyNot) {
  std::string why = "unset";
  bool available = cuda::gpuAvailable(&why);
  EXPECT_EQ(cuda::gpuAvailable(), available);
  if (available)
    EXPECT_EQ(why, "");
  else
    EXPECT_EQ(why.rfind("vflow: ", 0), 0u) << why;
}

TEST(DriverTest, NoDriverGivesClearErrors) {
  std::string why;
  if (cuda::gpuAvailable(&why))
    GTEST_SKIP() << "a GPU is available";
  if (why.find("libcuda.so.1") == std::string::npos)
    GTEST_SKIP() << "a driver without a usable device: " << why;
  cuda::CudaBinary binary;
  binary.cubin = {'\x7f', 'E', 'L', 'F'};
  expectError([&] { cuda::Module::load(binary); }, "no CUDA driver",
              "libcuda.so.1");
  expectError([] { cuda::currentDevice(); }, "no CUDA driver");
  expectError([] { cuda::archOfCurrentDevice(); }, "no CUDA driver");
  expectError(
      [] {
        cuda::launchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr);
      },
      "no CUDA driver");
}

/// Tests that need a GPU: skipped without one.
class GpuTest : public CudaJitTest {
protected:
  void SetUp() override {
    CudaJitTest::SetUp();
    std::string why;
    if (!IsSkipped() && !cuda::gpuAvailable(&why))
      GTEST_SKIP() << why;
  }
};

TEST_F(GpuTest, DeviceInfo) {
  cuda::DeviceInfo info = cuda::currentDevice();
  EXPECT_GE(info.major, 7);
  EXPECT_GT(info.multiprocessors, 0);
  EXPECT_GT(info.l2Bytes, 0u);
  EXPECT_GE(info.sharedPerBlockOptin, 48u * 1024);
  EXPECT_FALSE(info.name.empty());
  EXPECT_EQ(info.arch,
            "sm_" + std::to_string(info.major) + std::to_string(info.minor));
  EXPECT_EQ(cuda::archOfCurrentDevice(), info.arch);
}

/// Runs vflow_test_axpy from `binary` on a stream; checks y = a * x + y
/// bit for bit (no fused multiply-add).
void runAxpy(const cuda::CudaBinary &binary) {
  cuda::Module module = cuda::Module::load(binary);
  cuda::Module moved = std::move(module);
  void *function = moved.function("vflow_test_axpy");
  int n = 1000;
  std::vector<float> x(n), y(n), want(n), got(n);
  for (int i = 0; i < n; ++i) {
    x[i] = 1.0f / (i + 3);
    y[i] = 0.1f * i;
  }
  float a = 1.0f / 7;
  for (int i = 0; i < n; ++i) {
    volatile float product = a * x[i];
    want[i] = product + y[i];
  }
  float *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&dx), n * sizeof(float)),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&dy), n * sizeof(float)),
            cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  void *args[] = {&a, &dx, &dy, &n};
  cuda::launchKernel(function, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream,
                     args);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaMemcpy(got.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, want);
  cudaStreamDestroy(stream);
  cudaFree(dx);
  cudaFree(dy);
}

TEST_F(GpuTest, CubinLoadsAndLaunches) {
  cuda::NvrtcOptions o = options();
  o.arch = cuda::archOfCurrentDevice();
  runAxpy(cuda::compileCuda("axpy", kAxpySource, o));
}

TEST_F(GpuTest, PtxLoadsAndLaunches) {
  cuda::NvrtcOptions o = options();
  o.arch = "sm_80";
  o.cubin = false;
  runAxpy(cuda::compileCuda("axpy", kAxpySource, o));
}

TEST_F(GpuTest, MissingKernelIsNamed) {
  cuda::NvrtcOptions o = options();
  o.arch = cuda::archOfCurrentDevice();
  cuda::Module module =
      cuda::Module::load(cuda::compileCuda("axpy", kAxpySource, o));
  expectError([&] { module.function("vflow_no_such_kernel"); },
              "has no kernel 'vflow_no_such_kernel'", "CUDA_ERROR_NOT_FOUND");
}

TEST_F(GpuTest, CubinForAnotherArchIsRefused) {
  cuda::NvrtcOptions o = options();
  o.arch = cuda::archOfCurrentDevice() == "sm_80" ? "sm_90" : "sm_80";
  cuda::CudaBinary binary = cuda::compileCuda("axpy", kAxpySource, o);
  expectError([&] { cuda::Module::load(binary); }, "loading the cubin",
              "(" + o.arch + ")", "CUDA_ERROR_NO_BINARY_FOR_GPU");
}

TEST_F(GpuTest, LargeDynamicSharedMemory) {
  const char *source = R"(extern "C" __global__ void vflow_test_smem(int *out) {
  extern __shared__ int buffer[];
  int n = 64 * 1024 / sizeof(int);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    buffer[i] = i;
  __syncthreads();
  if (threadIdx.x == 0)
    out[0] = buffer[n - 1];
}
)";
  cuda::NvrtcOptions o = options();
  o.arch = cuda::archOfCurrentDevice();
  cuda::Module module =
      cuda::Module::load(cuda::compileCuda("smem", source, o));
  int *out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&out), sizeof(int)),
            cudaSuccess);
  void *args[] = {&out};
  cuda::launchKernel(module.function("vflow_test_smem"), 1, 1, 1, 128, 1, 1,
                     64 * 1024, nullptr, args);
  int got = 0;
  ASSERT_EQ(cudaMemcpy(&got, out, sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, 64 * 1024 / 4 - 1);
  cudaFree(out);
  // Beyond the device's limit: a clear error.
  unsigned tooMuch =
      static_cast<unsigned>(cuda::currentDevice().sharedPerBlockOptin) + 1024;
  expectError(
      [&] {
        cuda::launchKernel(module.function("vflow_test_smem"), 1, 1, 1, 128, 1,
                           1, tooMuch, nullptr, args);
      },
      "bytes of shared memory");
}

} // namespace

/// The device's NumericRules against the host's, bit for bit: maximum and
/// minimum (max.NaN and min.NaN on the device, the portable code on the
/// host) on every pair of special values, and a wide sum's lanes combined
/// by a warp (warpReduce, and warpReduceGroup's transposed form with four
/// heads) against combineSumLanes. As a cubin for this GPU and as PTX for
/// sm_80 (the oldest supported arch).
TEST_F(GpuTest, DeviceRulesMatchTheHost) {
  const char *source = R"(#include "vflow/FlowDevice.cuh"
extern "C" __global__ void vflow_test_rules(const float *a, const float *b,
                                            int n, float *minmax,
                                            const float *lanes, float *sums,
                                            const float *heads,
                                            float *headSums) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    minmax[4 * i] = vd::maximum(a[i], b[i]);
    minmax[4 * i + 1] = vd::minimum(a[i], b[i]);
    minmax[4 * i + 2] = vd::Max::merge(a[i], b[i]);
    minmax[4 * i + 3] = float(vd::Min::merge(double(a[i]), double(b[i])));
  }
  // One warp per row of 32 lane partials (every thread takes part).
  sums[i] = vd::warpReduce<vd::Sum>(lanes[i]);
  float part[4];
  for (int h = 0; h < 4; ++h)
    part[h] = heads[4 * i + h];
  vd::warpReduceGroup<vd::Sum, 4>(part, [&](int h, double total) {
    headSums[4 * (i / 32) + h] = float(total);
  });
}
)";
  const float inf = INFINITY, nan = NAN;
  const std::vector<float> special = {0.0f, -0.0f, 1.0f, -1.0f,  inf,
                                      -inf, nan,   3.5f, 1e-40f, -2.5f};
  std::vector<float> a, b;
  for (float x : special)
    for (float y : special)
      a.push_back(x), b.push_back(y);
  const int n = int(a.size()), threads = 256, rows = threads / 32;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> lanes(threads), heads(4 * threads);
  for (float &x : lanes)
    x = std::ldexp(normal(rng), exponent(rng));
  for (float &x : heads)
    x = std::ldexp(normal(rng), exponent(rng));
  auto bits = [](float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  auto same = [&](float got, float want) {
    return (std::isnan(got) && std::isnan(want)) || bits(got) == bits(want);
  };
  for (std::string arch : {cuda::archOfCurrentDevice(), std::string("sm_80")}) {
    SCOPED_TRACE(arch);
    cuda::NvrtcOptions o = options();
    o.arch = arch;
    o.cubin = arch != "sm_80";
    cuda::Module module =
        cuda::Module::load(cuda::compileCuda("rules", source, o));
    void *buffers[8] = {};
    const size_t bytes[8] = {
        a.size() * 4,     b.size() * 4,     0,
        4 * a.size() * 4, lanes.size() * 4, lanes.size() * 4,
        heads.size() * 4, 4 * rows * 4};
    for (int k = 0; k < 8; ++k)
      if (bytes[k]) {
        ASSERT_EQ(cudaMalloc(&buffers[k], bytes[k]), cudaSuccess);
      }
    cudaMemcpy(buffers[0], a.data(), bytes[0], cudaMemcpyHostToDevice);
    cudaMemcpy(buffers[1], b.data(), bytes[1], cudaMemcpyHostToDevice);
    cudaMemcpy(buffers[4], lanes.data(), bytes[4], cudaMemcpyHostToDevice);
    cudaMemcpy(buffers[6], heads.data(), bytes[6], cudaMemcpyHostToDevice);
    int count = n;
    void *args[] = {&buffers[0], &buffers[1], &count,      &buffers[3],
                    &buffers[4], &buffers[5], &buffers[6], &buffers[7]};
    cuda::launchKernel(module.function("vflow_test_rules"), 1, 1, 1, threads, 1,
                       1, 0, nullptr, args);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> minmax(4 * a.size()), sums(threads), headSums(4 * rows);
    cudaMemcpy(minmax.data(), buffers[3], bytes[3], cudaMemcpyDeviceToHost);
    cudaMemcpy(sums.data(), buffers[5], bytes[5], cudaMemcpyDeviceToHost);
    cudaMemcpy(headSums.data(), buffers[7], bytes[7], cudaMemcpyDeviceToHost);
    for (void *p : buffers)
      cudaFree(p);
    for (int i = 0; i < n; ++i) {
      float x = a[i], y = b[i];
      EXPECT_TRUE(same(minmax[4 * i], vflow::rules::maximum(x, y)))
          << "maximum(" << x << ", " << y << ") = " << minmax[4 * i];
      EXPECT_TRUE(same(minmax[4 * i + 1], vflow::rules::minimum(x, y)))
          << "minimum(" << x << ", " << y << ") = " << minmax[4 * i + 1];
      EXPECT_TRUE(same(minmax[4 * i + 2], vflow::rules::maximum(x, y)))
          << "Max::merge(" << x << ", " << y << ")";
      EXPECT_TRUE(same(minmax[4 * i + 3], vflow::rules::minimum(x, y)))
          << "Min::merge(" << x << ", " << y << ")";
    }
    for (int r = 0; r < rows; ++r) {
      float row[vflow::rules::kSumLanes];
      std::copy(&lanes[32 * r], &lanes[32 * r] + 32, row);
      const float total = vflow::rules::combineSumLanes(row);
      for (int l = 0; l < 32; ++l)
        EXPECT_EQ(bits(sums[32 * r + l]), bits(total)) << r << " " << l;
      for (int h = 0; h < 4; ++h) {
        for (int l = 0; l < 32; ++l)
          row[l] = heads[4 * (32 * r + l) + h];
        EXPECT_EQ(bits(headSums[4 * r + h]),
                  bits(vflow::rules::combineSumLanes(row)))
            << "row " << r << " head " << h;
      }
    }
  }
}
