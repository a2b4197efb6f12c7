//===- DeviceMemory.h - Device buffers of the GPU session -------*- C++ -*-===//
//
// Private to runtime/cuda/flow: the CUDA runtime's status checked with a
// message, and device allocations owned by the session (fixed size, or
// growing on demand).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_FLOW_DEVICEMEMORY_H
#define VFLOW_RUNTIME_CUDA_FLOW_DEVICEMEMORY_H

#include "vflow/Runtime/Error.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

namespace vflow::rt::cuda {

/// Throws Error("GPU session: <what>: <CUDA's reason>") on failure.
inline void checkCuda(cudaError_t status, const std::string &what) {
  if (status != cudaSuccess)
    throw Error("GPU session: " + what + ": " + cudaGetErrorString(status));
}

/// An allocation freed with its owner: device memory, or page-locked host
/// memory with `Pinned`. resize() reallocates when a larger size is asked
/// for (the contents are not kept).
template <bool Pinned> class CudaAllocation {
public:
  CudaAllocation() = default;
  explicit CudaAllocation(size_t bytes) { resize(bytes); }
  ~CudaAllocation() { release(); }
  CudaAllocation(CudaAllocation &&o) noexcept : ptr(o.ptr), size(o.size) {
    o.ptr = nullptr;
    o.size = 0;
  }
  CudaAllocation &operator=(CudaAllocation &&o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(size, o.size);
    return *this;
  }
  /// At least `bytes` (grows; never shrinks).
  void resize(size_t bytes) {
    if (bytes <= size)
      return;
    release();
    checkCuda(Pinned ? cudaMallocHost(&ptr, bytes) : cudaMalloc(&ptr, bytes),
              "allocating " + std::to_string(bytes) +
                  (Pinned ? " pinned bytes" : " bytes"));
    size = bytes;
  }
  template <class T = void> T *get() const { return static_cast<T *>(ptr); }
  size_t bytes() const { return size; }

private:
  void release() {
    if (ptr)
      Pinned ? cudaFreeHost(ptr) : cudaFree(ptr);
    ptr = nullptr;
    size = 0;
  }
  void *ptr = nullptr;
  size_t size = 0;
};

/// Device memory.
using DeviceArray = CudaAllocation<false>;

/// Page-locked host memory that uploads read without the host waiting for
/// them: acquire() returns it once the copies that last read it have run
/// (normally long done), release(stream) marks the copies just queued.
class PinnedBuffer {
public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer &) = delete;
  PinnedBuffer &operator=(const PinnedBuffer &) = delete;
  ~PinnedBuffer() {
    if (event)
      cudaEventDestroy(event);
  }
  /// At least `bytes`, free to write.
  void *acquire(size_t bytes) {
    if (event)
      checkCuda(cudaEventSynchronize(event), "waiting for an upload");
    memory.resize(bytes);
    return memory.get();
  }
  /// What acquire() returned last.
  void *get() const { return memory.get(); }
  /// The copies queued on `stream` so far are the last to read it.
  void release(cudaStream_t stream) {
    if (!event)
      checkCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                "creating an event");
    checkCuda(cudaEventRecord(event, stream), "recording an event");
  }

private:
  CudaAllocation<true> memory;
  cudaEvent_t event = nullptr;
};

/// Ints written on the host and copied to the device without the host
/// waiting (a PinnedBuffer and the device array it fills): host(n), fill
/// it, then upload(stream).
class IntUpload {
public:
  /// Room for `n` ints on the host, free to write.
  int *host(size_t n) {
    count = n;
    return static_cast<int *>(pinned.acquire(n * sizeof(int)));
  }
  /// Queues the copy of the host ints on `stream`; their device copy.
  const int *upload(cudaStream_t stream, const char *what) {
    device.resize(count * sizeof(int));
    checkCuda(cudaMemcpyAsync(device.get(), pinned.get(), count * sizeof(int),
                              cudaMemcpyHostToDevice, stream),
              what);
    pinned.release(stream);
    return device.get<int>();
  }

private:
  PinnedBuffer pinned;
  DeviceArray device;
  size_t count = 0;
};

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_FLOW_DEVICEMEMORY_H
