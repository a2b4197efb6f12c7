//===- CudaSession.h - The GPU backend of the session API -------*- C++ -*-===//
//
// The CUDA backend behind the one session API (Session.h): a paged KV cache
// in device memory (K/V pools per layer in bf16, f16, or int8 and fp8e4m3
// with a scale per stored row; the flow's fields in pools indexed by the same
// page ids; states and attention mass per sequence slot), the flow's kernels
// compiled with NVRTC for the device, and sparse paged decode attention
// over the blocks they select. Needs no compiler but NVRTC: the CUDA
// source (or PTX), the consts' values and the budgets come from the
// artifact. openSession(flow, cfg) with Device::Cuda calls it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_CUDASESSION_H
#define VFLOW_RUNTIME_CUDA_CUDASESSION_H

#include "vflow/Runtime/Session.h"

#include <memory>

namespace vflow::rt::cuda {

std::unique_ptr<Session> openCudaSession(const FlowArtifact &flow,
                                         const SessionConfig &config);

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_CUDASESSION_H
