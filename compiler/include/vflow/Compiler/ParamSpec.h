//===- ParamSpec.h - A vt.param as the runtime sees it ----------*- C++ -*-===//
//
// Shared by the artifact writer (Artifact.cpp) and the CPU backend's flow
// description (CppEmitter.cpp); it sits below both so that the emitters
// never call back into the artifact writer.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_PARAMSPEC_H
#define VFLOW_COMPILER_PARAMSPEC_H

#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/Params.h"

namespace vflow {

/// A vt.param as the runtime sees it: name, type, default, compile-time.
rt::ParamSpec paramSpecOf(vt::ParamOp param);

} // namespace vflow

#endif // VFLOW_COMPILER_PARAMSPEC_H
