//===- FlowKernels.cpp - A flow's generated kernels on the device ---------===//

#include "FlowKernels.h"
#include "../Launch.h"

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Jit.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

/// Uploads `bytes` of `src` into a new array of at least one byte (waits).
DeviceArray uploaded(const void *src, size_t bytes, cudaStream_t st) {
  DeviceArray a(std::max<size_t>(1, bytes));
  if (bytes)
    checkCuda(cudaMemcpyAsync(a.get(), src, bytes, cudaMemcpyHostToDevice, st),
              "copying to the device");
  checkCuda(cudaStreamSynchronize(st), "copying to the device");
  return a;
}

} // namespace

FlowKernels::FlowKernels(const FlowArtifact &flow, int group, int headDim,
                         DType kvDType, const std::string &arch, bool quiet,
                         const std::string &cacheDir, cudaStream_t stream,
                         const GpuLaunchOptions &launch)
    : gpu(flow.gpu), flowParams(flow.name, flow.params, flow.budgets,
                                flow.selectionBudget, BudgetScope{group}),
      stream(stream) {
  // Everything comes from the artifact: params and budgets (evaluated by
  // the runtime), the consts' values (computed by the compiler). No host
  // compiler is needed.
  const FlowArtifact::ConstValues *constValues = nullptr;
  if (!flow.consts.empty()) {
    constValues = flow.findConstValues(headDim);
    if (!constValues) {
      std::string dims;
      for (const FlowArtifact::ConstValues &c : flow.constValues)
        dims += (dims.empty() ? "" : ", ") + std::to_string(c.headDim);
      throw Error("GPU session: the artifact of flow '" + flow.name +
                  "' carries its consts' values for head dims " +
                  (dims.empty() ? "none" : dims) + ", not " +
                  std::to_string(headDim) +
                  "; declare `param head_dim = " + std::to_string(headDim) +
                  ";` in the flow to compile them for it (or recompile an "
                  "artifact from an older vflowc)");
    }
  }
  NvrtcOptions nvrtc;
  nvrtc.arch = arch.empty() ? archOfCurrentDevice() : arch;
  nvrtc.extra = gpuSpecializationMacros(gpu, group, headDim, kvDType);
  nvrtc.quiet = quiet;
  nvrtc.cacheDir = cacheDir;
  // PTX compiled ahead of time for this shape and an arch the device runs
  // (vflowc --arch) saves the NVRTC compile; the driver JITs it once.
  const GpuBinary *aot = nullptr;
  auto number = [](const std::string &t) {
    size_t i = t.find('_');
    return i == std::string::npos ? 0 : std::atoi(t.c_str() + i + 1);
  };
  for (const GpuBinary &b : gpu.binaries)
    if (b.group == group && b.headDim == headDim && b.kvDType == kvDType &&
        number(b.target) <= number(nvrtc.arch) &&
        (!aot || number(b.target) > number(aot->target)))
      aot = &b;
  CudaBinary binary;
  if (aot) {
    binary.ptx = aot->ptx;
    binary.target = aot->target;
  } else {
    binary = compileCuda(flow.name, gpu.source, nvrtc);
  }
  module = Module::load(binary);
  // Generated kernels keep GridDependency.cuh's vd::awaitEarlierGrids contract;
  // their griddepcontrol exists in code generated for sm_90 and later.
  programmatic = number(binary.target) >= 90 && programmaticLaunchesEnabled();
  // Fuse::Never runs the append kernel on its own at every step (per-kernel
  // profiles; the path of grids longer than one wave), Always the appending
  // twin at every step where it exists (measurements).
  using Fuse = GpuLaunchOptions::Fuse;
  fusedAppend = launch.fusedAppend == Fuse::Never
                    ? -1
                    : gpuFusedAppend(gpu, group, headDim);
  alwaysFuse = launch.fusedAppend == Fuse::Always;
  fields = gpu.kernels.size();
  for (size_t k = 0; k < gpu.kernels.size(); ++k) {
    const GpuKernelInfo &info = gpu.kernels[k];
    functions.push_back(module.function(info.symbol));
    tiles.push_back(
        info.grid == GpuGrid::Tile ? gpuTileBlocks(info, group, headDim) : 0);
    if (info.grid == GpuGrid::Fields)
      fields = k;
  }
  // CTAs of a kernel the device holds at once: one wave.
  const uint64_t multiprocessors = uint64_t(currentDevice().multiprocessors);
  auto wave = [&](void *function, const GpuKernelInfo &info) {
    return uint64_t(residentBlocksPerMultiprocessor(function,
                                                    unsigned(info.threads))) *
           multiprocessors;
  };
  for (size_t k = 0; k < gpu.kernels.size() && firstTile < 0; ++k)
    if (gpu.kernels[k].grid == GpuGrid::Tile) {
      firstTile = int64_t(k);
      tileWave = wave(functions[k], gpu.kernels[k]);
    }
  forcedSplit = std::max(0, launch.tileSplit);
  if (fusedAppend >= 0) {
    const GpuKernelInfo &info = gpu.kernels[size_t(fusedAppend)];
    appendingSymbol = info.symbol + "_append";
    appendingFunction = module.function(appendingSymbol);
    appendingWave = wave(appendingFunction, info);
  }
  std::vector<const float *> ptrs;
  if (constValues)
    for (const std::vector<float> &c : constValues->values) {
      constArrays.push_back(
          uploaded(c.data(), c.size() * sizeof(float), stream));
      ptrs.push_back(constArrays.back().get<float>());
    }
  constPtrs = uploaded(ptrs.data(), ptrs.size() * sizeof(float *), stream);
  paramValues = uploaded(flowParams.values().data(),
                         flowParams.values().size() * sizeof(double), stream);
}

void FlowKernels::setParam(const std::string &name, double value) {
  flowParams.set(name, value);
  checkCuda(cudaMemcpyAsync(paramValues.get(), flowParams.values().data(),
                            flowParams.values().size() * sizeof(double),
                            cudaMemcpyHostToDevice, stream),
            "setting a param");
  checkCuda(cudaStreamSynchronize(stream), "setting a param");
}

void FlowKernels::setBudgetScope(int64_t firstLayer, int64_t numLayers,
                                 int64_t firstKVHead, int64_t numKVHeads) {
  flowParams.setScope(firstLayer, numLayers, firstKVHead, numKVHeads);
}

void FlowKernels::bind(VflowGpuArgs &a) const {
  a.params = paramValues.get<double>();
  a.consts = constPtrs.get<const float *const>();
}

bool FlowKernels::launch(size_t kernel, unsigned gx, unsigned gy,
                         VflowGpuArgs &a, cudaStream_t st, bool afterOwnGrid,
                         bool appending) const {
  if (gx == 0 || gy == 0)
    return false;
  void *argv[] = {&a};
  launchKernel(appending ? appendingFunction : functions[kernel], gx, gy, 1,
               unsigned(gpu.kernels[kernel].threads), 1, 1, 0, st, argv,
               programmatic && afterOwnGrid);
  return true;
}

void FlowKernels::launchFields(VflowGpuArgs &a, int numPages, int numKVHeads,
                               cudaStream_t st) const {
  if (hasFields() && numPages > 0)
    launch(fields, unsigned(numPages), unsigned(numKVHeads), a, st, false);
}

bool FlowKernels::storesStates() const {
  for (const GpuKernelInfo &k : gpu.kernels)
    if (k.grid == GpuGrid::Commit)
      return true;
  return false;
}

void FlowKernels::launchAppend(VflowGpuArgs &a, int numKVHeads,
                               cudaStream_t st) const {
  for (size_t k = 0; k < gpu.kernels.size(); ++k)
    if (gpu.kernels[k].grid == GpuGrid::Append)
      launch(k, unsigned(a.batch), unsigned(numKVHeads), a, st, false);
}

void FlowKernels::indexGrid(size_t kernel, int64_t gridBlocks, unsigned rows,
                            int split, unsigned &gx, unsigned &gy) const {
  gx = rows;
  gy = 1;
  if (gpu.kernels[kernel].grid == GpuGrid::Tile) {
    const int64_t tile = std::max<int64_t>(1, tiles[kernel] / split);
    gx = unsigned((gridBlocks + tile - 1) / tile);
    gy = rows;
  }
}

int FlowKernels::tileSplit(int64_t gridBlocks, unsigned rows) const {
  if (forcedSplit > 0)
    return forcedSplit;
  int split = 1;
  if (firstTile < 0)
    return split;
  // Halved while the doubled grid still runs in one wave and every warp
  // keeps a block of its CTA's tile.
  const size_t k = size_t(firstTile);
  const int64_t warps = gpu.kernels[k].threads / 32;
  for (;;) {
    unsigned gx = 0, gy = 0;
    indexGrid(k, gridBlocks, rows, 2 * split, gx, gy);
    if (tiles[k] / (2 * split) < warps || uint64_t(gx) * gy > tileWave)
      return split;
    split *= 2;
  }
}

void FlowKernels::launchIndex(
    VflowGpuArgs &a, int numKVHeads, int64_t gridBlocks, bool withAppend,
    cudaStream_t st,
    const std::function<void(const std::string &)> &before) const {
  flowParams.checkInScope("GPU index stage", a.layer, a.kvHeadBase);
  flowParams.checkInScope("GPU index stage", a.layer,
                          int64_t(a.kvHeadBase) + numKVHeads - 1);
  const unsigned rows = unsigned(a.batch) * unsigned(numKVHeads);
  // Tiles split where the first tile kernel's grid would not fill the GPU
  // (small batches, short contexts): more CTAs, fewer blocks each.
  const int split = tileSplit(std::max<int64_t>(gridBlocks, 1), rows);
  a.tileSplit = split;
  // The first index kernel's appending twin does the append kernel's work
  // where its grid runs in one wave (it runs even where no row has a block
  // yet): a kernel's latency less. It holds fewer CTAs per multiprocessor
  // (the cache stage's registers), which would slow a longer grid: there
  // the append kernel runs on its own.
  bool fused = false;
  if (withAppend && fusedAppend >= 0) {
    unsigned gx = 0, gy = 0;
    indexGrid(size_t(fusedAppend), std::max<int64_t>(gridBlocks, 1), rows,
              split, gx, gy);
    fused = alwaysFuse || uint64_t(gx) * gy <= appendingWave;
  }
  // The first launch follows whatever the caller ran last (which may let
  // its dependents start before its writes are done, and read lengths or
  // tables it wrote): a full dependency. The later ones follow this
  // flow's own kernels, programmatically.
  bool launched = false;
  for (size_t k = 0; k < gpu.kernels.size(); ++k) {
    GpuGrid grid = gpu.kernels[k].grid;
    if (grid == GpuGrid::Fields ||
        (grid == GpuGrid::Append && (!withAppend || fused)) ||
        (grid == GpuGrid::Retain && !a.retainScore))
      continue;
    const bool appending = fused && int64_t(k) == fusedAppend;
    if (before)
      before(appending ? appendingSymbol : gpu.kernels[k].symbol);
    if (grid == GpuGrid::Append) {
      launched |=
          launch(k, unsigned(a.batch), unsigned(numKVHeads), a, st, launched);
      continue;
    }
    unsigned gx = 0, gy = 0;
    indexGrid(k, appending ? std::max<int64_t>(gridBlocks, 1) : gridBlocks,
              rows, split, gx, gy);
    launched |= launch(k, gx, gy, a, st, launched, appending);
  }
}
