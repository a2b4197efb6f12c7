//===- CudaEmitter.h - The CUDA backend: vt IR to CUDA C++ ------*- C++ -*-===//
//
// Emits one CUDA source per planned vt.flow (after the pass pipeline, so the
// index stage is grouped into vt.kernel ops) and the description the runtime
// launches it with (rt::GpuFlowInfo). The source includes only
// "vflow/FlowDevice.cuh" and is specialized by macros at NVRTC time:
// VFLOW_G, VFLOW_D (group, head dimension), VFLOW_KV (vd::BF16, vd::F16,
// vd::FP8E4M3 or vd::INT8) and VFLOW_TILE_<i> (blocks per tile of tile
// kernel i).
//
// Kernels (all take one VflowGpuArgs by value, 256 threads):
//   vflow_<flow>_append   writes each row's new token into its page and, when
//                         that completes the block, computes its fields
//   vflow_<flow>_fields   computes the fields of a list of pages
//   vflow_<flow>_k<i>     one per vt.kernel of the index stage: block_map
//                         kernels run per (tile of blocks, list), the
//                         others per list; the select kernel writes the list
//                         of the sparse block table
//   vflow_<flow>_commit   makes this step's state stores the next step's
//                         state (only when the flow stores states)
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_CUDAEMITTER_H
#define VFLOW_COMPILER_CUDAEMITTER_H

#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/cuda/GpuFlowInfo.h"

#include <string>

namespace vflow {

/// Fills `info` (source and kernels) for the planned `flow`; false with a
/// reason in `error` when the flow holds something the backend cannot emit.
bool emitCuda(vt::FlowOp flow, rt::GpuFlowInfo &info, std::string &error);

} // namespace vflow

#endif // VFLOW_COMPILER_CUDAEMITTER_H
