//===- CudaTestUtil.h - Helpers for the CUDA JIT tests ----------*- C++ -*-===//

#ifndef VFLOW_TESTS_CUDA_CUDATESTUTIL_H
#define VFLOW_TESTS_CUDA_CUDATESTUTIL_H

#include "../common/JitCacheTest.h"
#include "TestUtil.h"
#include "vflow/Runtime/cuda/Jit.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

namespace vflow {
namespace rt {
namespace test {

/// A fresh JIT cache directory per test, removed afterwards; skips the test
/// when NVRTC cannot be loaded.
class CudaJitTest : public vflow::testing::JitCacheTest<cuda::NvrtcOptions> {
protected:
  CudaJitTest() : JitCacheTest("cudajit") {}
  void SetUp() override {
    JitCacheTest::SetUp();
    std::string why;
    if (!cuda::nvrtcAvailable(&why))
      GTEST_SKIP() << why;
  }
};

/// y = a * x + y, one thread per element.
inline const char *kAxpySource = R"(extern "C" __global__ void
vflow_test_axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a * x[i] + y[i];
}
)";

} // namespace test
} // namespace rt
} // namespace vflow

#endif // VFLOW_TESTS_CUDA_CUDATESTUTIL_H
