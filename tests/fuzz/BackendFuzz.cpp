//===- BackendFuzz.cpp - Random programs through everything behind the front end
//
//   vflow-fuzz-backend [--seconds S] [--seed N] [--iterations N]
//                      [--memory-gib G] [--program-seconds T] [--keep DIR]
//                      [--case N]
//
// The front-end fuzzer (FrontendFuzz.cpp) stops at verified vt IR. This one
// goes on: random well-typed programs (tests/random), some with a number
// replaced by one at or past a limit (axis sizes, element counts, block
// sizes, budgets), and random param overrides, each in a child process with
// a memory limit (RLIMIT_AS) and a time limit, through
//
//   the pass pipeline, the C++ and CUDA emitters, the artifact writer and
//   reader (parseArtifact), a CPU session on random K/V with random
//   run-time params, `vflowc run`'s evaluator on a small workload, and the
//   artifact reader again on metadata edited at random (which must be
//   refused, never run).
//
// An outcome is a pass when the child finishes, or stops with an
// rt::Error / std::runtime_error (a clear refusal). It fails when the child
// dies from a signal (a crash, the memory limit hit outside a checked
// allocation, std::bad_alloc, abort), runs past its time limit, or throws
// anything else. The first failing program is written to
// fuzz-backend-failure.vflow (with its params) for reproduction.
// Deterministic for a seed and iteration count; --seconds bounds the wall
// time.
//
//===----------------------------------------------------------------------===//

#include "../common/FuzzDriver.h"
#include "../common/Random.h"
#include "ProgramGenerator.h"

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Artifact.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Evaluate.h"
#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Session.h"

#include "mlir/IR/MLIRContext.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

using namespace vflow;

namespace {

/// Numbers at and past the limits, swapped in for a number of a program.
const char *const kExtremeNumbers[] = {"0",
                                       "1",
                                       "2",
                                       "3",
                                       "7",
                                       "1024",
                                       "2048",
                                       "4096",
                                       "65535",
                                       "65536",
                                       "65537",
                                       "1048576",
                                       "-1",
                                       "-2",
                                       "0.5",
                                       "2147483647",
                                       "2147483648",
                                       "1e9",
                                       "1e30",
                                       "9007199254740992",
                                       "9007199254740993"};

/// Values for run-time params set at run time.
const double kParamValues[] = {0,   1,   2,    3,     7,    64,  1e6,     -1,
                               -64, 0.5, 1e18, -1e18, 1e-9, NAN, INFINITY};

/// One random case: a program and what to do with it.
struct Case {
  testing::GeneratedProgram program;
  std::string note; ///< what was mutated
  uint64_t seed = 0;
};

Case makeCase(uint64_t seed) {
  std::mt19937_64 rng(seed);
  testing::GeneratorOptions options;
  options.seed = seed;
  options.allowLoad = false;
  const int64_t dims[] = {0, 0, 16, 64, 128};
  options.headDim = dims[rng() % 5];
  const int64_t blocks[] = {0, 0, 1, 2, 16, 32, 64, 256, 1024};
  options.blockSize = blocks[rng() % 9];
  options.maxLets = 2 + int(rng() % 8);
  Case c;
  c.seed = seed;
  c.program = testing::generateProgram(options);
  // Half of the programs: one number swapped for an extreme one.
  if (rng() % 2) {
    std::string &src = c.program.source;
    std::vector<size_t> numbers;
    for (size_t i = 1; i < src.size(); ++i)
      if (std::isdigit(static_cast<unsigned char>(src[i])) &&
          !std::isalnum(static_cast<unsigned char>(src[i - 1])) &&
          src[i - 1] != '_' && src[i - 1] != '.')
        numbers.push_back(i);
    if (!numbers.empty()) {
      size_t at = numbers[rng() % numbers.size()];
      size_t end = at;
      while (end < src.size() &&
             (std::isalnum(static_cast<unsigned char>(src[end])) ||
              src[end] == '.'))
        ++end;
      const char *number = kExtremeNumbers[rng() % std::size(kExtremeNumbers)];
      c.note = "replaced '" + src.substr(at, end - at) + "' at byte " +
               std::to_string(at) + " by " + number;
      src.replace(at, end - at, number);
    }
  }
  return c;
}

/// What a child does with one case. Throws on refusal.
void runCase(const Case &c, const std::string &workDir) {
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 7);
  const testing::GeneratedProgram &prog = c.program;
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  context.disableMultithreading();
  Compilation comp(
      std::make_unique<SourceBuffer>(prog.flowName + ".vflow", prog.source));
  SemaOptions sema;
  sema.baseDir = workDir;
  bool ok = false;
  runWithLargeStack(
      [&] { ok = compileSource(comp, context, sema, CompileStage::VT); });
  if (!ok)
    throw std::runtime_error("refused by the compiler: " +
                             comp.diags.renderText());
  vt::FlowOp flow = *comp.vt->getBody()->getOps<vt::FlowOp>().begin();
  // The artifact: written, read back, served.
  rt::Artifact artifact;
  std::string error;
  bool built = false;
  runWithLargeStack([&] { built = buildArtifact(comp, artifact, error); });
  if (!built)
    throw std::logic_error("internal error building the artifact: " + error);

  // vflowc run's evaluator on a small workload (the CPU session).
  eval::WorkloadSpec spec;
  spec.lengths = {int64_t(1 + rng() % 700), int64_t(1 + rng() % 300)};
  spec.numKVHeads = 1 + int(rng() % 2);
  spec.group = int(prog.group);
  spec.headDim = int(prog.headDim);
  spec.steps = 1 + int(rng() % 2);
  spec.maxMemoryGiB = 2;
  spec.maxWork = 2;
  try {
    runWithLargeStack(
        [&] { eval::evaluateFlow(flow, artifact.flows.at(0), spec); });
  } catch (const std::runtime_error &) {
    // a clear refusal; the artifact path still runs
  }

  std::string path = workDir + "/fuzz.vfa";
  rt::saveArtifact(artifact, path);
  rt::Artifact loaded = rt::loadArtifact(path);
  const rt::FlowArtifact &f = loaded.flows.at(0);

  // Metadata edited at random must be refused by the reader.
  {
    rt::FlowArtifact edited = f;
    std::vector<std::function<bool(rt::FlowArtifact &)>> edits = {
        [](rt::FlowArtifact &e) {
          if (e.fields.empty())
            return false;
          e.fields[0].axes.push_back({"zz", 3});
          return true;
        },
        [](rt::FlowArtifact &e) {
          if (e.states.empty())
            return false;
          e.states.pop_back();
          return true;
        },
        [](rt::FlowArtifact &e) {
          e.indexInputs.push_back("mass");
          return true;
        },
        [](rt::FlowArtifact &e) {
          e.params.push_back(e.params.front());
          e.params.erase(e.params.begin());
          return e.params.size() > 1;
        },
        [](rt::FlowArtifact &e) {
          e.blockSize *= 2;
          for (rt::ArtifactParam &p : e.params)
            if (p.name == "block_size")
              p.value *= 2;
          return true;
        },
    };
    if (edits[rng() % edits.size()](edited)) {
      rt::Artifact bad = loaded;
      bad.flows = {edited};
      bool refused = false;
      try {
        rt::parseArtifact(rt::serializeArtifact(bad), "edited.vfa");
      } catch (const rt::Error &) {
        refused = true;
      }
      if (!refused && rt::flowSignature(edited) != rt::flowSignature(f))
        throw std::logic_error("edited artifact metadata was accepted");
    }
  }

  rt::SessionConfig cfg;
  cfg.numKVHeads = 1 + int(rng() % 3);
  cfg.group = int(prog.group);
  cfg.headDim = int(prog.headDim);
  cfg.numLayers = 1 + int(rng() % 2);
  int64_t tokens = int64_t(rng() % 1500);
  cfg.numPages = tokens / std::max<int64_t>(1, f.blockSize) + 4;
  cfg.jit.quiet = true;
  rt::HostSession session(f, cfg);
  for (const rt::ArtifactParam &p : f.params)
    if (!p.compileTime && rng() % 3 == 0) {
      try {
        session.setParam(p.name, kParamValues[rng() % std::size(kParamValues)]);
      } catch (const rt::Error &) {
        // refused: the old value stays
      }
    }
  rt::SeqId seq = session.addSequence();
  const size_t width = size_t(cfg.numLayers) * cfg.numKVHeads * cfg.headDim;
  vflow::testing::NormalDraws normal(rng);
  std::vector<float> k(size_t(tokens + 2) * width), v(k.size());
  normal.fill(k, v);
  session.append(seq, tokens, k.data(), v.data());
  const size_t heads = size_t(cfg.numKVHeads) * cfg.group;
  std::vector<float> q(heads * cfg.headDim), out(q.size());
  for (int step = 0; step < 2; ++step) {
    session.append(seq, 1, k.data() + size_t(tokens) * width,
                   v.data() + size_t(tokens) * width);
    normal.fill(q);
    for (int layer = 0; layer < cfg.numLayers; ++layer)
      session.decode(layer, {seq}, q.data(), out.data());
  }
}

} // namespace

int main(int argc, char **argv) {
  testing::FuzzOptions opt;
  if (!testing::parseFuzzArgs(
          argc, argv, "--program-seconds",
          "vflow-fuzz-backend [--seconds S] [--seed N] [--iterations N] "
          "[--memory-gib G] [--program-seconds T] [--keep DIR] [--case N]",
          opt))
    return 2;
  testing::FuzzWorkDir work("vflow-fuzz-backend");
  if (!work.ok())
    return 2;
  const std::string &workDir = work.str();
  // A private JIT cache: the programs are new, and old entries must not hide
  // a failure.
  ::setenv("VFLOW_CACHE_DIR", (workDir + "/cache").c_str(), 1);
  if (opt.only) {
    Case c = makeCase(opt.only);
    std::printf("%s\n// %s\n", c.program.source.c_str(), c.note.c_str());
    try {
      runCase(c, workDir);
      std::printf("ran\n");
    } catch (const std::exception &e) {
      std::printf("%s: %s\n",
                  dynamic_cast<const std::runtime_error *>(&e) ||
                          dynamic_cast<const rt::Error *>(&e)
                      ? "refused"
                      : "UNEXPECTED",
                  e.what());
    }
    return 0;
  }
  Case c;
  return testing::runFuzzCases(
      opt, "vflow-fuzz-backend", "programs",
      [&](uint64_t seed) {
        c = makeCase(seed);
        return testing::runLimited([&] { runCase(c, workDir); }, opt.limits());
      },
      [&](uint64_t seed, const testing::ChildOutcome &outcome) {
        std::string file = opt.keepDir() + "/fuzz-backend-failure.vflow";
        std::ofstream out(file);
        out << "// vflow-fuzz-backend seed " << seed << ": " << outcome.message
            << "\n"
            << "// " << (c.note.empty() ? "no mutation" : c.note) << "\n"
            << "// head_dim " << c.program.headDim << ", group "
            << c.program.group << "\n"
            << c.program.source;
        std::fprintf(stderr,
                     "vflow-fuzz-backend: case %llu %s\n%s\n(written to %s)\n",
                     (unsigned long long)seed, outcome.message.c_str(),
                     c.program.source.c_str(), file.c_str());
      });
}
