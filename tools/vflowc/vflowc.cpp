//===- vflowc.cpp - The vflow compiler driver -----------------------------===//
//
//   vflowc FILE... [-p name=value]... [--emit=ast|vt|summary] [--json]
//          [--diagnostics=text|json] [-o OUT]
//
// Exit status: 0 success, 1 the program has errors, 2 bad usage or an
// unreadable file, 3 an internal compiler error.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Artifact.h"
#include "vflow/Compiler/CppEmitter.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Evaluate.h"
#include "vflow/Compiler/Passes.h"
#include "vflow/Frontend/ASTPrinter.h"
#ifdef VFLOW_HAS_CUDA_JIT
#include "vflow/Runtime/cuda/Jit.h"
#endif

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <set>
#include <unistd.h>

using namespace vflow;
namespace cl = llvm::cl;

namespace {

/// Compiles `f`'s CUDA to PTX for one specialization (NVRTC, cached) and
/// keeps it in the artifact; null with a reason when it cannot.
const rt::GpuBinary *addPtx(rt::FlowArtifact &f, const std::string &arch,
                            int group, int headDim, const std::string &kv,
                            std::string &error) {
#ifndef VFLOW_HAS_CUDA_JIT
  error = "this vflowc was built without the CUDA toolkit (no NVRTC)";
  return nullptr;
#else
  try {
    rt::cuda::NvrtcOptions options;
    options.arch = arch;
    options.cubin = false;
    options.extra = rt::gpuSpecializationMacros(f.gpu, group, headDim, kv);
    rt::cuda::CudaBinary binary =
        rt::cuda::compileCuda(f.name, f.gpu.source, options);
    f.gpu.binaries.push_back(
        {binary.target, group, headDim, kv, std::move(binary.ptx)});
    return &f.gpu.binaries.back();
  } catch (const std::exception &e) {
    error = "flow '" + f.name + "': " + e.what();
    return nullptr;
  }
#endif
}

cl::OptionCategory category("vflowc options");

cl::SubCommand runCommand(
    "run", "Run flows on a seeded synthetic long-context workload and report "
           "the quality of their selections (mass recall, needle hits, output "
           "error against dense attention, next to a random selection of the "
           "same size)");

cl::list<std::string> inputFiles(cl::Positional, cl::desc("<file.vflow>..."),
                                 cl::ZeroOrMore, cl::cat(category),
                                 cl::sub(*cl::TopLevelSubCommand),
                                 cl::sub(runCommand));

cl::list<std::string>
    params("p",
           cl::desc("Override a param: -p budget=32, or -p quest.budget=32 "
                    "for one flow of a multi-flow file (repeatable)"),
           cl::value_desc("name=value"), cl::cat(category),
           cl::sub(*cl::TopLevelSubCommand), cl::sub(runCommand));

cl::opt<uint64_t> runSeed("seed", cl::desc("Workload seed"), cl::init(1),
                          cl::cat(category), cl::sub(runCommand));
cl::list<int64_t>
    runLengths("lengths",
               cl::desc("Prompt lengths, one sequence each (default "
                        "2053,4105,6147,8205)"),
               cl::CommaSeparated, cl::cat(category), cl::sub(runCommand));
cl::opt<int> runKVHeads("kv-heads", cl::desc("KV heads"), cl::init(4),
                        cl::cat(category), cl::sub(runCommand));
cl::opt<int> runGroup("group", cl::desc("Query heads per KV head"), cl::init(4),
                      cl::cat(category), cl::sub(runCommand));
cl::opt<int> runHeadDim("head-dim", cl::desc("Head dimension"), cl::init(128),
                        cl::cat(category), cl::sub(runCommand));
cl::opt<int> runSteps("steps", cl::desc("Decode steps"), cl::init(4),
                      cl::cat(category), cl::sub(runCommand));
cl::opt<double>
    runOutlier("outlier", cl::desc("Magnitude of the keys' 4 outlier channels"),
               cl::init(6.0), cl::cat(category), cl::sub(runCommand));
cl::opt<eval::WorkloadSpec::Backend> runBackend(
    "backend", cl::desc("What runs the flow (default: cpu)"),
    cl::init(eval::WorkloadSpec::Backend::Cpu),
    cl::values(clEnumValN(eval::WorkloadSpec::Backend::Cpu, "cpu",
                          "its generated C++, compiled by the host compiler "
                          "(cached)"),
               clEnumValN(eval::WorkloadSpec::Backend::Interpreter,
                          "interpreter", "the reference interpreter of vt IR")),
    cl::cat(category), cl::sub(runCommand));
cl::opt<int> runNeedles("needles", cl::desc("Planted needle spans per KV head"),
                        cl::init(4), cl::cat(category), cl::sub(runCommand));

enum class Emit { AST, VT, Kernels, Cpp, Cuda, Ptx, Artifact, Summary, None };
cl::opt<Emit> emit(
    "emit", cl::desc("What to print (default: vt)"), cl::init(Emit::VT),
    cl::values(
        clEnumValN(Emit::AST, "ast",
                   "the checked AST with the shape of every expression"),
        clEnumValN(Emit::VT, "vt", "verified vTensor (vt) dialect IR"),
        clEnumValN(Emit::Kernels, "kernels",
                   "vt IR after the pass pipeline: layouts, fused kernels "
                   "with launch plans and buffers"),
        clEnumValN(Emit::Cpp, "cpp",
                   "the generated C++ of the CPU backend (one translation "
                   "unit per flow)"),
        clEnumValN(Emit::Cuda, "cuda",
                   "the generated CUDA of the GPU backend (one source per "
                   "flow, specialized by macros at NVRTC time)"),
        clEnumValN(Emit::Ptx, "ptx",
                   "the PTX of the generated CUDA (NVRTC) for --arch, "
                   "--group, --head-dim and --kv-dtype"),
        clEnumValN(Emit::Artifact, "artifact",
                   "the versioned artifact the runtime loads (the default "
                   "when -o names a .vfa file)"),
        clEnumValN(Emit::Summary, "summary",
                   "per flow: params, fields, states, the selection and vt "
                   "op counts"),
        clEnumValN(Emit::None, "none", "nothing: check the program only")),
    cl::cat(category));

cl::opt<bool> json("json",
                   cl::desc("Print the summary (--emit=summary) or the run "
                            "report (vflowc run) as JSON"),
                   cl::cat(category), cl::sub(*cl::TopLevelSubCommand),
                   cl::sub(runCommand));

enum class DiagFormat { Text, JSON };
cl::opt<DiagFormat> diagnostics(
    "diagnostics", cl::desc("How errors are printed on stderr"),
    cl::init(DiagFormat::Text),
    cl::values(clEnumValN(DiagFormat::Text, "text",
                          "file:line:col, message, source line with a caret"),
               clEnumValN(DiagFormat::JSON, "json",
                          "one JSON object for all files: {\"ok\": bool, "
                          "\"files\": [{\"file\", \"errors\", \"warnings\", "
                          "\"diagnostics\": [...]}]}")),
    cl::cat(category), cl::sub(*cl::TopLevelSubCommand), cl::sub(runCommand));

cl::opt<bool> printPipeline(
    "print-pipeline",
    cl::desc("Print the pass pipeline that --emit=kernels runs, and exit"),
    cl::cat(category));

cl::opt<bool> printIRAfterAll(
    "print-ir-after-all",
    cl::desc("With --emit=kernels: print the IR after every pass on stderr"),
    cl::cat(category));

cl::opt<bool> printLocations(
    "print-locations",
    cl::desc("Print the source location (file:line:col) of every vt op"),
    cl::cat(category));

cl::opt<std::string>
    cudaArch("arch",
             cl::desc("With --emit=ptx, or -o FILE.vfa to embed PTX: the GPU "
                      "architecture (sm_80, sm_90, ...)"),
             cl::init("sm_90"), cl::cat(category));
cl::opt<int> cudaGroup("group",
                       cl::desc("With --emit=ptx or --arch: query heads per "
                                "KV head to specialize for (default 4)"),
                       cl::init(4), cl::cat(category));
cl::opt<int> cudaHeadDim("head-dim",
                         cl::desc("With --emit=ptx or --arch: the head "
                                  "dimension to specialize for (default 128)"),
                         cl::init(128), cl::cat(category));
cl::opt<std::string>
    cudaKV("kv-dtype",
           cl::desc("With --emit=ptx or --arch: the KV cache dtype (bf16, "
                    "f16, fp8_e4m3; default bf16)"),
           cl::init("bf16"), cl::cat(category));

cl::opt<std::string> outputFile("o", cl::desc("Write the output to a file"),
                                cl::value_desc("file"), cl::init("-"),
                                cl::cat(category),
                                cl::sub(*cl::TopLevelSubCommand),
                                cl::sub(runCommand));

enum class Color { Auto, Always, Never };
cl::opt<Color> color("diagnostics-color", cl::desc("Colored text diagnostics"),
                     cl::init(Color::Auto),
                     cl::values(clEnumValN(Color::Auto, "auto",
                                           "when stderr is a terminal"),
                                clEnumValN(Color::Always, "always", ""),
                                clEnumValN(Color::Never, "never", "")),
                     cl::cat(category), cl::sub(*cl::TopLevelSubCommand),
                     cl::sub(runCommand));

/// Runs the pass pipeline on a compiled module; pass failures are internal
/// errors (a checked program must always compile).
bool runPipeline(Compilation &c, mlir::MLIRContext &context) {
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
    llvm::errs() << c.buffer->getName()
                 << ": internal error: the pass pipeline failed\n";
    return false;
  }
  return true;
}

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  mlir::registerAsmPrinterCLOptions();
  mlir::registerMLIRContextCLOptions();
  cl::HideUnrelatedOptions(category);
  cl::HideUnrelatedOptions(category, runCommand);
  cl::AddExtraVersionPrinter([](llvm::raw_ostream &os) {
    os << "vflowc: the vflow compiler (vTensor dialect, MLIR 16)\n";
  });
  bool parsed = cl::ParseCommandLineOptions(
      argc, argv,
      "vflowc: compile .vflow sparse-attention programs\n\n"
      "  vflowc quest.vflow                      print verified vt IR\n"
      "  vflowc quest.vflow -p budget=32 --emit=summary\n"
      "  vflowc bad.vflow --diagnostics=json     errors for agents\n"
      "  vflowc run examples/quest.vflow         selection quality on a "
      "synthetic workload\n\n"
      "Exit status: 0 success, 1 the program has errors, 2 bad usage or an "
      "unreadable file, 3 internal compiler error.\n",
      &llvm::errs());
  if (!parsed)
    return 2;

  if (printPipeline) {
    llvm::outs() << describeCompilerPipeline() << "\n";
    return 0;
  }
  if (inputFiles.empty()) {
    llvm::errs() << "vflowc: error: no input files (see vflowc --help)\n";
    return 2;
  }

  SemaOptions semaOptions;
  std::vector<std::string> usageErrors;
  for (const std::string &p : params) {
    ParamOverride ov;
    if (!parseParamOverride(p, ov))
      usageErrors.push_back("-p " + p + ": expected name=value");
    else
      semaOptions.overrides.push_back(ov);
  }
  if (!usageErrors.empty()) {
    for (const std::string &e : usageErrors)
      llvm::errs() << "vflowc: error: " << e << "\n";
    return 2;
  }

  Emit mode = emit;
  if (emit.getNumOccurrences() == 0 && outputFile.size() > 4 &&
      outputFile.substr(outputFile.size() - 4) == ".vfa")
    mode = Emit::Artifact;
  if (mode == Emit::Artifact && runCommand) {
    llvm::errs() << "vflowc run: error: run does not write artifacts\n";
    return 2;
  }
  rt::Artifact artifactOut;
  artifactOut.compiler = compilerVersion();

  bool useColor =
      color == Color::Always || (color == Color::Auto && isatty(STDERR_FILENO));
  std::string errorText;
  auto output = mlir::openOutputFile(outputFile, &errorText);
  if (!output) {
    llvm::errs() << "vflowc: error: " << errorText << "\n";
    return 2;
  }

  mlir::MLIRContext context;
  registerCompilerDialects(context);
  context.disableMultithreading();

  eval::WorkloadSpec workload;
  if (runCommand) {
    workload.seed = runSeed;
    if (!runLengths.empty())
      workload.lengths.assign(runLengths.begin(), runLengths.end());
    workload.numKVHeads = runKVHeads;
    workload.group = runGroup;
    workload.headDim = runHeadDim;
    workload.steps = runSteps;
    workload.needles = runNeedles;
    workload.outlier = runOutlier;
    workload.backend = runBackend;
    std::string problem = workload.validate();
    if (!problem.empty()) {
      llvm::errs() << "vflowc run: error: " << problem << "\n";
      return 2;
    }
  }
  std::vector<eval::FlowReport> reports;
  // With several files, an override needs to match a param in one of them.
  std::set<std::string> usedOverrides;
  if (inputFiles.size() > 1) {
    semaOptions.reportUnusedOverrides = false;
    semaOptions.usedOverrides = &usedOverrides;
  }

  int status = 0;
  std::string jsonFiles, summaries;
  for (const std::string &path : inputFiles) {
    std::string text, readError;
    if (!readSourceFile(path, text, readError)) {
      if (diagnostics == DiagFormat::JSON) {
        jsonFiles += std::string(jsonFiles.empty() ? "" : ",") +
                     "{\"file\":\"" + jsonEscape(path) +
                     "\",\"errors\":1,\"warnings\":0,\"diagnostics\":[{"
                     "\"severity\":\"error\",\"line\":null,\"column\":null,"
                     "\"message\":\"" +
                     jsonEscape(readError) + "\",\"notes\":[]}]}";
      } else {
        llvm::errs() << "vflowc: error: " << readError << "\n";
      }
      status = std::max(status, 2);
      continue;
    }
    semaOptions.baseDir = directoryOf(path);
    Compilation c(std::make_unique<SourceBuffer>(path, std::move(text)));
    CompileStage until = runCommand || (mode != Emit::AST && mode != Emit::None)
                             ? CompileStage::VT
                             : CompileStage::Check;
    bool ok = false;
    runWithLargeStack(
        [&] { ok = compileSource(c, context, semaOptions, until); });

    if (diagnostics == DiagFormat::JSON)
      jsonFiles += (jsonFiles.empty() ? "" : ",") + c.diags.renderJSON();
    else
      llvm::errs() << c.diags.renderText(useColor);

    if (!ok) {
      bool internal = false;
      for (const Diagnostic &d : c.diags.getDiagnostics())
        internal |= d.message.rfind("internal error", 0) == 0;
      status = std::max(status, internal ? 3 : 1);
      continue;
    }
    if (runCommand) {
      for (auto flow : c.vt->getBody()->getOps<vt::FlowOp>()) {
        try {
          reports.push_back(eval::evaluateFlow(flow, workload));
        } catch (const std::exception &e) {
          llvm::errs() << path << ": error: flow '" << flow.getSymName()
                       << "' cannot run on this workload: " << e.what() << "\n";
          status = std::max(status, 1);
        }
      }
      continue;
    }
    switch (mode) {
    case Emit::Cpp:
    case Emit::Cuda:
    case Emit::Ptx:
    case Emit::Artifact: {
      rt::Artifact artifact;
      std::string error;
      if (!buildArtifact(c, artifact, error)) {
        llvm::errs() << path << ": internal error: " << error << "\n";
        status = std::max(status, 3);
        continue;
      }
      for (rt::FlowArtifact &f : artifact.flows) {
        if (mode == Emit::Cpp)
          for (const rt::ArtifactSource &src : f.sources)
            output->os() << "// ----- " << src.name << " (flow " << f.name
                         << ") -----\n"
                         << src.text << "\n";
        if (mode == Emit::Cuda)
          output->os() << "// ----- " << f.name << ".cu (flow " << f.name
                       << ") -----\n"
                       << f.gpu.source << "\n";
        if (mode == Emit::Ptx ||
            (mode == Emit::Artifact && cudaArch.getNumOccurrences())) {
          std::string ptxError;
          const rt::GpuBinary *ptx =
              addPtx(f, cudaArch, cudaGroup, cudaHeadDim, cudaKV, ptxError);
          if (!ptx) {
            llvm::errs() << path << ": error: " << ptxError << "\n";
            status = std::max(status, 1);
            continue;
          }
          if (mode == Emit::Ptx)
            output->os() << "// ----- " << f.name << " " << ptx->target
                         << " G=" << ptx->group << " D=" << ptx->headDim << " "
                         << ptx->kvDType << " -----\n"
                         << ptx->ptx << "\n";
        }
        artifactOut.flows.push_back(std::move(f));
      }
      break;
    }
    case Emit::AST:
      output->os() << printAST(*c.ast, *c.buffer);
      break;
    case Emit::Kernels:
    case Emit::VT: {
      if (mode == Emit::Kernels && !runPipeline(c, context)) {
        status = std::max(status, 3);
        continue;
      }
      mlir::OpPrintingFlags flags;
      if (printLocations)
        flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false)
            .useLocalScope();
      c.vt->print(output->os(), flags);
      output->os() << "\n";
      break;
    }
    case Emit::Summary:
      if (json)
        summaries += (summaries.empty() ? "" : ",") + summarizeJSON(c);
      else
        output->os() << summarizeText(c);
      break;
    case Emit::None:
      break;
    }
  }
  for (const ParamOverride &ov : semaOptions.overrides) {
    if (inputFiles.size() < 2 || usedOverrides.count(ov.name))
      continue;
    llvm::errs() << "vflowc: error: -p " << ov.name << "=" << ov.value
                 << ": no flow in any of the files has a param '" << ov.name
                 << "'\n";
    status = std::max(status, 1);
  }
  if (mode == Emit::Artifact && status == 0) {
    std::set<std::string> names;
    for (const rt::FlowArtifact &f : artifactOut.flows)
      if (!names.insert(f.name).second) {
        llvm::errs() << "vflowc: error: two files define flow '" << f.name
                     << "'; an artifact holds each flow once\n";
        return 1;
      }
    output->os() << rt::serializeArtifact(artifactOut);
  }
  if (runCommand && !reports.empty())
    output->os() << (json ? eval::formatReportJSON(reports, workload) + "\n"
                          : eval::formatReportText(reports, workload));
  if (mode == Emit::Summary && json && !runCommand)
    output->os() << "{\"programs\":[" << summaries << "]}\n";
  if (diagnostics == DiagFormat::JSON)
    llvm::errs() << "{\"ok\":" << (status == 0 ? "true" : "false")
                 << ",\"files\":[" << jsonFiles << "]}\n";
  output->keep();
  return status;
}
