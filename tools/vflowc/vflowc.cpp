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
#include "vflow/Runtime/Files.h"
#include "vflow/Runtime/Json.h"
#include "vflow/Runtime/Params.h"
#ifdef VFLOW_HAS_CUDA_JIT
#include "vflow/Runtime/cuda/Jit.h"
#endif

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <cerrno>
#include <cstdio>
#include <optional>
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
  std::optional<rt::DType> kvType = rt::parseDType(kv);
  if (!kvType || !rt::isGpuKVDType(*kvType)) {
    error =
        "--kv-dtype=" + kv + ": the GPU stores K/V as " + rt::gpuKVDTypeList();
    return nullptr;
  }
  try {
    return &rt::cuda::addPtx(f, arch, group, headDim, *kvType);
  } catch (const std::exception &e) {
    error = e.what();
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

cl::opt<std::string> loadBaseDir(
    "base-dir",
    cl::desc("Where load(\"...\") finds files named by relative paths "
             "(default: the program's directory)"),
    cl::value_desc("dir"), cl::cat(category), cl::sub(*cl::TopLevelSubCommand),
    cl::sub(runCommand));

cl::opt<std::string> runBaseline(
    "baseline",
    cl::desc("A flow every row is compared with: differences of its metrics "
             "seed by seed, with their paired standard errors (in a sweep, "
             "the baseline's row with the same params)"),
    cl::value_desc("flow"), cl::cat(category), cl::sub(runCommand));

cl::opt<uint64_t> runSeed("seed", cl::desc("First workload seed"), cl::init(1),
                          cl::cat(category), cl::sub(runCommand));
cl::opt<int> runSeeds("seeds",
                      cl::desc("Workloads (seeds) to average, with standard "
                               "errors (default 3)"),
                      cl::init(3), cl::cat(category), cl::sub(runCommand));
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
    "backend", cl::desc("Where the flow runs (default: cpu)"),
    cl::init(eval::WorkloadSpec::Backend::Cpu),
    cl::values(clEnumValN(eval::WorkloadSpec::Backend::Cpu, "cpu",
                          "its generated C++, compiled by the host compiler "
                          "(cached)"),
               clEnumValN(eval::WorkloadSpec::Backend::Cuda, "cuda",
                          "its CUDA kernels on the GPU")),
    cl::cat(category), cl::sub(runCommand));
cl::opt<double> runMaxMemory(
    "max-memory",
    cl::desc("Refuse a flow whose run would need more memory (GiB; "
             "default 4)"),
    cl::init(4.0), cl::cat(category), cl::sub(runCommand));
cl::opt<double> runMaxWork(
    "max-work",
    cl::desc("Refuse a flow whose run would do more work (billions of "
             "element operations; default 20)"),
    cl::init(20.0), cl::cat(category), cl::sub(runCommand));
cl::opt<double> runDistractors(
    "distractors",
    cl::desc("Share of the spans that are distractors: needle-strength keys "
             "with random signs, which per-channel bounds over-rate (default "
             "0.25)"),
    cl::init(0.25), cl::cat(category), cl::sub(runCommand));
cl::opt<double> runHeadSpread(
    "head-spread",
    cl::desc("How far the query heads of a group disagree (each needle is "
             "tuned to one of them; 0: they agree; default 0.5)"),
    cl::init(0.5), cl::cat(category), cl::sub(runCommand));
cl::opt<int> runNeedles("needles",
                        cl::desc("Planted needle spans per KV head (default "
                                 "8)"),
                        cl::init(eval::WorkloadSpec().needles),
                        cl::cat(category), cl::sub(runCommand));

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

cl::opt<std::string> explain(
    "explain",
    cl::desc("Explain a diagnostic code (E600) and how to fix it; 'all' "
             "lists every code, and exit"),
    cl::value_desc("code"), cl::cat(category));

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
                    "f16, fp8e4m3; default bf16)"),
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

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

/// Where vflowc's diagnostics go: the compiler's, per input file, and the
/// tool's own (usage, unreadable files, outputs). As text they are printed
/// on stderr as they happen; as JSON they make one document at the end, in
/// which the tool's own errors are a file entry with "file": null.
class Reporter {
public:
  Reporter(bool json, bool color) : json(json), color(color) {}

  void toolError(const std::string &message) {
    if (json)
      tool.error(DiagCode::Usage, SourceRange(), message);
    else
      llvm::errs() << "vflowc: error: " << message << "\n";
  }
  void toolNote(const std::string &message) {
    if (!json)
      llvm::errs() << "vflowc: note: " << message << "\n";
  }
  /// A file that could not be read: an entry of its own in JSON.
  void unreadable(const std::string &path, const std::string &why) {
    if (!json) {
      llvm::errs() << "vflowc: error: " << why << "\n";
      return;
    }
    files.push(unreadableFileJSON(path, why));
  }
  /// Everything one input file reported, once it is done.
  void file(const DiagnosticEngine &diags) {
    if (json)
      files.push(diags.toJSON());
    else
      llvm::errs() << diags.renderText(color);
  }
  /// Prints the JSON document (nothing for text).
  void finish(int status) {
    if (!json)
      return;
    if (tool.getNumErrors() || tool.getNumWarnings())
      files.push(tool.toJSON());
    rt::Json doc = rt::Json::object();
    doc.set("ok", status == 0);
    doc.set("files", std::move(files));
    llvm::errs() << doc.dump() << "\n";
  }

private:
  bool json, color;
  DiagnosticEngine tool{nullptr, 1000};
  rt::Json files = rt::Json::array();
};

/// The status a file's diagnostics call for: 3 for an internal error, 1 for
/// any other error.
int statusOf(const DiagnosticEngine &diags) {
  if (!diags.hasErrors())
    return 0;
  for (const Diagnostic &d : diags.getDiagnostics())
    if (d.message.rfind("internal error", 0) == 0)
      return 3;
  return 1;
}

/// Checks up front that `-o` can be written and names no input, so that a
/// long compile does not end in a write error or clobber a source.
bool checkOutput(const std::string &out, const std::vector<std::string> &inputs,
                 std::string &error) {
  if (out == "-")
    return true;
  for (const std::string &in : inputs)
    if (in == out || rt::sameFile(in, out)) {
      error = "-o " + out + " names the input file '" + in +
              "'; writing it would overwrite the program";
      return false;
    }
  std::string dir = directoryOf(out);
  if (::access(dir.empty() ? "/" : dir.c_str(), W_OK | X_OK) != 0) {
    error = "cannot open output file '" + out + "': " + rt::errnoText(errno) +
            " (directory '" + dir + "')";
    return false;
  }
  if (llvm::sys::fs::is_directory(out)) {
    error = "cannot open output file '" + out + "': it is a directory";
    return false;
  }
  return true;
}

/// Compiles one file and produces its output into `out`; every problem
/// goes into the file's diagnostics. Runs on the large-stack thread: the
/// emitters and the evaluator recurse over the IR.
void processFile(Compilation &c, mlir::MLIRContext &context,
                 const SemaOptions &semaOptions, Emit mode,
                 const eval::WorkloadSpec &workload, llvm::raw_ostream &out,
                 rt::Artifact &artifactOut,
                 std::vector<eval::FlowReport> &reports,
                 std::vector<eval::FlowFailure> &failures) {
  // Checking (--emit=none) lowers too: some limits are on the lowered IR.
  CompileStage until =
      runCommand || mode != Emit::AST ? CompileStage::VT : CompileStage::Check;
  if (!compileSource(c, context, semaOptions, until))
    return;
  if (runCommand) {
    std::vector<std::pair<std::string, std::string>> applied;
    for (const ParamOverride &ov : semaOptions.overrides)
      applied.push_back({ov.name, ov.value});
    eval::runFlows(c, workload, reports, failures, applied);
    return;
  }
  switch (mode) {
  case Emit::Cpp:
  case Emit::Cuda:
    emitCompilation(c, context,
                    mode == Emit::Cpp ? EmitStage::Cpp : EmitStage::Cuda, out);
    return;
  case Emit::Ptx:
  case Emit::Artifact: {
    rt::Artifact artifact;
    if (!buildArtifact(c, artifact))
      return;
    for (rt::FlowArtifact &f : artifact.flows) {
      if (mode == Emit::Ptx ||
          (mode == Emit::Artifact && cudaArch.getNumOccurrences())) {
        std::string ptxError;
        const rt::GpuBinary *ptx =
            addPtx(f, cudaArch, cudaGroup, cudaHeadDim, cudaKV, ptxError);
        if (!ptx) {
          c.diags.error(DiagCode::CannotRun, flowNameRange(c, f.name),
                        ptxError);
          continue;
        }
        if (mode == Emit::Ptx)
          out << "// ----- " << f.name << " " << ptx->target
              << " G=" << ptx->group << " D=" << ptx->headDim << " "
              << rt::dtypeName(ptx->kvDType) << " -----\n"
              << ptx->ptx << "\n";
      }
      artifactOut.flows.push_back(std::move(f));
    }
    return;
  }
  case Emit::AST:
  case Emit::VT:
  case Emit::Kernels:
    emitCompilation(c, context,
                    mode == Emit::AST  ? EmitStage::AST
                    : mode == Emit::VT ? EmitStage::VT
                                       : EmitStage::Kernels,
                    out, printLocations, printIRAfterAll);
    return;
  case Emit::Summary:
    out << (json ? summarizeJSON(c) : summarizeText(c));
    return;
  case Emit::None:
    return;
  }
}

/// True when argv asks for JSON diagnostics, read before the options are
/// parsed (so that an option error can be reported as JSON too).
bool wantsJSONDiagnostics(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef arg(argv[i]);
    if (arg == "--diagnostics=json" || arg == "-diagnostics=json")
      return true;
  }
  return false;
}

/// Parses the command line. With --diagnostics=json, option errors become
/// part of the JSON document: LLVM's option parser writes some of them
/// straight to stderr, so stderr is captured while it runs. The exit status
/// when the options are bad, nothing when they parsed.
std::optional<int> parseCommandLine(int argc, char **argv) {
  bool jsonDiagnostics = wantsJSONDiagnostics(argc, argv);
  std::FILE *captured = jsonDiagnostics ? std::tmpfile() : nullptr;
  int savedStderr = -1;
  if (captured) {
    llvm::errs().flush();
    savedStderr = ::dup(STDERR_FILENO);
    ::dup2(::fileno(captured), STDERR_FILENO);
  }
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
  std::string optionErrors;
  if (captured) {
    llvm::errs().flush();
    ::dup2(savedStderr, STDERR_FILENO);
    ::close(savedStderr);
    std::rewind(captured);
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), captured)) > 0)
      optionErrors.append(buffer, n);
    std::fclose(captured);
    if (parsed)
      llvm::errs() << optionErrors; // warnings, if any
  }
  if (parsed)
    return std::nullopt;
  if (!jsonDiagnostics)
    return 2;
  Reporter report(/*json=*/true, /*color=*/false);
  report.toolError(llvm::StringRef(optionErrors).trim().str());
  report.finish(2);
  return 2;
}

/// --print-pipeline and --explain, which print something and exit: their
/// exit status, nothing when neither was given.
std::optional<int> answerInfoOptions() {
  if (printPipeline) {
    llvm::outs() << describeCompilerPipeline() << "\n";
    return 0;
  }
  if (!explain.getNumOccurrences())
    return std::nullopt;
  auto show = [](DiagCode c) {
    llvm::outs() << diagCodeName(c) << ": " << diagCodeSummary(c)
                 << "\n  fix: " << diagCodeFix(c) << "\n";
  };
  if (explain == "all") {
    for (DiagCode c : allDiagCodes())
      show(c);
    return 0;
  }
  if (std::optional<DiagCode> c = diagCodeFromName(explain)) {
    show(*c);
    return 0;
  }
  llvm::errs() << "vflowc: error: --explain: no diagnostic has code '"
               << explain << "' (vflowc --explain=all lists them)\n";
  return 2;
}

/// The -p overrides into `semaOptions` (and, for vflowc run, the lists of
/// values into `sweeps`); false after reporting every bad one.
bool parseOverrides(Reporter &report, SemaOptions &semaOptions,
                    std::vector<eval::Sweep> &sweeps) {
  bool badOverride = false;
  for (const std::string &p : params) {
    // The NAME=VALUE syntax every -p shares (the vflow CLI's too): blanks
    // around the name and the value are ignored.
    ParamOverride ov;
    std::string name, value, why;
    if (!rt::splitParamSpec(p, name, value, why) ||
        !parseParamOverride(name + "=" + value, ov, why)) {
      report.toolError("-p " + p + ": " + why);
      badOverride = true;
      continue;
    }
    if (value.find(',') == std::string::npos) {
      semaOptions.overrides.push_back(ov);
      continue;
    }
    if (!runCommand) {
      report.toolError("-p " + p +
                       ": a list of values is a sweep, which "
                       "only vflowc run does; compile one value at a time");
      badOverride = true;
      continue;
    }
    eval::Sweep sweep{name, {}};
    llvm::SmallVector<llvm::StringRef> parts;
    llvm::StringRef(value).split(parts, ',');
    for (llvm::StringRef part : parts) {
      std::string one = part.trim().str();
      if (one.empty()) {
        report.toolError("-p " + p + ": an empty value in the list");
        badOverride = true;
        break;
      }
      sweep.values.push_back(one);
    }
    sweeps.push_back(std::move(sweep));
  }
  return !badOverride;
}

/// The workload of `vflowc run`, from its options (not yet validated).
eval::WorkloadSpec workloadFromOptions() {
  eval::WorkloadSpec workload;
  workload.seed = runSeed;
  workload.seeds = runSeeds;
  if (!runLengths.empty())
    workload.lengths.assign(runLengths.begin(), runLengths.end());
  workload.numKVHeads = runKVHeads;
  workload.group = runGroup;
  workload.headDim = runHeadDim;
  workload.steps = runSteps;
  workload.needles = runNeedles;
  workload.distractors = runDistractors;
  workload.headSpread = runHeadSpread;
  workload.outlier = runOutlier;
  workload.backend = runBackend;
  workload.maxMemoryGiB = runMaxMemory;
  workload.maxWork = runMaxWork;
  return workload;
}

/// What the input files produced, gathered into the one output.
struct Outputs {
  int status = 0;
  std::string text;
  rt::Artifact artifact;
  std::vector<eval::FlowReport> reports;
  std::vector<eval::FlowFailure> failures;
  rt::Json summaries = rt::Json::array();
};

/// Compiles every input file in turn (one MLIR context for all), reporting
/// each file's diagnostics as it is done, then the overrides that matched no
/// file.
void compileInputs(Reporter &report, SemaOptions semaOptions, Emit mode,
                   const eval::WorkloadSpec &workload, Outputs &o,
                   mlir::MLIRContext &context);

/// compileInputs at every point of the sweeps (vflowc run), one MLIR
/// context for all.
void compileSweep(Reporter &report, const SemaOptions &semaOptions, Emit mode,
                  const eval::WorkloadSpec &workload,
                  const std::vector<eval::Sweep> &sweeps, Outputs &o) {
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  context.disableMultithreading();
  for (const auto &point : eval::sweepPoints(sweeps)) {
    SemaOptions options = semaOptions;
    for (const auto &[name, value] : point)
      options.overrides.push_back({name, value});
    compileInputs(report, options, mode, workload, o, context);
  }
}

void compileInputs(Reporter &report, SemaOptions semaOptions, Emit mode,
                   const eval::WorkloadSpec &workload, Outputs &o,
                   mlir::MLIRContext &context) {

  // With several files, an override needs to match a param in one of them.
  std::set<std::string> usedOverrides;
  if (inputFiles.size() > 1) {
    semaOptions.reportUnusedOverrides = false;
    semaOptions.usedOverrides = &usedOverrides;
  }
  for (const std::string &path : inputFiles) {
    std::string text, readError;
    if (!readSourceFile(path, text, readError)) {
      report.unreadable(path, readError);
      o.failures.push_back({path, "", readError});
      o.status = std::max(o.status, 2);
      continue;
    }
    semaOptions.baseDir =
        loadBaseDir.empty() ? directoryOf(path) : std::string(loadBaseDir);
    Compilation c(std::make_unique<SourceBuffer>(path, std::move(text)));
    std::string fileText;
    llvm::raw_string_ostream fileOut(fileText);
    size_t failuresBefore = o.failures.size();
    runWithLargeStack([&] {
      processFile(c, context, semaOptions, mode, workload, fileOut, o.artifact,
                  o.reports, o.failures);
    });
    fileOut.flush();
    if (runCommand && c.diags.hasErrors() &&
        o.failures.size() == failuresBefore)
      o.failures.push_back({path, "", eval::errorsInBrief(c.diags)});
    report.file(c.diags);
    o.status = std::max(o.status, statusOf(c.diags));
    if (mode == Emit::Summary && json && !runCommand) {
      // summarizeJSON's text, read back to become one entry of the document.
      if (!fileText.empty())
        o.summaries.push(rt::Json::parse(fileText, path + " summary"));
    } else {
      o.text += fileText;
    }
  }
  for (const ParamOverride &ov : semaOptions.overrides) {
    if (inputFiles.size() < 2 || usedOverrides.count(ov.name))
      continue;
    report.toolError("-p " + ov.name + "=" + ov.value +
                     ": no flow in any of the files has a param '" + ov.name +
                     "'");
    o.status = std::max(o.status, 1);
  }
}

/// Appends what comes after every file's own output: the artifact (flow
/// names must not repeat across files), the run report, the summaries'
/// JSON document.
void finishOutput(Reporter &report, Emit mode,
                  const eval::WorkloadSpec &workload, Outputs &o) {
  if (mode == Emit::Artifact && o.status == 0) {
    std::set<std::string> names;
    for (const rt::FlowArtifact &f : o.artifact.flows)
      if (!names.insert(f.name).second) {
        report.toolError("two files define flow '" + f.name +
                         "'; an artifact holds each flow once");
        o.status = std::max(o.status, 1);
        break;
      }
    if (o.status == 0)
      o.text += rt::serializeArtifact(o.artifact);
  }
  if (runCommand && !runBaseline.empty() && !o.reports.empty()) {
    bool ran = false;
    for (const eval::FlowReport &r : o.reports)
      ran = ran || r.flow == runBaseline;
    if (!ran) {
      report.toolError("--baseline " + runBaseline + ": no flow '" +
                       runBaseline + "' ran (the flows that ran: " +
                       [&] {
                         std::string names;
                         for (const eval::FlowReport &r : o.reports)
                           if (names.find(r.flow) == std::string::npos)
                             names += (names.empty() ? "" : ", ") + r.flow;
                         return names;
                       }() +
                       ")");
      o.status = std::max(o.status, 1);
      // The JSON report says so too, as vflow.run's does.
      o.failures.push_back({inputFiles.front(), runBaseline,
                            "baseline: no flow '" + runBaseline + "' ran"});
    }
  }
  if (runCommand && (json || !o.reports.empty()))
    o.text += json ? eval::formatReportJSON(o.reports, o.failures, workload,
                                            runBaseline) +
                         "\n"
                   : eval::formatReportText(o.reports, workload, runBaseline);
  if (mode == Emit::Summary && json && !runCommand) {
    rt::Json doc = rt::Json::object();
    doc.set("programs", std::move(o.summaries));
    o.text += doc.dump() + "\n";
  }
}

/// Writes the output on stdout or into -o, and the diagnostics' JSON
/// document; the exit status.
int writeOutput(Reporter &report, Outputs &o) {
  // A file named by -o is replaced only by a complete output: after errors
  // it keeps what it held. A run report is written when at least one flow
  // ran (it lists the failures beside the results); a run that never
  // started (a compile error, a missing input) leaves the file alone.
  if (outputFile == "-") {
    llvm::outs() << o.text;
  } else if (o.status == 0 || (runCommand && !o.reports.empty())) {
    try {
      rt::writeFileAtomically(outputFile, o.text);
    } catch (const std::exception &e) {
      report.toolError(e.what());
      o.status = std::max(o.status, 2);
    }
  } else {
    report.toolNote("'" + outputFile +
                    "' was not written because of the errors above");
  }
  report.finish(o.status);
  return o.status;
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
  if (std::optional<int> exitStatus = parseCommandLine(argc, argv))
    return *exitStatus;
  if (std::optional<int> exitStatus = answerInfoOptions())
    return *exitStatus;

  bool useColor =
      color == Color::Always || (color == Color::Auto && isatty(STDERR_FILENO));
  Reporter report(diagnostics == DiagFormat::JSON, useColor);
  auto usageError = [&](const std::string &message) {
    report.toolError(message);
    report.finish(2);
    return 2;
  };
  if (inputFiles.empty())
    return usageError("no input files (see vflowc --help)");
  SemaOptions semaOptions;
  std::vector<eval::Sweep> sweeps;
  if (!parseOverrides(report, semaOptions, sweeps)) {
    report.finish(2);
    return 2;
  }

  Emit mode = emit;
  if (emit.getNumOccurrences() == 0 && outputFile.size() > 4 &&
      outputFile.substr(outputFile.size() - 4) == ".vfa")
    mode = Emit::Artifact;
  if (mode == Emit::Artifact && runCommand)
    return usageError("vflowc run does not write artifacts");
  std::string outputProblem;
  if (!checkOutput(outputFile, inputFiles, outputProblem))
    return usageError(outputProblem);
  eval::WorkloadSpec workload;
  if (runCommand) {
    workload = workloadFromOptions();
    std::string problem = workload.validate();
    if (!problem.empty())
      return usageError(problem);
  }

  Outputs outputs;
  outputs.artifact.compiler = compilerVersion();
  compileSweep(report, semaOptions, mode, workload, sweeps, outputs);
  finishOutput(report, mode, workload, outputs);
  return writeOutput(report, outputs);
}
