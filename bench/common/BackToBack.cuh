//===- BackToBack.cuh - Timing launches back to back ------------*- C++ -*-===//
//
// The timing every benchmark here shares (vflow-bench-attention,
// vflow-bench-select, vflow-bench-gather): warm-up launches, then launches
// queued behind a spin kernel that holds the stream for about 10 ms, so
// they run back to back and the events between them measure device time,
// not the host's launch rate. CUDA errors throw vflow::rt::Error.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_BENCH_COMMON_BACKTOBACK_CUH
#define VFLOW_BENCH_COMMON_BACKTOBACK_CUH

#include "vflow/Runtime/Error.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

namespace vflow {
namespace bench {

inline void checkCuda(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw rt::Error(std::string(what) + ": " + cudaGetErrorString(status));
}

/// One device allocation holding a copy of `host` (never freed: for the
/// short-lived probes).
template <class T> T *upload(const std::vector<T> &host) {
  T *device = nullptr;
  checkCuda(cudaMalloc(&device, std::max<size_t>(1, host.size()) * sizeof(T)),
            "cudaMalloc");
  checkCuda(cudaMemcpy(device, host.data(), host.size() * sizeof(T),
                       cudaMemcpyHostToDevice),
            "upload");
  return device;
}

/// Busy-waits about `cycles` clock cycles in one thread.
__global__ void spinCycles(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

/// launch(i) for i in [0, warmup + iterations); the device time of each
/// timed launch (from the event before it to the one after), in ms.
template <class Launch>
std::vector<double> backToBackMs(int warmup, int iterations, Launch &&launch) {
  for (int i = 0; i < warmup; ++i)
    launch(i);
  checkCuda(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> events(iterations + 1);
  for (cudaEvent_t &event : events)
    checkCuda(cudaEventCreate(&event), "cudaEventCreate");
  spinCycles<<<1, 1>>>(20'000'000); // ~10 ms: the launches below queue up
  checkCuda(cudaGetLastError(), "spin launch");
  checkCuda(cudaEventRecord(events[0]), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) {
    launch(warmup + i);
    checkCuda(cudaEventRecord(events[i + 1]), "cudaEventRecord");
  }
  checkCuda(cudaEventSynchronize(events.back()), "cudaEventSynchronize");
  checkCuda(cudaGetLastError(), "a timed launch");
  std::vector<double> ms(iterations);
  for (int i = 0; i < iterations; ++i) {
    float elapsed = 0;
    checkCuda(cudaEventElapsedTime(&elapsed, events[i], events[i + 1]),
              "cudaEventElapsedTime");
    ms[i] = elapsed;
  }
  for (cudaEvent_t event : events)
    checkCuda(cudaEventDestroy(event), "cudaEventDestroy");
  return ms;
}

/// The median of backToBackMs, in microseconds.
template <class Launch>
double medianBackToBackUs(int warmup, int iterations, Launch &&launch) {
  std::vector<double> ms = backToBackMs(warmup, iterations, launch);
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

} // namespace bench
} // namespace vflow

#endif // VFLOW_BENCH_COMMON_BACKTOBACK_CUH
