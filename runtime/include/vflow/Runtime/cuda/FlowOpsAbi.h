//===- FlowOpsAbi.h - A flow's kernels for other extensions -----*- C++ -*-===//
//
// How an extension built apart from vflow (the torch ops, built against the
// installed torch) launches a flow's generated kernels without linking the
// runtime: the Python extension opens the flow (rt::cuda::FlowKernels:
// NVRTC or AOT PTX, consts and params on the device) and hands out the
// address of a VflowFlowOps, which the other extension takes as an integer
// handle. Plain C types only; the caller builds VflowGpuArgs on its own
// buffers (params and consts are bound by the launch).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_FLOWOPSABI_H
#define VFLOW_RUNTIME_CUDA_FLOWOPSABI_H

#include "vflow/Runtime/cuda/FlowDevice.cuh"

#include <cstdint>

/// "vflowops" in ASCII, then the layout's version.
constexpr uint64_t kVflowFlowOpsMagic = 0x76666c6f776f7073ULL;
/// 2: VflowGpuArgs has tileSplit. 3: kvDType spelled as the language's
/// dtypes (fp8e4m3); launchAppend, storesStates; launchIndex calls
/// `before` before each launch. 4: VflowGpuArgs has layer and kvHeadBase
/// (launchIndex refuses ones outside the flow's budget scope when a budget
/// reads them). 5: VflowGpuArgs has retainScore (set it to null: the
/// torch ops run no retain block). 6: VflowGpuArgs has firstToken (null:
/// no row evicted).
constexpr int kVflowFlowOpsVersion = 6;

/// Every launch returns null, or an error message (valid until the next
/// call on this thread).
struct VflowFlowOps {
  uint64_t magic;
  int version;
  /// The specialization the kernels were compiled for, and the device.
  int group, headDim, device;
  const char *kvDType; ///< "bf16", "f16" or "fp8e4m3"
  int pageSize;        ///< tokens per block
  int numFields, numStates;
  /// Whether the flow has a cache stage (fields computed per block), and
  /// whether it reads the last step's attention mass.
  int hasFields, readsMass;
  /// Per field: its dtype (f32, bf16, f16, fp8e4m3, fp8e5m2) and elements
  /// per (page, KV head).
  const char *const *fieldDTypes;
  const int64_t *fieldElements;
  /// Per state (f32): elements per (slot, KV head), times the blocks of a
  /// block table when statePerBlock.
  const int64_t *stateElements;
  const int *statePerBlock;
  void *self;
  /// f32 elements of the flow's workspace per list: perBlock * maxBlocks +
  /// fixed.
  int64_t (*workspaceFloats)(void *self, int64_t maxBlocks);
  /// Whether the index stage stores states (then it must run at every
  /// step, even where the selection takes every block).
  int storesStates;
  /// The cache stage on a->pages[0, numPages), every KV head.
  const char *(*launchFields)(void *self, VflowGpuArgs *a, int numPages,
                              void *stream);
  /// The append kernel alone, for a->batch rows: each row's new token
  /// (a->kNew, a->vNew) into its tail page, the cache stage on a block it
  /// completes.
  const char *(*launchAppend)(void *self, VflowGpuArgs *a, void *stream);
  /// The index stage of one layer for a->batch rows (with the append of
  /// a->kNew, a->vNew first when `withAppend`); tile kernels over
  /// `gridBlocks` blocks. `before(ctx, symbol)`, when not null, runs before
  /// each launch (profiling marks).
  const char *(*launchIndex)(void *self, VflowGpuArgs *a, int64_t gridBlocks,
                             int withAppend, void *stream,
                             void (*before)(void *ctx, const char *symbol),
                             void *ctx);
};

#endif // VFLOW_RUNTIME_CUDA_FLOWOPSABI_H
