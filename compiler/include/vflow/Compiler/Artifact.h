//===- Artifact.h - Planned vt IR to an artifact ----------------*- C++ -*-===//

#ifndef VFLOW_COMPILER_ARTIFACT_H
#define VFLOW_COMPILER_ARTIFACT_H

#include "vflow/Compiler/Driver.h"
#include "vflow/Dialect/VT/VTOps.h"
#include "vflow/Runtime/Artifact.h"

namespace vflow {

/// Runs the pass pipeline on a compiled module and emits the CPU source of
/// every flow; fills `artifact`. Returns false with a reason in `error` (an
/// internal error: a checked program must always get this far).
bool buildArtifact(Compilation &compilation, rt::Artifact &artifact,
                   std::string &error);

/// buildArtifact, with a failure reported as an internal error in
/// `compilation.diags`.
bool buildArtifact(Compilation &compilation, rt::Artifact &artifact);

/// The version string artifacts record as their compiler.
const char *compilerVersion();

} // namespace vflow

#endif // VFLOW_COMPILER_ARTIFACT_H
