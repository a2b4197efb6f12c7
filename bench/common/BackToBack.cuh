//===- BackToBack.cuh - Timing launches back to back ------------*- C++ -*-===//
//
// The timing the probes share (vflow-bench-select, vflow-bench-gather):
// warm-up launches, then `iterations` launches queued behind a spin kernel
// (so the host's launch rate does not show), an event after each; the
// median interval in microseconds. Any CUDA error ends the program with
// its message.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_BENCH_COMMON_BACKTOBACK_CUH
#define VFLOW_BENCH_COMMON_BACKTOBACK_CUH

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace vflow {
namespace bench {

inline void checkCuda(cudaError_t status, const char *what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(2);
  }
}

/// One device allocation holding a copy of `host`.
template <class T> T *upload(const std::vector<T> &host) {
  T *device = nullptr;
  checkCuda(cudaMalloc(&device, std::max<size_t>(1, host.size()) * sizeof(T)),
            "cudaMalloc");
  checkCuda(cudaMemcpy(device, host.data(), host.size() * sizeof(T),
                       cudaMemcpyHostToDevice),
            "upload");
  return device;
}

__global__ void spinCycles(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

/// launch(i) for i in [0, warmup + iterations): the median time between
/// consecutive launches of the timed ones, in microseconds.
template <class Launch>
double medianBackToBackUs(int warmup, int iterations, Launch launch) {
  for (int i = 0; i < warmup; ++i)
    launch(i);
  checkCuda(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> events(iterations + 1);
  for (cudaEvent_t &event : events)
    checkCuda(cudaEventCreate(&event), "cudaEventCreate");
  spinCycles<<<1, 1>>>(20'000'000); // ~10 ms: the launches below queue up
  checkCuda(cudaEventRecord(events[0]), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) {
    launch(warmup + i);
    checkCuda(cudaEventRecord(events[i + 1]), "cudaEventRecord");
  }
  checkCuda(cudaEventSynchronize(events.back()), "cudaEventSynchronize");
  checkCuda(cudaGetLastError(), "a timed launch");
  std::vector<double> us(iterations);
  for (int i = 0; i < iterations; ++i) {
    float ms = 0;
    checkCuda(cudaEventElapsedTime(&ms, events[i], events[i + 1]),
              "cudaEventElapsedTime");
    us[i] = 1000.0 * ms;
  }
  for (cudaEvent_t event : events)
    cudaEventDestroy(event);
  std::sort(us.begin(), us.end());
  return us[iterations / 2];
}

} // namespace bench
} // namespace vflow

#endif // VFLOW_BENCH_COMMON_BACKTOBACK_CUH
