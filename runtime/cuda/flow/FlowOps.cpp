//===- FlowOps.cpp - A flow's kernels behind the C table ------------------===//

#include "FlowOps.h"

#include "vflow/Runtime/DType.h"

#include <exception>
#include <string>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

/// The message of the last failed launch on this thread.
thread_local std::string lastError;

template <typename Body> const char *guarded(Body body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception &e) {
    lastError = e.what();
    return lastError.c_str();
  }
}

const FlowKernels &kernelsOf(void *self) {
  return static_cast<const FlowOps *>(self)->kernels();
}

} // namespace

FlowOps::FlowOps(const FlowArtifact &flow, int group, int headDim,
                 DType kvDType, bool quiet, const std::string &cacheDir,
                 cudaStream_t stream, const GpuLaunchOptions &launch)
    : flowKernels(std::make_unique<FlowKernels>(
          flow, group, headDim, kvDType, "", quiet, cacheDir, stream, launch)) {
  int device = 0;
  checkCuda(cudaGetDevice(&device), "finding the current device");
  ops.magic = kVflowFlowOpsMagic;
  ops.version = kVflowFlowOpsVersion;
  ops.group = group;
  ops.headDim = headDim;
  ops.device = device;
  ops.kvDType = dtypeName(kvDType);
  ops.pageSize = int(flow.blockSize);
  ops.numFields = int(flow.fields.size());
  ops.numStates = int(flow.states.size());
  ops.hasFields = flowKernels->hasFields();
  ops.readsMass = flow.readsInput("mass");
  ops.storesStates = flowKernels->storesStates();
  for (const ArtifactTensor &f : flow.fields) {
    fieldDTypes.push_back(dtypeName(f.dtype));
    fieldElements.push_back(f.elements(headDim, group));
  }
  for (const ArtifactTensor &s : flow.states) {
    stateElements.push_back(s.elements(headDim, group));
    statePerBlock.push_back(s.perBlock ? 1 : 0);
  }
  ops.fieldDTypes = fieldDTypes.data();
  ops.fieldElements = fieldElements.data();
  ops.stateElements = stateElements.data();
  ops.statePerBlock = statePerBlock.data();
  ops.self = this;
  ops.workspaceFloats = [](void *self, int64_t maxBlocks) {
    return static_cast<const FlowOps *>(self)->workspaceFloats(maxBlocks);
  };
  ops.launchFields = [](void *self, VflowGpuArgs *a, int numPages,
                        void *stream) {
    return guarded([&] {
      const FlowKernels &k = kernelsOf(self);
      k.bind(*a);
      k.launchFields(*a, numPages, a->numKVHeads,
                     static_cast<cudaStream_t>(stream));
    });
  };
  ops.launchAppend = [](void *self, VflowGpuArgs *a, void *stream) {
    return guarded([&] {
      const FlowKernels &k = kernelsOf(self);
      k.bind(*a);
      k.launchAppend(*a, a->numKVHeads, static_cast<cudaStream_t>(stream));
    });
  };
  ops.launchIndex = [](void *self, VflowGpuArgs *a, int64_t gridBlocks,
                       int withAppend, void *stream,
                       void (*before)(void *, const char *), void *ctx) {
    return guarded([&] {
      const FlowKernels &k = kernelsOf(self);
      k.bind(*a);
      k.launchIndex(*a, a->numKVHeads, gridBlocks, withAppend != 0,
                    static_cast<cudaStream_t>(stream),
                    [&](const std::string &symbol) {
                      if (before)
                        before(ctx, symbol.c_str());
                    });
    });
  };
}

int64_t FlowOps::workspaceFloats(int64_t maxBlocks) const {
  int64_t perBlock = 0, fixed = 0;
  gpuWorkspaceShape(flowKernels->info(), ops.group, ops.headDim, perBlock,
                    fixed);
  return perBlock * maxBlocks + fixed;
}
