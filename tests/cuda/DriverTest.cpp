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
#include "vflow/Runtime/cuda/Jit.h"

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

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
