//===- Driver.h - Source to verified vt IR ----------------------*- C++ -*-===//

#ifndef VFLOW_COMPILER_DRIVER_H
#define VFLOW_COMPILER_DRIVER_H

#include "vflow/Frontend/Parser.h"
#include "vflow/Frontend/Sema.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include "vflow/Compiler/Compile.h"

#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <memory>

namespace vflow {

/// How far a compilation goes.
enum class CompileStage { Parse, Check, VT };

/// Everything one source file produces on its way to vt IR.
struct Compilation {
  explicit Compilation(std::unique_ptr<SourceBuffer> buffer)
      : buffer(std::move(buffer)), diags(this->buffer.get()) {}

  std::unique_ptr<SourceBuffer> buffer;
  DiagnosticEngine diags;
  std::unique_ptr<ast::Module> ast;
  CheckedModule checked;
  mlir::OwningOpRef<mlir::ModuleOp> vt;
};

/// Parses, checks and (for CompileStage::VT) lowers and verifies. Returns
/// false when anything went wrong; `compilation.diags` says what. IR that
/// fails to verify after a successful check is reported as an internal error.
bool compileSource(Compilation &compilation, mlir::MLIRContext &context,
                   const SemaOptions &options, CompileStage until);

/// The name of the checked flow `name` in the source (an empty range when
/// there is none): where a diagnostic about a whole flow points.
SourceRange flowNameRange(const Compilation &compilation, llvm::StringRef name);

/// Reads a whole file; returns false with a reason.
bool readSourceFile(const std::string &path, std::string &text,
                    std::string &error);

/// Runs `fn` on a thread with a large stack, so that legal but deeply nested
/// programs cannot overflow the default one. An exception `fn` throws is
/// rethrown in the caller.
void runWithLargeStack(const std::function<void()> &fn);

/// Counts the ops of each name inside a vt.flow, per stage:
/// "cache_stage", "index_stage", "const" and "flow" (declarations).
std::map<std::string, std::map<std::string, unsigned>>
countOps(mlir::Operation *flowOp);

/// Prints a compiled (CompileStage::VT) program at `stage` into `out`
/// (Kernels runs the pass pipeline first, printing the IR after every pass
/// on stderr with `printIRAfterAll`; `printLocations` adds locations to
/// IR). Returns false with an error in the diagnostics.
bool emitCompilation(Compilation &compilation, mlir::MLIRContext &context,
                     EmitStage stage, llvm::raw_ostream &out,
                     bool printLocations = false, bool printIRAfterAll = false);

/// A per-program summary of the checked flows and their vt IR (the main
/// job's output): fields, states, params, the selection and op counts.
std::string summarizeText(const Compilation &compilation);
std::string summarizeJSON(const Compilation &compilation);

} // namespace vflow

#endif // VFLOW_COMPILER_DRIVER_H
