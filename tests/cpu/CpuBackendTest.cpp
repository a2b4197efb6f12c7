//===- CpuBackendTest.cpp - Generated C++ against the interpreter ---------===//
//
// Every stock program and random well-typed programs are compiled through
// the pass pipeline, emitted as C++ (vflow::emitCpp), built by the host JIT
// and run next to the reference interpreter on random workloads: the fields
// of every block, the selection, the budget and the states after every step
// must agree (selections exactly, values within 1e-5 relative).
//
//===----------------------------------------------------------------------===//

#include "../common/StockPrograms.h"
#include "../compiler/Trace.h"
#include "ProgramGenerator.h"

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/CppEmitter.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Interpreter.h"
#include "vflow/Compiler/Passes.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/KernelABI.h"
#include "vflow/Runtime/NumericRules.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>
#include <unistd.h>

using namespace vflow;

namespace {

/// A JIT cache for this test run, or $VFLOW_CPU_TEST_CACHE (kept, so the
/// generated sources can be read there).
std::string cacheDir() {
  static const std::string dir = [] {
    if (const char *keep = std::getenv("VFLOW_CPU_TEST_CACHE"); keep && *keep)
      return std::string(keep);
    return ::testing::TempDir() + "vflow-cpu-jit-" +
           std::to_string(static_cast<long>(::getpid()));
  }();
  return dir;
}

/// Removes the JIT cache of this test run at exit.
class RemoveCache : public ::testing::Environment {
public:
  void TearDown() override {
    const char *keep = std::getenv("VFLOW_CPU_TEST_CACHE");
    std::error_code ec;
    if (!keep || !*keep)
      std::filesystem::remove_all(cacheDir(), ec);
  }
};
const auto *removeCache =
    ::testing::AddGlobalTestEnvironment(new RemoveCache());

rt::HostJitOptions jitOptions() {
  rt::HostJitOptions o;
  o.cacheDir = cacheDir();
  o.quiet = true;
  return o;
}

/// A program compiled to vt IR, optionally through the whole pipeline.
struct Compiled {
  mlir::MLIRContext context;
  std::unique_ptr<Compilation> compilation;
  std::string error;
  vt::FlowOp flow;
  /// The IR before the pipeline (the same as `flow` when not planned).
  mlir::OwningOpRef<mlir::ModuleOp> loweredModule;
  vt::FlowOp lowered;
};

std::unique_ptr<Compiled> compile(const std::string &name,
                                  const std::string &source,
                                  const std::string &baseDir, bool planned) {
  auto c = std::make_unique<Compiled>();
  registerCompilerDialects(c->context);
  c->compilation = std::make_unique<Compilation>(
      std::make_unique<SourceBuffer>(name, source));
  SemaOptions options;
  options.baseDir = baseDir;
  if (!compileSource(*c->compilation, c->context, options, CompileStage::VT)) {
    c->error = "does not compile: " + c->compilation->diags.renderText();
    return c;
  }
  c->loweredModule = c->compilation->vt->clone();
  c->lowered = *c->loweredModule->getBody()->getOps<vt::FlowOp>().begin();
  if (planned) {
    mlir::PassManager pm(&c->context);
    buildCompilerPipeline(pm);
    if (mlir::failed(pm.run(*c->compilation->vt))) {
      c->error = "the pipeline failed";
      return c;
    }
  }
  c->flow = *c->compilation->vt->getBody()->getOps<vt::FlowOp>().begin();
  return c;
}

std::string compareValues(const std::vector<float> &a,
                          const std::vector<float> &b,
                          const std::string &what) {
  if (a.size() != b.size())
    return what + ": " + std::to_string(a.size()) + " vs " +
           std::to_string(b.size()) + " values";
  for (size_t i = 0; i < a.size(); ++i) {
    float u = a[i], v = b[i];
    if ((std::isnan(u) && std::isnan(v)) || u == v)
      continue;
    double scale = std::max(std::fabs(u), std::fabs(v));
    if (!(std::fabs(u - v) <= 1e-5 * scale + 1e-30)) {
      std::ostringstream os;
      os << what << "[" << i << "]: interpreter " << u << ", cpu " << v;
      return os.str();
    }
  }
  return "";
}

std::string idsText(const std::vector<int64_t> &ids) {
  std::string out = "{";
  for (size_t i = 0; i < ids.size(); ++i)
    out += (i ? " " : "") + std::to_string(ids[i]);
  return out + "}";
}

struct Workload {
  int64_t headDim = 32, group = 4, numBlocks = 12;
  int steps = 3;
  unsigned seed = 1;
  /// Small integers instead of normals: exact ties in every score.
  bool ties = false;
  std::map<std::string, double> params;
};

/// Runs the interpreter and the CPU flow on one workload; "" when they
/// agree, else the first difference.
/// `lowered` gives the interpreter's budget: its budget() does not look
/// into vt.kernel groups.
std::string runBoth(vt::FlowOp flow, vt::FlowOp lowered, rt::CpuFlow &cpu,
                    const Workload &w) {
  std::string error;
  auto fi = interp::FlowInterpreter::create(flow, w.headDim, w.group, w.params,
                                            error);
  if (!fi)
    return "interpreter: " + error;
  auto budgetRef = interp::FlowInterpreter::create(lowered, w.headDim, w.group,
                                                   w.params, error);
  if (!budgetRef)
    return "interpreter: " + error;
  // Run-time params start at their defaults (an earlier workload may have
  // changed them).
  for (const rt::ParamSpec &p : cpu.info().params)
    if (!p.compileTime)
      cpu.setParam(p.name, p.value);
  for (const auto &p : w.params)
    cpu.setParam(p.first, p.second);
  std::mt19937 rng(w.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-2, 2);
  auto draw = [&] { return w.ties ? float(small(rng)) : normal(rng); };
  int64_t p = fi->blockSize(), d = w.headDim, g = w.group;
  if (cpu.blockSize() != p)
    return "block sizes differ";
  const rt::CpuFlowInfo &info = cpu.info();
  int64_t total = w.numBlocks + w.steps;
  std::vector<std::vector<float>> ks, vs;
  std::vector<std::vector<std::vector<float>>> cpuFields;
  std::vector<std::map<std::string, interp::Tensor>> refFields;
  try {
    for (int64_t b = 0; b < total; ++b) {
      interp::Tensor k({"token", "dim"}, {p, d}), v({"token", "dim"}, {p, d});
      for (float &x : k.data)
        x = draw();
      for (float &x : v.data)
        x = draw();
      refFields.push_back(fi->runCacheStage(k, v));
      cpuFields.emplace_back();
      cpu.runCacheStage(k.data.data(), v.data.data(), cpuFields.back());
      for (size_t f = 0; f < info.fields.size(); ++f) {
        std::string diff = compareValues(
            refFields[b].at(info.fields[f].name).data, cpuFields[b][f],
            "field " + info.fields[f].name + " of block " + std::to_string(b));
        if (!diff.empty())
          return diff;
      }
      ks.push_back(std::move(k.data));
      vs.push_back(std::move(v.data));
    }
    interp::StateValues refStates = fi->initialStates(w.numBlocks);
    rt::CpuStates cpuStates = cpu.initialStates(w.numBlocks);
    for (int step = 0; step < w.steps; ++step) {
      int64_t n = w.numBlocks + step;
      fi->growStates(refStates, n);
      interp::IndexInputs in;
      in.q = interp::Tensor({"head", "dim"}, {g, d});
      for (float &x : in.q.data)
        x = draw();
      in.mass = interp::Tensor({"block", "head"}, {n, g});
      for (float &x : in.mass.data)
        x = w.ties ? float(small(rng) + 2) / 4 : unit(rng);
      in.K = interp::Tensor({"block", "token", "dim"}, {n, p, d});
      in.V = in.K;
      for (int64_t b = 0; b < n; ++b) {
        std::copy(ks[b].begin(), ks[b].end(), in.K.data.begin() + b * p * d);
        std::copy(vs[b].begin(), vs[b].end(), in.V.data.begin() + b * p * d);
      }
      std::vector<std::vector<float>> stacked(info.fields.size());
      rt::CpuIndexInputs cin;
      for (size_t f = 0; f < info.fields.size(); ++f) {
        const std::string &name = info.fields[f].name;
        interp::Tensor t = trace::stackBlocks(refFields, name, n);
        for (int64_t b = 0; b < n; ++b)
          stacked[f].insert(stacked[f].end(), cpuFields[b][f].begin(),
                            cpuFields[b][f].end());
        if (n == 0) {
          t.names = {"block"};
          t.sizes = {0};
        }
        in.fields[name] = std::move(t);
        cin.fields.push_back(stacked[f].data());
      }
      in.numBlocks = n;
      in.contextLen = n * p + (step * 7) % p;
      in.step = step;
      // The model's layer and KV head this step runs for (inside the
      // scope runChecks gives the CPU flow).
      in.layer = (step * 5 + 2) % 11;
      in.kvHead = (step * 3 + 1) % 5;
      cin.q = in.q.data.data();
      cin.mass = in.mass.data.data();
      cin.K = in.K.data.data();
      cin.V = in.V.data.data();
      cin.numBlocks = n;
      cin.contextLen = in.contextLen;
      cin.step = step;
      cin.layer = in.layer;
      cin.kvHead = in.kvHead;
      std::vector<float> refRetain, cpuRetain(size_t(n), 0.0f);
      interp::Selection refSelection =
          fi->runIndexStage(in, refStates, &refRetain);
      const std::vector<int64_t> &ref = refSelection.blocks;
      std::vector<int64_t> got =
          cpu.runIndexStage(cin, cpuStates, cpuRetain.data());
      std::string at = " at step " + std::to_string(step) + " (" +
                       std::to_string(n) + " blocks)";
      if (ref != got)
        return "selections differ" + at + ": interpreter " + idsText(ref) +
               ", cpu " + idsText(got);
      if (fi->finalBlocks(refSelection, n) != cpu.finalBlocks(got, n))
        return "final blocks differ" + at;
      // A retain block's score, value for value.
      if (!refRetain.empty() || cpu.retains()) {
        std::string diff =
            compareValues(refRetain, cpuRetain, "retain score" + at);
        if (!diff.empty())
          return diff;
      }
      int64_t rb = budgetRef->budget(n, in.contextLen, in.layer, in.kvHead);
      int64_t cb = cpu.flowParams().budgetAt(
          {n, in.contextLen, w.group, in.layer, in.kvHead});
      if (rb != cb)
        return "budgets differ" + at + ": interpreter " + std::to_string(rb) +
               ", cpu " + std::to_string(cb);
      for (size_t s = 0; s < info.states.size(); ++s) {
        std::string diff =
            compareValues(refStates.at(info.states[s].name).data, cpuStates[s],
                          "state " + info.states[s].name + at);
        if (!diff.empty())
          return diff;
      }
    }
  } catch (const std::exception &e) {
    return std::string("exception: ") + e.what();
  }
  return "";
}

/// Emits, builds and checks one program on several workloads.
/// `given` replaces the emitted source (it must define the flow's entry
/// points) and `options` the JIT options.
std::string checkProgram(vt::FlowOp flow, vt::FlowOp lowered,
                         const std::vector<Workload> &loads,
                         const std::string &given = "",
                         rt::HostJitOptions options = jitOptions()) {
  std::string error;
  std::string source = given.empty() ? emitCpp(flow, error) : given;
  if (source.empty())
    return "emitCpp: " + error;
  rt::CpuFlowInfo info;
  if (!describeCpuFlow(flow, info, error))
    return "describeCpuFlow: " + error;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<rt::CpuFlow>> flows;
  for (const Workload &w : loads) {
    auto &cpu = flows[{w.headDim, w.group}];
    try {
      if (!cpu) {
        cpu = std::make_unique<rt::CpuFlow>(source, info, w.headDim, w.group,
                                            options);
        cpu->setBudgetScope(0, 11, 0, 5);
      }
    } catch (const rt::Error &e) {
      return std::string("CpuFlow: ") + e.what() + "\n" + source;
    }
    std::string diff = runBoth(flow, lowered, *cpu, w);
    if (!diff.empty())
      return "seed " + std::to_string(w.seed) + ", D " +
             std::to_string(w.headDim) + ", G " + std::to_string(w.group) +
             ": " + diff;
  }
  return "";
}

std::string readExample(const std::string &name) {
  std::string text, error;
  std::string path = std::string(VFLOW_EXAMPLES_DIR) + "/" + name + ".vflow";
  if (!readSourceFile(path, text, error))
    ADD_FAILURE() << error;
  return text;
}

class StockProgram : public ::testing::TestWithParam<const char *> {};

/// Ten workloads per program: head dims, groups, sizes around the budget.
std::vector<Workload> stockWorkloads(const std::string &name) {
  static const int64_t blocks[] = {1, 2, 5, 40, 70, 9, 3, 100, 66, 20};
  static const int64_t groups[] = {1, 4, 5};
  std::vector<Workload> loads;
  for (unsigned i = 0; i < 10; ++i) {
    Workload w;
    w.seed = 100 + i * 7 + static_cast<unsigned>(name.size());
    w.headDim = name == "double_sparse" ? 128 : (i % 2 ? 64 : 32);
    w.group = groups[i % 3];
    w.numBlocks = blocks[i];
    w.steps = i % 4 == 3 ? 3 : 2;
    w.ties = i % 3 == 2;
    if (i == 5)
      w.params = {{name == "sliding_window"  ? "window"
                   : name == "above_mean"    ? "max_blocks"
                   : name == "streaming_llm" ? "keep_last"
                                             : "budget",
                   3}};
    loads.push_back(w);
  }
  return loads;
}

} // namespace

TEST_P(StockProgram, MatchesTheInterpreter) {
  std::string name = GetParam();
  auto c = compile(name + ".vflow", readExample(name), VFLOW_EXAMPLES_DIR,
                   /*planned=*/true);
  ASSERT_EQ(c->error, "");
  EXPECT_EQ(checkProgram(c->flow, c->lowered, stockWorkloads(name)), "");
}

INSTANTIATE_TEST_SUITE_P(Examples, StockProgram,
                         ::testing::ValuesIn(vflow::testing::kStockPrograms));

TEST(CpuBackend, UnplannedIR) {
  // The lowered IR (no vt.kernel groups) emits and runs the same.
  for (const char *name : {"eps", "h2o"}) {
    auto c = compile(std::string(name) + ".vflow", readExample(name),
                     VFLOW_EXAMPLES_DIR, /*planned=*/false);
    ASSERT_EQ(c->error, "");
    std::vector<Workload> loads = stockWorkloads(name);
    loads.resize(3);
    EXPECT_EQ(checkProgram(c->flow, c->lowered, loads), "") << name;
  }
}

TEST(CpuBackend, WideSumsFollowTheLaneOrder) {
  // A sum over `dim` (wide) accumulates in f32 lanes in NumericRules'
  // order, the same in the interpreter and the generated code. The terms
  // 2^24, then 63 ones: lane 0 holds 2^24 + 1 (rounds to 2^24), lanes
  // 1..31 hold 2 each, and the pairwise combine adds 2, 4, 8, 16, 32:
  // 2^24 + 62. (f64 gives 2^24 + 63, which rounds to 2^24 + 64; a
  // sequential f32 sum stays at 2^24.)
  const char *source = "flow lanes {\n"
                       "  param budget = 1;\n"
                       "  state s[block]: f32 = 0;\n"
                       "  cache c = mean(K, token);\n"
                       "  index {\n"
                       "    s = sum(sum(q * c, dim), head);\n"
                       "    return topk(s, budget);\n"
                       "  }\n"
                       "}\n";
  for (bool planned : {true, false}) {
    auto c = compile("lanes.vflow", source, ".", planned);
    ASSERT_EQ(c->error, "");
    std::string error;
    std::string cpp = emitCpp(c->flow, error);
    ASSERT_FALSE(cpp.empty()) << error;
    rt::CpuFlowInfo info;
    ASSERT_TRUE(describeCpuFlow(c->flow, info, error)) << error;
    const int64_t d = 64, g = 1;
    rt::CpuFlow cpu(cpp, info, d, g, jitOptions());
    auto fi = interp::FlowInterpreter::create(c->flow, d, g, {}, error);
    ASSERT_TRUE(fi) << error;
    const int64_t p = fi->blockSize();
    interp::Tensor k({"token", "dim"}, {p, d});
    std::fill(k.data.begin(), k.data.end(), 1.0f);
    std::map<std::string, interp::Tensor> refFields = fi->runCacheStage(k, k);
    std::vector<std::vector<float>> cpuFields;
    cpu.runCacheStage(k.data.data(), k.data.data(), cpuFields);
    interp::IndexInputs in;
    in.q = interp::Tensor({"head", "dim"}, {g, d});
    std::fill(in.q.data.begin(), in.q.data.end(), 1.0f);
    in.q.data[0] = 16777216.0f;
    in.mass = interp::Tensor({"block", "head"}, {1, g});
    in.K = interp::Tensor({"block", "token", "dim"}, {1, p, d});
    in.K.data = k.data;
    in.V = in.K;
    in.numBlocks = 1;
    in.contextLen = p;
    for (auto &entry : refFields) {
      interp::Tensor t = entry.second;
      t.names.insert(t.names.begin(), "block");
      t.sizes.insert(t.sizes.begin(), 1);
      in.fields[entry.first] = std::move(t);
    }
    rt::CpuIndexInputs cin;
    for (std::vector<float> &f : cpuFields)
      cin.fields.push_back(f.data());
    cin.q = in.q.data.data();
    cin.mass = in.mass.data.data();
    cin.K = in.K.data.data();
    cin.V = in.V.data.data();
    cin.numBlocks = 1;
    cin.contextLen = p;
    interp::StateValues refStates = fi->initialStates(1);
    rt::CpuStates cpuStates = cpu.initialStates(1);
    fi->runIndexStage(in, refStates);
    cpu.runIndexStage(cin, cpuStates);
    EXPECT_EQ(refStates.at("s").data[0], 16777278.0f) << planned;
    EXPECT_EQ(cpuStates[0][0], 16777278.0f) << planned;
  }
}

TEST(CpuBackend, FirstTokenIsTheRuntimesOrBlockTimesBlockSize) {
  // first_token: what the runtime passes (a sequence that evicted), else
  // block * block_size; the interpreter and the CPU code agree on both.
  std::string source = "flow f {\n"
                       "  param budget = 1;\n"
                       "  index { return topk(first_token, budget); }\n"
                       "  retain(2) { return first_token; }\n"
                       "}\n";
  auto c = compile("first.vflow", source, ".", true);
  ASSERT_EQ(c->error, "");
  std::string error;
  std::string cpp = emitCpp(c->flow, error);
  ASSERT_FALSE(cpp.empty()) << error;
  rt::CpuFlowInfo info;
  ASSERT_TRUE(describeCpuFlow(c->flow, info, error)) << error;
  rt::CpuFlow cpu(cpp, info, 4, 1, jitOptions());
  auto fi = interp::FlowInterpreter::create(c->flow, 4, 1, {}, error);
  ASSERT_TRUE(fi) << error;
  const int64_t n = 5, p = fi->blockSize();
  for (bool given : {false, true}) {
    std::vector<float> first = {0, 3 * float(p), 3 * float(p) + 5, 9 * float(p),
                                9 * float(p) + 2};
    interp::IndexInputs in;
    in.q = interp::Tensor({"head", "dim"}, {1, 4});
    in.numBlocks = n;
    in.contextLen = n * p;
    rt::CpuIndexInputs cin;
    cin.q = in.q.data.data();
    cin.numBlocks = n;
    cin.contextLen = n * p;
    if (given) {
      in.firstToken = first;
      cin.firstToken = first.data();
    }
    interp::StateValues refStates = fi->initialStates(n);
    rt::CpuStates cpuStates = cpu.initialStates(n);
    std::vector<float> refScore, cpuScore(static_cast<size_t>(n));
    fi->runIndexStage(in, refStates, &refScore);
    cpu.runIndexStage(cin, cpuStates, cpuScore.data());
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j)
      want[size_t(j)] = given ? first[size_t(j)] : float(j * p);
    EXPECT_EQ(refScore, want) << given;
    EXPECT_EQ(cpuScore, want) << given;
  }
}

TEST(CpuBackend, EveryBuiltin) {
  std::string path =
      std::string(VFLOW_LIT_DIR) + "/frontend/every-builtin.vflow";
  std::string text, error;
  ASSERT_TRUE(readSourceFile(path, text, error)) << error;
  for (bool planned : {true, false}) {
    auto c = compile(path, text, ".", planned);
    ASSERT_EQ(c->error, "");
    std::vector<Workload> loads;
    for (unsigned i = 0; i < 4; ++i) {
      Workload w;
      w.headDim = 4;
      w.group = 1 + i;
      w.numBlocks = std::vector<int64_t>{1, 2, 9, 30}[i];
      w.seed = 7 + i;
      w.ties = i == 2;
      loads.push_back(w);
    }
    EXPECT_EQ(checkProgram(c->flow, c->lowered, loads), "")
        << "planned " << planned;
  }
}

TEST(CpuBackend, RandomWellTypedPrograms) {
  // Forty random programs; their sources are concatenated into two
  // translation units (flow names differ) built at -O0, which saves compile
  // time and checks that generated sources compose. The stock programs run
  // at the default -O2.
  std::string dir = ::testing::TempDir();
  struct Program {
    vflow::testing::GeneratedProgram generated;
    std::unique_ptr<Compiled> compiled;
    std::string source;
  };
  std::vector<Program> programs;
  // VFLOW_CPU_RANDOM_SEEDS=N and VFLOW_CPU_RANDOM_FIRST=S run a longer
  // search (seeds S .. S+N-1).
  auto seeds = vflow::testing::seedRangeFromEnv("VFLOW_CPU_RANDOM", 40);
  for (uint64_t seed = seeds.first; seed < seeds.first + seeds.count; ++seed) {
    vflow::testing::GeneratorOptions options;
    options.seed = seed;
    Program p;
    p.generated = vflow::testing::generateProgram(options);
    vflow::testing::writeProgramFiles(p.generated, dir);
    p.compiled = compile("random-" + std::to_string(seed) + ".vflow",
                         p.generated.source, dir, /*planned=*/true);
    ASSERT_EQ(p.compiled->error, "") << p.generated.source;
    std::string error;
    p.source = emitCpp(p.compiled->flow, error);
    ASSERT_NE(p.source, "") << error << "\n" << p.generated.source;
    programs.push_back(std::move(p));
  }
  std::string batch[2];
  for (size_t i = 0; i < programs.size(); ++i)
    batch[i % 2] += programs[i].source;
  for (size_t i = 0; i < programs.size(); ++i) {
    const Program &p = programs[i];
    std::vector<Workload> loads;
    for (unsigned j = 0; j < 3; ++j) {
      Workload w;
      w.headDim = p.generated.headDim;
      w.group = p.generated.group;
      w.numBlocks = std::vector<int64_t>{1, 6, 17}[j];
      w.seed = static_cast<unsigned>(i * 10 + j);
      w.ties = j == 1;
      if (j == 2)
        w.params = p.generated.runtimeParams;
      loads.push_back(w);
    }
    rt::HostJitOptions options = jitOptions();
    options.flags = {"-O0"};
    options.label = "random-batch-" + std::to_string(i % 2);
    EXPECT_EQ(checkProgram(p.compiled->flow, p.compiled->lowered, loads,
                           batch[i % 2], options),
              "")
        << p.generated.source;
  }
}

TEST(CpuBackend, SourceShape) {
  auto c = compile("quest.vflow", readExample("quest"), VFLOW_EXAMPLES_DIR,
                   /*planned=*/true);
  ASSERT_EQ(c->error, "");
  std::string error;
  std::string source = emitCpp(c->flow, error);
  ASSERT_NE(source, "") << error;
  for (const char *needle :
       {"#include \"vflow/Runtime/KernelABI.h\"",
        "#include \"vflow/Runtime/Random.h\"",
        "extern \"C\" void vflow_quest_consts(const VflowConstArgs *args)",
        "extern \"C\" void vflow_quest_cache(const VflowCacheArgs *args)",
        "extern \"C\" void vflow_quest_index(const VflowIndexArgs *args)",
        "// vt.kernel select", "vt.reduce max", "vk::selectTopK("})
    EXPECT_NE(source.find(needle), std::string::npos) << needle;
  EXPECT_EQ(source.find("#include <"), std::string::npos);
}

TEST(CpuBackend, RejectsWrongParamsAndSizes) {
  auto c = compile("eps.vflow", readExample("eps"), VFLOW_EXAMPLES_DIR,
                   /*planned=*/true);
  ASSERT_EQ(c->error, "");
  std::string error;
  std::string source = emitCpp(c->flow, error);
  rt::CpuFlowInfo info;
  ASSERT_TRUE(describeCpuFlow(c->flow, info, error)) << error;
  rt::CpuFlow cpu(source, info, 32, 2, jitOptions());
  cpu.setParam("budget", 4);
  EXPECT_EQ(cpu.param("budget"), 4);
  try {
    cpu.setParam("sketch", 16);
    FAIL() << "a compile-time param changed";
  } catch (const rt::Error &e) {
    EXPECT_NE(std::string(e.what()).find("compile-time"), std::string::npos);
  }
  EXPECT_THROW(cpu.setParam("nope", 1), rt::Error);

  auto ds = compile("double_sparse.vflow", readExample("double_sparse"),
                    VFLOW_EXAMPLES_DIR, /*planned=*/true);
  ASSERT_EQ(ds->error, "");
  rt::CpuFlowInfo dsInfo;
  ASSERT_TRUE(describeCpuFlow(ds->flow, dsInfo, error));
  try {
    rt::CpuFlow bad(emitCpp(ds->flow, error), dsInfo, 64, 1, jitOptions());
    FAIL() << "head_dim 128 ran with 64";
  } catch (const rt::Error &e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 128"), std::string::npos);
  }
}

//===----------------------------------------------------------------------===//
// The numeric rules (NumericRules.h) against known values
//===----------------------------------------------------------------------===//
//
// The interpreter, the generated C++ (vflow::kabi) and the generated CUDA
// (vd::) compile these very functions, so the tests above compare how the
// backends use them; these check the rules themselves.

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

uint32_t bitsOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

} // namespace

TEST(NumericRules, TheGeneratedCodeCallsTheRules) {
  // kabi's names are the rules themselves, not copies.
  EXPECT_EQ(&kabi::add, &rules::add);
  EXPECT_EQ(&kabi::maximum, &rules::maximum);
  EXPECT_EQ(&kabi::clamp, &rules::clamp);
  EXPECT_EQ(&kabi::sigmoid, &rules::sigmoid);
  EXPECT_EQ(&kabi::accMax, &rules::accMax);
  EXPECT_EQ(&kabi::finishMean, &rules::finishMean);
  EXPECT_EQ(&kabi::roundBF16, &rules::roundBF16);
  EXPECT_EQ(&kabi::roundFP8E4M3, &rules::roundFP8E4M3);
  EXPECT_EQ(&kabi::softmaxLine, &rules::softmaxLine);
  EXPECT_EQ(&kabi::ranksBefore, &rules::ranksBefore);
  EXPECT_TRUE((std::is_same_v<kabi::Kept, rules::KeptBlocks>));
  // The compile-time constants are the rules' values.
  EXPECT_EQ(bitsOf(kabi::kNaN), rules::kQuietNaNBits);
  EXPECT_EQ(bitsOf(rules::quietNaN()), rules::kQuietNaNBits);
  EXPECT_EQ(kabi::kInf, rules::infinity());
  EXPECT_EQ(kabi::kSumInit, rules::sumInit());
  EXPECT_EQ(kabi::kMaxInit, rules::maxInit());
  EXPECT_EQ(kabi::kMinInit, rules::minInit());
}

TEST(NumericRules, ElementFunctions) {
  // maximum and minimum propagate NaN from either side and order -0 below
  // +0 (IEEE 754-2019), whatever the order of the operands.
  for (float x : {1.0f, -kInf, kNaN}) {
    EXPECT_TRUE(std::isnan(rules::maximum(kNaN, x)));
    EXPECT_TRUE(std::isnan(rules::maximum(x, kNaN)));
    EXPECT_TRUE(std::isnan(rules::minimum(kNaN, x)));
    EXPECT_TRUE(std::isnan(rules::minimum(x, kNaN)));
  }
  EXPECT_EQ(bitsOf(rules::maximum(kNaN, 1.0f)), rules::kQuietNaNBits);
  EXPECT_EQ(rules::maximum(2.0f, -3.0f), 2.0f);
  EXPECT_EQ(rules::minimum(2.0f, -3.0f), -3.0f);
  for (auto [a, b] : {std::pair{-0.0f, 0.0f}, std::pair{0.0f, -0.0f}}) {
    EXPECT_EQ(bitsOf(rules::maximum(a, b)), bitsOf(0.0f));
    EXPECT_EQ(bitsOf(rules::minimum(a, b)), bitsOf(-0.0f));
    EXPECT_EQ(bitsOf(float(rules::mergeMax(a, b))), bitsOf(0.0f));
    EXPECT_EQ(bitsOf(float(rules::mergeMin(a, b))), bitsOf(-0.0f));
  }
  EXPECT_EQ(bitsOf(rules::maximum(-0.0f, -0.0f)), bitsOf(-0.0f));
  EXPECT_EQ(bitsOf(rules::minimum(0.0f, 0.0f)), bitsOf(0.0f));
  EXPECT_EQ(rules::maximum(-kInf, -0.0f), -0.0f);
  EXPECT_EQ(rules::minimum(kInf, 5.0f), 5.0f);
  // Comparisons are IEEE's: false against NaN, except !=.
  EXPECT_EQ(rules::cmpLt(kNaN, 1.0f) + rules::cmpLe(kNaN, 1.0f) +
                rules::cmpGt(kNaN, 1.0f) + rules::cmpGe(kNaN, 1.0f) +
                rules::cmpEq(kNaN, kNaN),
            0.0f);
  EXPECT_EQ(rules::cmpNe(kNaN, kNaN), 1.0f);
  EXPECT_EQ(rules::cmpEq(-0.0f, 0.0f), 1.0f);
  EXPECT_EQ(rules::cmpLe(2.0f, 2.0f), 1.0f);
  // Logical ops read nonzero (NaN included) as true.
  EXPECT_EQ(rules::logicalAnd(kNaN, -2.0f), 1.0f);
  EXPECT_EQ(rules::logicalAnd(0.0f, 1.0f), 0.0f);
  EXPECT_EQ(rules::logicalOr(-0.0f, 0.0f), 0.0f);
  EXPECT_EQ(rules::logicalNot(kNaN), 0.0f);
  EXPECT_EQ(rules::logicalNot(-0.0f), 1.0f);
  EXPECT_EQ(rules::where(kNaN, 1.0f, 2.0f), 1.0f);
  EXPECT_EQ(rules::where(-0.0f, 1.0f, 2.0f), 2.0f);
  // relu and clamp keep a NaN input; relu of a negative is +0.
  EXPECT_TRUE(std::isnan(rules::relu(kNaN)));
  EXPECT_EQ(bitsOf(rules::relu(-3.0f)), 0u);
  EXPECT_EQ(bitsOf(rules::relu(-0.0f)), 0u);
  EXPECT_EQ(rules::relu(2.5f), 2.5f);
  EXPECT_TRUE(std::isnan(rules::clamp(kNaN, 0.0f, 1.0f)));
  EXPECT_EQ(rules::clamp(5.0f, 0.0f, 1.0f), 1.0f);
  EXPECT_EQ(rules::clamp(-5.0f, 0.0f, 1.0f), 0.0f);
  // A NaN bound is std::max/std::min's: it leaves the value alone.
  EXPECT_EQ(rules::clamp(5.0f, kNaN, 7.0f), 5.0f);
  EXPECT_EQ(rules::clamp(5.0f, 0.0f, kNaN), 5.0f);
  // Arithmetic and the math functions at exact points.
  EXPECT_EQ(rules::div(1.0f, 0.0f), kInf);
  EXPECT_EQ(rules::pow(2.0f, 10.0f), 1024.0f);
  EXPECT_EQ(rules::exp(0.0f), 1.0f);
  EXPECT_EQ(rules::log(0.0f), -kInf);
  EXPECT_TRUE(std::isnan(rules::sqrt(-1.0f)));
  EXPECT_EQ(rules::rsqrt(4.0f), 0.5f);
  EXPECT_EQ(rules::rsqrt(0.0f), kInf);
  EXPECT_EQ(bitsOf(rules::abs(-0.0f)), 0u);
  EXPECT_EQ(bitsOf(rules::neg(0.0f)), bitsOf(-0.0f));
  EXPECT_EQ(rules::sigmoid(0.0f), 0.5f);
  EXPECT_EQ(rules::sigmoid(-kInf), 0.0f);
  EXPECT_EQ(rules::sigmoid(kInf), 1.0f);
  // In f32: e^100 overflows, so sigmoid(-100) is 0, not 3.7e-44.
  EXPECT_EQ(rules::sigmoid(-100.0f), 0.0f);
  EXPECT_GT(rules::sigmoid(-80.0f), 0.0f);
  EXPECT_EQ(rules::silu(0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(rules::silu(-kInf))); // -inf / inf
  EXPECT_EQ(rules::tanh(0.0f), 0.0f);
}

TEST(NumericRules, HashIsUniformInUnitInterval) {
  // SplitMix64 of the bits of 1.0f, its top 24 bits / 2^24 (computed
  // independently in Python).
  EXPECT_EQ(rules::hash01(1.0f), 16607578.0f / 16777216.0f);
  EXPECT_NE(rules::hash01(0.0f), rules::hash01(-0.0f));
  double sum = 0;
  int below = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float h = rules::hash01(float(i));
    ASSERT_GE(h, 0.0f);
    ASSERT_LT(h, 1.0f);
    sum += h;
    below += h < 0.25f;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(double(below) / n, 0.25, 0.01);
}

TEST(NumericRules, Reductions) {
  double a = rules::maxInit();
  EXPECT_EQ(a, -std::numeric_limits<double>::infinity());
  for (double x : {3.0, -1.0, 7.5})
    rules::accMax(a, x);
  EXPECT_EQ(a, 7.5);
  rules::accMax(a, kNaN);
  EXPECT_TRUE(std::isnan(a));
  rules::accMax(a, 100.0); // NaN stays
  EXPECT_TRUE(std::isnan(a));
  double m = rules::minInit();
  rules::accMin(m, 2.0);
  rules::accMin(m, -4.0);
  EXPECT_EQ(m, -4.0);
  EXPECT_TRUE(std::isnan(rules::mergeMin(kNaN, 1.0)));
  // Wide sums' lanes: the pairwise combine is a warp's xor butterfly (every
  // lane ends with the same total).
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int round = 0; round < 100; ++round) {
    float lane[rules::kSumLanes], warp[rules::kSumLanes];
    for (int l = 0; l < rules::kSumLanes; ++l)
      lane[l] = warp[l] = normal(rng) * float(1 << (l % 20));
    for (int o = 16; o > 0; o >>= 1) {
      float next[rules::kSumLanes];
      for (int l = 0; l < rules::kSumLanes; ++l)
        next[l] = warp[l] + warp[l ^ o];
      std::copy(next, next + rules::kSumLanes, warp);
    }
    const float total = rules::combineSumLanes(lane);
    for (int l = 0; l < rules::kSumLanes; ++l)
      ASSERT_EQ(warp[l], total) << round << " " << l;
  }
  float sq = 0.0f;
  rules::accSquaresLane(sq, 3.0f);
  rules::accSquaresLane(sq, 4.0f);
  EXPECT_EQ(sq, 25.0f);
  // Other sums are in double: 2^24 + 1 is exact there, not in float.
  double s = rules::sumInit();
  rules::accSum(s, 16777216.0f);
  rules::accSum(s, 1.0f);
  rules::accSum(s, 1.0f);
  EXPECT_EQ(rules::finishPlain(s, 3), 16777218.0f);
  EXPECT_EQ(rules::finishMean(6.0, 4), 1.5f);
  EXPECT_TRUE(std::isnan(rules::finishMean(0.0, 0)));
  double q = rules::sumInit();
  rules::accSquares(q, 3.0);
  rules::accSquares(q, -4.0);
  EXPECT_EQ(rules::finishL2(q, 2), 5.0f);
}

TEST(NumericRules, LinesAlongBlock) {
  // Strided input and output: every other element.
  const float x[] = {0.0f, 9.0f, std::log(3.0f), 9.0f};
  float y[4] = {-1, -1, -1, -1};
  rules::softmaxLine(x, 2, y, 2, 2, 1.0f);
  EXPECT_FLOAT_EQ(y[0], 0.25f);
  EXPECT_FLOAT_EQ(y[2], 0.75f);
  EXPECT_EQ(y[1], -1.0f);
  // The running maximum follows std::max: -inf entries weigh nothing, and a
  // large scale does not overflow.
  const float big[] = {1000.0f, -kInf, 1000.0f};
  float z[3];
  rules::softmaxLine(big, 1, z, 1, 3, 10.0f);
  EXPECT_EQ(z[0], 0.5f);
  EXPECT_EQ(z[1], 0.0f);
  EXPECT_EQ(z[2], 0.5f);
  const float n[] = {1.0f, 3.0f};
  rules::normalizeLine(n, 1, z, 1, 2);
  EXPECT_EQ(z[0], 0.25f);
  EXPECT_EQ(z[1], 0.75f);
  // Tap t reads j + t - taps / 2; outside the line counts as 0.
  const float c[] = {1.0f, 2.0f, 3.0f}, w[] = {1.0f, 0.0f, -1.0f};
  rules::convLine(c, 1, z, 1, 3, w, 3);
  EXPECT_EQ(z[0], -2.0f);
  EXPECT_EQ(z[1], -2.0f);
  EXPECT_EQ(z[2], 2.0f);
}

TEST(NumericRules, RankOrder) {
  // Higher first, NaN last, ties (and two NaNs) to the lower index; -0 and
  // +0 tie.
  EXPECT_TRUE(rules::ranksBefore(2.0f, 9, 1.0f, 0));
  EXPECT_TRUE(rules::ranksBefore(-kInf, 9, kNaN, 0));
  EXPECT_FALSE(rules::ranksBefore(kNaN, 0, -kInf, 9));
  EXPECT_TRUE(rules::ranksBefore(kNaN, 1, kNaN, 2));
  EXPECT_TRUE(rules::ranksBefore(5.0f, 1, 5.0f, 2));
  EXPECT_FALSE(rules::ranksBefore(5.0f, 2, 5.0f, 1));
  EXPECT_TRUE(rules::ranksBefore(-0.0f, 1, 0.0f, 2));
  EXPECT_TRUE(rules::ranksBefore(0.0f, 1, -0.0f, 2));
  // The device's radix key orders values exactly as valueRanksBefore does.
  std::vector<float> values = {kNaN,  -kNaN,  kInf,    -kInf,   0.0f,
                               -0.0f, 1e-45f, -1e-45f, 1.0f,    -1.0f,
                               2.5f,  -2.5f,  3.0e38f, -3.0e38f};
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> anyBits;
  for (int i = 0; i < 200; ++i) {
    uint32_t bits = anyBits(rng);
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    values.push_back(v);
  }
  for (float x : values)
    for (float y : values) {
      EXPECT_EQ(rules::rankKey(x) > rules::rankKey(y),
                rules::valueRanksBefore(x, y))
          << std::hex << bitsOf(x) << " " << bitsOf(y);
      EXPECT_EQ(rules::rankKey(x) == rules::rankKey(y),
                !rules::valueRanksBefore(x, y) &&
                    !rules::valueRanksBefore(y, x))
          << std::hex << bitsOf(x) << " " << bitsOf(y);
    }
  EXPECT_EQ(rules::rankKey(kNaN), 0u);
  EXPECT_EQ(rules::rankKey(-kInf), 0x007FFFFFu);
}

TEST(NumericRules, KthLargestThresholdAndBudgets) {
  EXPECT_EQ(rules::kthLargestRank(1, 5), 0);
  EXPECT_EQ(rules::kthLargestRank(5, 5), 4);
  EXPECT_EQ(rules::kthLargestRank(9, 5), 4); // k > n: the smallest
  EXPECT_EQ(rules::kthLargestRank(0, 5), -1);
  EXPECT_EQ(rules::kthLargestRank(3, 0), -1);
  EXPECT_EQ(bitsOf(rules::kthLargestValue(-0.0f)), 0u);
  EXPECT_EQ(rules::kthLargestValue(-2.0f), -2.0f);
  // The host's line: the zero of either sign is +0.
  const float zeros[] = {-0.0f, -0.0f, -1.0f};
  EXPECT_EQ(bitsOf(kabi::kthLargestLine(zeros, 1, 3, 2)), 0u);

  EXPECT_TRUE(rules::passesThreshold(1.0f, 1.0f));
  EXPECT_TRUE(rules::passesThreshold(kInf, kInf));
  EXPECT_FALSE(rules::passesThreshold(0.5f, 1.0f));
  EXPECT_FALSE(rules::passesThreshold(kNaN, -kInf));
  EXPECT_FALSE(rules::passesThreshold(1.0f, kNaN));

  EXPECT_EQ(rules::roundBudget(2.9), 2);
  EXPECT_EQ(rules::roundBudget(1.0), 1);
  EXPECT_EQ(rules::roundBudget(0.999), 0);
  EXPECT_EQ(rules::roundBudget(-1.0), 0);
  EXPECT_EQ(rules::roundBudget(std::nan("")), 0);
  EXPECT_EQ(rules::roundBudget(-std::numeric_limits<double>::infinity()), 0);
  EXPECT_EQ(rules::roundBudget(std::numeric_limits<double>::infinity()),
            9000000000000000LL);
  EXPECT_EQ(rules::roundBudget(1e300), 9000000000000000LL);
  EXPECT_EQ(rules::roundBudget(8999999999999999.0), 8999999999999999LL);
}

TEST(NumericRules, TopPKeepsTheFewestBlocksThatReachTheMass) {
  using V = std::vector<int64_t>;
  auto topp = [](std::vector<float> score, float p, int64_t max = -1,
                 int64_t keepFirst = 0) {
    kabi::Kept kept{int64_t(score.size()), keepFirst, 0};
    return kabi::selectTopP(score.data(), kept, p, max);
  };
  // Masses 0.2, 0.5, 0.3 (softmax of their logs).
  const std::vector<float> s = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  EXPECT_EQ(topp(s, 0.5f), (V{1}));
  EXPECT_EQ(topp(s, 0.51f), (V{1, 2}));
  EXPECT_EQ(topp(s, 0.79f), (V{1, 2}));
  EXPECT_EQ(topp(s, 0.81f), (V{0, 1, 2}));
  EXPECT_EQ(topp(s, 0.81f, 2), (V{1, 2})); // at most max
  EXPECT_EQ(topp(s, 1.0f), (V{0, 1, 2}));
  EXPECT_EQ(topp(s, 7.0f), (V{0, 1, 2})); // >= 1: every weighted block
  EXPECT_EQ(topp(s, 0.0f), (V{}));        // <= 0 (or NaN): none
  EXPECT_EQ(topp(s, -1.0f), (V{}));
  EXPECT_EQ(topp(s, kNaN), (V{}));
  // Ties rank toward the lower index; equal weights.
  EXPECT_EQ(topp({1, 1, 1, 1}, 0.5f), (V{0, 1}));
  EXPECT_EQ(topp({1, 1, 1, 1}, 0.51f), (V{0, 1, 2}));
  // NaN weighs nothing; a block far below the top weighs 0 and is never
  // needed; infinities at the top share the mass, and all -inf is uniform.
  EXPECT_EQ(topp({kNaN, 0, 0}, 1.0f), (V{1, 2}));
  EXPECT_EQ(topp({kNaN, kNaN}, 1.0f), (V{}));
  EXPECT_EQ(topp({0, -1000}, 1.0f), (V{0}));
  EXPECT_EQ(topp({kInf, 3, kInf}, 1.0f), (V{0, 2}));
  EXPECT_EQ(topp({-kInf, -kInf, -kInf}, 0.5f), (V{0, 1}));
  // Kept blocks are not candidates: the mass is over the others.
  EXPECT_EQ(topp({9, 0, 0}, 0.5f, -1, 1), (V{1}));
  EXPECT_EQ(rules::toppTarget(0.5f, 0), 0ull);
  EXPECT_EQ(rules::toppTarget(0.5f, 3), 2ull);
  EXPECT_EQ(rules::toppWeight(2.0f, 2.0f), rules::kTopPOne);
  EXPECT_EQ(rules::toppWeight(kNaN, 2.0f), 0ull);
}

TEST(NumericRules, KeptBlocks) {
  auto kept = [](rules::KeptBlocks k) {
    std::vector<int64_t> out;
    for (int64_t j = 0; j < k.numBlocks; ++j)
      if (k.contains(j))
        out.push_back(j);
    return out;
  };
  EXPECT_EQ(kept({6, 1, 1}), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(kept({6, 2, 0}), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(kept({6, 0, 3}), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(kept({6, 0, 0}), (std::vector<int64_t>{}));
  EXPECT_EQ(kept({3, 2, 2}), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(kept({2, 9, 9}), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(kept({0, 1, 1}), (std::vector<int64_t>{}));
  // candidates() counts the others, for every small case.
  for (long long n = 0; n <= 7; ++n)
    for (long long first = 0; first <= 9; ++first)
      for (long long last = 0; last <= 9; ++last) {
        const rules::KeptBlocks k{n, first, last};
        EXPECT_EQ(k.candidates(), n - (long long)kept(k).size())
            << n << " " << first << " " << last;
      }
  // Kept blocks are never candidates, and the final list adds them.
  const float score[] = {9, 1, 5, 5, kNaN, 5, 0, 9};
  kabi::Kept k{8, 1, 1};
  EXPECT_EQ(kabi::selectTopK(score, k, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(kabi::selectThreshold(score, k, 5, -1),
            (std::vector<int64_t>{2, 3, 5}));
}
