//===- AttentionCommon.h - Host helpers for attention kernels ---*- C++ -*-===//
//
// The host-side argument checks and CUDA error handling that the decode and
// prefill launchers share.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_ATTENTION_ATTENTIONCOMMON_H
#define VFLOW_RUNTIME_CUDA_ATTENTION_ATTENTIONCOMMON_H

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Attention.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace vflow::rt::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;

/// Throws Error("<what>: <CUDA message>") when `status` is not cudaSuccess.
inline void checkCuda(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}

/// Throws Error("<op>: <message>") when `ok` is false.
inline void require(bool ok, const char *op, const std::string &message) {
  if (!ok)
    throw Error(std::string(op) + ": " + message);
}

inline bool aligned(const void *pointer, size_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

/// The multiprocessor count of the current device.
int currentDeviceSMs();

/// The pool and shape checks decode and prefill share.
void checkKVArgs(const char *op, const PagedKVArgs &args);

/// The kernels' view of PagedKVArgs (the first member of their parameters).
struct KVParams {
  const uint8_t *kPool;
  const uint8_t *vPool;
  const float *kScale;
  const float *vScale;
  const float *kTokenScale; ///< [numPages, numKVHeads, pageSize], or null
  const float *vTokenScale;
  int numKVHeads;
  int group;
  int pageSize;
  int numPages;
  const uint16_t *q;
  uint16_t *out;
  float scaleLog2; ///< the softmax scale times log2(e)
  int window;      ///< PagedKVArgs::window (0: none)
};

inline KVParams kvParams(const PagedKVArgs &args) {
  KVParams p;
  p.kPool = static_cast<const uint8_t *>(args.kPool);
  p.vPool = static_cast<const uint8_t *>(args.vPool);
  p.kScale = args.kScale;
  p.vScale = args.vScale;
  p.kTokenScale = args.kTokenScale;
  p.vTokenScale = args.vTokenScale;
  p.numKVHeads = args.numKVHeads;
  p.group = args.group;
  p.pageSize = args.pageSize;
  p.numPages = args.numPages;
  p.q = static_cast<const uint16_t *>(args.q);
  p.out = static_cast<uint16_t *>(args.out);
  p.scaleLog2 = args.scale * kLog2e;
  p.window = args.window;
  return p;
}

} // namespace vflow::rt::cuda::detail

#endif // VFLOW_RUNTIME_CUDA_ATTENTION_ATTENTIONCOMMON_H
