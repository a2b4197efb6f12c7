//===- FlowOps.h - A flow's kernels behind the C table ----------*- C++ -*-===//
//
// A flow's kernels (FlowKernels) and the VflowFlowOps table (FlowOpsAbi.h)
// that launches them: the GPU session's decode layer (DecodeLayer.h) and the
// torch ops (through vflow._vflow.CudaFlow's handle) both launch a flow
// through this table, so a decode layer is written once.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_FLOW_FLOWOPS_H
#define VFLOW_RUNTIME_CUDA_FLOW_FLOWOPS_H

#include "FlowKernels.h"

#include "vflow/Runtime/cuda/FlowOpsAbi.h"

#include <memory>
#include <vector>

namespace vflow::rt::cuda {

class FlowOps {
public:
  /// Compiles (or loads) `flow`'s kernels for this specialization on the
  /// current device (FlowKernels' constructor).
  FlowOps(const FlowArtifact &flow, int group, int headDim, DType kvDType,
          bool quiet, const std::string &cacheDir, cudaStream_t stream,
          const GpuLaunchOptions &launch = GpuLaunchOptions());
  FlowOps(const FlowOps &) = delete;
  FlowOps &operator=(const FlowOps &) = delete;

  const VflowFlowOps &table() const { return ops; }
  FlowKernels &kernels() { return *flowKernels; }
  const FlowKernels &kernels() const { return *flowKernels; }
  /// f32 elements of one list's workspace for `maxBlocks` blocks.
  int64_t workspaceFloats(int64_t maxBlocks) const;

private:
  std::unique_ptr<FlowKernels> flowKernels;
  std::vector<const char *> fieldDTypes;
  std::vector<int64_t> fieldElements, stateElements;
  std::vector<int> statePerBlock;
  VflowFlowOps ops{};
};

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_FLOW_FLOWOPS_H
