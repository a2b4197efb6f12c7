//===- CppEmitter.h - The CPU backend: vt IR to C++ -------------*- C++ -*-===//
//
// Emits one self-contained C++ translation unit for a vt.flow (planned, with
// vt.kernel groups, or just lowered). It includes only
// "vflow/Runtime/KernelABI.h" and "vflow/Runtime/Random.h" and defines four
// extern "C" entry points (see KernelABI.h for the argument structs):
//
//   void vflow_<flow>_consts(const VflowConstArgs *);
//   void vflow_<flow>_cache(const VflowCacheArgs *);
//   void vflow_<flow>_index(const VflowIndexArgs *);
//   int64_t vflow_<flow>_budget(const double *params, int64_t numBlocks,
//                               int64_t contextLen);
//
// The code computes what the reference interpreter computes. docs/backends.md
// describes its shape.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_CPPEMITTER_H
#define VFLOW_COMPILER_CPPEMITTER_H

#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/CpuFlow.h"

#include <string>

namespace vflow {

/// The C++ of `flow`; "" with a reason in `error` when the flow holds
/// something the backend cannot emit.
std::string emitCpp(vt::FlowOp flow, std::string &error);

/// The metadata rt::CpuFlow needs to run the code of emitCpp(flow): params
/// (declaration order, current values), consts, fields and states, and
/// which inputs the index stage reads. False with a reason in `error`.
bool describeCpuFlow(vt::FlowOp flow, rt::CpuFlowInfo &info,
                     std::string &error);

} // namespace vflow

#endif // VFLOW_COMPILER_CPPEMITTER_H
