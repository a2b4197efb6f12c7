//===- FlowKernels.h - A flow's generated kernels on the device -*- C++ -*-===//
//
// One flow's generated CUDA kernels on the current device, specialized to a
// (query heads per KV head, head dimension, KV dtype): compiled by NVRTC
// (cached) or loaded from PTX the artifact carries, with the flow's consts
// (computed by the compiler) and run-time params on the device. It knows how
// each kernel is launched (its `#vt.launch` grid, read from the artifact);
// the caller owns every buffer the kernels read and write (VflowGpuArgs).
// The GPU session launches a flow through it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_FLOW_FLOWKERNELS_H
#define VFLOW_RUNTIME_CUDA_FLOW_FLOWKERNELS_H

#include "DeviceMemory.h"

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Session.h"
#include "vflow/Runtime/cuda/Driver.h"
#include "vflow/Runtime/cuda/FlowDevice.cuh"
#include "vflow/Runtime/cuda/GpuFlowInfo.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace vflow::rt::cuda {

class FlowKernels {
public:
  /// Compiles (or loads) `flow`'s kernels for this shape; `arch` empty means
  /// the current device's. Throws Error naming what is missing.
  FlowKernels(const FlowArtifact &flow, int group, int headDim, DType kvDType,
              const std::string &arch, bool quiet, const std::string &cacheDir,
              cudaStream_t stream,
              const GpuLaunchOptions &launch = GpuLaunchOptions());

  const GpuFlowInfo &info() const { return gpu; }
  const FlowParams &params() const { return flowParams; }
  /// Sets a run-time param (validated by FlowParams) on the host and the
  /// device (waits for the copy).
  void setParam(const std::string &name, double value);
  /// The layers and KV heads the index stage runs for (FlowParams::setScope;
  /// the group stays the kernels'): list capacities cover the largest
  /// budget over them, and launchIndex refuses a layer or KV head outside
  /// them when a budget reads it.
  void setBudgetScope(int64_t firstLayer, int64_t numLayers,
                      int64_t firstKVHead, int64_t numKVHeads);

  /// The params and consts pointers of `a`.
  void bind(VflowGpuArgs &a) const;

  /// Whether the flow has a cache stage (a `fields` kernel).
  bool hasFields() const { return fields < gpu.kernels.size(); }
  /// Whether the index stage stores states (a `commit` kernel): then it
  /// must run at every step.
  bool storesStates() const;
  /// Only the append kernel of launchIndex (the step's token, then the
  /// cache stage on a block it completes).
  void launchAppend(VflowGpuArgs &a, int numKVHeads, cudaStream_t st) const;
  /// The cache stage of the `numPages` pages at a.pages, every KV head.
  void launchFields(VflowGpuArgs &a, int numPages, int numKVHeads,
                    cudaStream_t st) const;
  /// The index stage of one decode layer for a.batch rows: the append
  /// (when `withAppend`: a.kNew and a.vNew hold each row's new token; its
  /// own kernel, or the first index kernel's appending twin where
  /// gpuFusedAppend has one and its grid runs in one wave), the tile
  /// kernels over `gridBlocks` blocks, the row kernels, the retain kernel
  /// (where a.retainScore is set) and the commit kernel.
  /// `before(symbol)` runs before each launch (profiling marks).
  void
  launchIndex(VflowGpuArgs &a, int numKVHeads, int64_t gridBlocks,
              bool withAppend, cudaStream_t st,
              const std::function<void(const std::string &)> &before) const;

private:
  /// Launches `kernel` (its appending twin when `appending`) unless its
  /// grid is empty (then false); as a programmatic dependent when
  /// `afterOwnGrid` (the grid before it in the stream is one of this
  /// flow's) and the binary supports it.
  bool launch(size_t kernel, unsigned gx, unsigned gy, VflowGpuArgs &a,
              cudaStream_t st, bool afterOwnGrid, bool appending = false) const;
  /// The grid of index kernel `kernel` for `rows` lists over `gridBlocks`
  /// blocks, tiles split `split` ways.
  void indexGrid(size_t kernel, int64_t gridBlocks, unsigned rows, int split,
                 unsigned &gx, unsigned &gy) const;
  /// How many ways a step's tiles split (VflowGpuArgs::tileSplit): halved
  /// while the first tile kernel's grid, doubled, still runs in one wave.
  int tileSplit(int64_t gridBlocks, unsigned rows) const;

  GpuFlowInfo gpu;
  FlowParams flowParams;
  Module module;
  std::vector<void *> functions;
  std::vector<int64_t> tiles;
  size_t fields = 0;
  /// The index kernel with an appending twin (rt::gpuFusedAppend), or -1;
  /// the twin, and the CTAs of it the device holds at once.
  int64_t fusedAppend = -1;
  std::string appendingSymbol;
  void *appendingFunction = nullptr;
  uint64_t appendingWave = 0;
  bool alwaysFuse = false; ///< GpuLaunchOptions::Fuse::Always
  /// The first tile kernel (or -1), and the CTAs of it the device holds at
  /// once; GpuLaunchOptions::tileSplit when set (measurements).
  int64_t firstTile = -1;
  uint64_t tileWave = 0;
  int forcedSplit = 0;
  bool programmatic = false; ///< code for sm_90+: griddepcontrol runs
  std::vector<DeviceArray> constArrays;
  DeviceArray constPtrs, paramValues;
  cudaStream_t stream = nullptr;
};

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_FLOW_FLOWKERNELS_H
