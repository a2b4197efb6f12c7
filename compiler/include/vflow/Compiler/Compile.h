//===- Compile.h - The compiler's public C++ API ----------------*- C++ -*-===//
//
// Source text in, artifact out, with no MLIR, LLVM or ANTLR type in sight:
// this is what the Python bindings, the torch ops and serving engines call
// to compile a program in process (the JIT path). The artifact is the same
// one `vflowc -o FILE.vfa` writes.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_COMPILE_H
#define VFLOW_COMPILER_COMPILE_H

#include "vflow/Compiler/Workload.h"
#include "vflow/Runtime/Artifact.h"

#include <string>
#include <utility>
#include <vector>

namespace vflow {

struct CompileOptions {
  /// Param overrides, as `-p name=value` (name may be `flow.name`).
  std::vector<std::pair<std::string, std::string>> params;
  /// Where load("...") finds files named relative to the program.
  std::string baseDir = ".";
};

/// Whether a compile succeeded, and its diagnostics (errors and warnings)
/// as text with carets and as the JSON of `vflowc --diagnostics=json` (one
/// file entry).
struct Diagnosed {
  bool ok = false;
  std::string diagnosticsText;
  std::string diagnosticsJSON;
};

struct CompileResult : Diagnosed {
  /// On success: every flow, planned, with its generated CPU source.
  rt::Artifact artifact;
};

/// Compiles program text; `name` names it in diagnostics.
CompileResult compileProgram(const std::string &source, const std::string &name,
                             const CompileOptions &options = {});

/// Reads and compiles a file (load() paths are relative to it unless
/// options.baseDir is set to something other than ".").
CompileResult compileFile(const std::string &path,
                          const CompileOptions &options = {});

/// What a program looks like at one stage: what `vflowc --emit=<stage>`
/// prints. Summary is the JSON of `vflowc --emit=summary --json` for one
/// program.
enum class EmitStage { AST, VT, Kernels, Cpp, Cuda, Summary };

/// The stage's name as --emit spells it, and back (nothing when unknown).
const char *emitStageName(EmitStage stage);
bool parseEmitStage(const std::string &name, EmitStage &stage);

struct EmitResult : Diagnosed {
  std::string text;
};

/// Compiles program text to `stage` and prints it.
EmitResult emitProgram(const std::string &source, const std::string &name,
                       EmitStage stage, const CompileOptions &options = {});

/// `vflowc run --json`: every flow of the program on the synthetic
/// workload `spec`, at every point of `sweeps` (vflowc run's -p lists),
/// compared with the flow `baseline` when it is not empty; `text` is the
/// JSON report (flows that cannot run are in its "errors"; ok is false when
/// the program does not compile or a flow failed).
EmitResult runProgram(const std::string &source, const std::string &name,
                      const eval::WorkloadSpec &spec,
                      const CompileOptions &options = {},
                      const std::vector<eval::Sweep> &sweeps = {},
                      const std::string &baseline = "");

} // namespace vflow

#endif // VFLOW_COMPILER_COMPILE_H
