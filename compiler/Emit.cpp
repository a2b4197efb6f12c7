//===- Emit.cpp - A program at one stage, and vflowc run, in process ------===//
//
// The compile API (Compile.h) in process: a program's artifact, what
// `vflowc --emit=<stage>` prints and what `vflowc run --json` reports, so
// that vflowc and the Python package share one implementation.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Artifact.h"
#include "vflow/Compiler/Compile.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Evaluate.h"
#include "vflow/Compiler/Passes.h"
#include "vflow/Frontend/ASTPrinter.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <algorithm>

#include <utility>

using namespace vflow;

namespace {

const std::pair<EmitStage, const char *> kStageNames[] = {
    {EmitStage::AST, "ast"},         {EmitStage::VT, "vt"},
    {EmitStage::Kernels, "kernels"}, {EmitStage::Cpp, "cpp"},
    {EmitStage::Cuda, "cuda"},       {EmitStage::Summary, "summary"},
};

/// Compiles `source` to vt IR and runs `body` on it (on the large stack),
/// collecting the diagnostics into `result`.
template <typename Body>
EmitResult withCompilation(const std::string &source, const std::string &name,
                           const CompileOptions &options, Body body,
                           std::string *errorsInBrief = nullptr) {
  EmitResult result;
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  context.disableMultithreading();
  Compilation c(std::make_unique<SourceBuffer>(name, source));
  SemaOptions sema;
  sema.baseDir = options.baseDir;
  for (const auto &p : options.params)
    sema.overrides.push_back({p.first, p.second});
  runWithLargeStack([&] {
    result.ok = compileSource(c, context, sema, CompileStage::VT) &&
                body(c, context, result);
  });
  result.ok = result.ok && !c.diags.hasErrors();
  if (errorsInBrief && c.diags.hasErrors())
    *errorsInBrief = eval::errorsInBrief(c.diags);
  result.diagnosticsText = c.diags.renderText();
  result.diagnosticsJSON = c.diags.renderJSON();
  return result;
}

} // namespace

const char *vflow::emitStageName(EmitStage stage) {
  for (const auto &[s, name] : kStageNames)
    if (s == stage)
      return name;
  return "?";
}

bool vflow::parseEmitStage(const std::string &name, EmitStage &stage) {
  for (const auto &[s, n] : kStageNames)
    if (name == n) {
      stage = s;
      return true;
    }
  return false;
}

bool vflow::emitCompilation(Compilation &c, mlir::MLIRContext &context,
                            EmitStage stage, llvm::raw_ostream &out,
                            bool printLocations, bool printIRAfterAll) {
  switch (stage) {
  case EmitStage::AST:
    out << printAST(*c.ast, *c.buffer);
    return true;
  case EmitStage::Kernels: {
    mlir::PassManager pm(&context);
    buildCompilerPipeline(pm);
    if (printIRAfterAll) {
      context.disableMultithreading();
      pm.enableIRPrinting(
          /*shouldPrintBeforePass=*/[](mlir::Pass *,
                                       mlir::Operation *) { return false; },
          /*shouldPrintAfterPass=*/
          [](mlir::Pass *, mlir::Operation *) { return true; },
          /*printModuleScope=*/true, /*printAfterOnlyOnChange=*/false);
    }
    if (mlir::failed(pm.run(*c.vt))) {
      c.diags.error(DiagCode::Internal, SourceRange(),
                    "internal error: the pass pipeline failed");
      return false;
    }
    [[fallthrough]];
  }
  case EmitStage::VT: {
    mlir::OpPrintingFlags flags;
    if (printLocations)
      flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false)
          .useLocalScope();
    c.vt->print(out, flags);
    out << "\n";
    return true;
  }
  case EmitStage::Cpp:
  case EmitStage::Cuda: {
    rt::Artifact artifact;
    if (!buildArtifact(c, artifact))
      return false;
    for (const rt::FlowArtifact &f : artifact.flows) {
      if (stage == EmitStage::Cpp)
        for (const rt::ArtifactSource &src : f.sources)
          out << "// ----- " << src.name << " (flow " << f.name << ") -----\n"
              << src.text << "\n";
      else
        out << "// ----- " << f.name << ".cu (flow " << f.name << ") -----\n"
            << f.gpu.source << "\n";
    }
    return true;
  }
  case EmitStage::Summary:
    out << summarizeJSON(c);
    return true;
  }
  return false;
}

CompileResult vflow::compileProgram(const std::string &source,
                                    const std::string &name,
                                    const CompileOptions &options) {
  CompileResult result;
  EmitResult r =
      withCompilation(source, name, options,
                      [&](Compilation &c, mlir::MLIRContext &, EmitResult &) {
                        return buildArtifact(c, result.artifact);
                      });
  result.ok = r.ok;
  result.diagnosticsText = std::move(r.diagnosticsText);
  result.diagnosticsJSON = std::move(r.diagnosticsJSON);
  return result;
}

CompileResult vflow::compileFile(const std::string &path,
                                 const CompileOptions &options) {
  std::string text, error;
  if (!readSourceFile(path, text, error)) {
    CompileResult result;
    result.diagnosticsText = "error: " + error + "\n";
    result.diagnosticsJSON = unreadableFileJSON(path, error).dump();
    return result;
  }
  CompileOptions opts = options;
  if (opts.baseDir == ".") {
    size_t slash = path.rfind('/');
    if (slash != std::string::npos)
      opts.baseDir = path.substr(0, slash);
  }
  return compileProgram(text, path, opts);
}

EmitResult vflow::emitProgram(const std::string &source,
                              const std::string &name, EmitStage stage,
                              const CompileOptions &options) {
  return withCompilation(
      source, name, options,
      [&](Compilation &c, mlir::MLIRContext &context, EmitResult &result) {
        llvm::raw_string_ostream out(result.text);
        bool ok = emitCompilation(c, context, stage, out);
        out.flush();
        return ok;
      });
}

EmitResult vflow::runProgram(const std::string &source, const std::string &name,
                             const eval::WorkloadSpec &spec,
                             const CompileOptions &options,
                             const std::vector<eval::Sweep> &sweeps,
                             const std::string &baseline) {
  std::vector<eval::FlowReport> reports;
  std::vector<eval::FlowFailure> failures;
  std::string problem = spec.validate();
  if (!problem.empty()) {
    EmitResult bad;
    failures.push_back({name, "", "bad workload: " + problem});
    bad.text = eval::formatReportJSON(reports, failures, spec);
    bad.diagnosticsText = "error: bad workload: " + problem + "\n";
    return bad;
  }
  EmitResult result;
  result.ok = true;
  for (const auto &point : eval::sweepPoints(sweeps)) {
    CompileOptions at = options;
    at.params.insert(at.params.end(), point.begin(), point.end());
    size_t failuresBefore = failures.size();
    std::string brief = "the program does not compile";
    EmitResult one = withCompilation(
        source, name, at,
        [&](Compilation &c, mlir::MLIRContext &, EmitResult &) {
          eval::runFlows(c, spec, reports, failures, at.params);
          return failures.size() == failuresBefore;
        },
        &brief);
    if (!one.ok && failures.size() == failuresBefore)
      failures.push_back({name, "", brief});
    result.ok = result.ok && one.ok;
    result.diagnosticsText += one.diagnosticsText;
  }
  if (!baseline.empty() && !reports.empty() &&
      std::none_of(
          reports.begin(), reports.end(),
          [&](const eval::FlowReport &r) { return r.flow == baseline; })) {
    failures.push_back(
        {name, baseline, "baseline: no flow '" + baseline + "' ran"});
    result.ok = false;
  }
  result.text = eval::formatReportJSON(reports, failures, spec, baseline);
  return result;
}
