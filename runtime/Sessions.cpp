//===- Sessions.cpp - openSession: the backends behind the session API ----===//
//
// A library of its own (VFlowSessions), so that the runtime core does not
// depend on the GPU runtime: it links VFlowCuda when the build has CUDA.
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Session.h"
#ifdef VFLOW_HAS_CUDA_SESSION
#include "vflow/Runtime/cuda/CudaSession.h"
#endif

using namespace vflow::rt;

std::unique_ptr<Session> vflow::rt::openSession(const FlowArtifact &flow,
                                                const SessionConfig &config) {
  switch (config.device) {
  case Device::Cpu:
    return std::make_unique<HostSession>(flow, config);
  case Device::Cuda:
#ifdef VFLOW_HAS_CUDA_SESSION
    return cuda::openCudaSession(flow, config);
#else
    throw Error("this build of vflow has no GPU runtime (it was built "
                "without the CUDA toolkit)");
#endif
  }
  throw Error("openSession: unknown device");
}
