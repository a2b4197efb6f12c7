//===- CpuBackendTest.cpp - Generated C++ against the interpreter ---------===//
//
// Every stock program and random well-typed programs are compiled through
// the pass pipeline, emitted as C++ (vflow::emitCpp), built by the host JIT
// and run next to the reference interpreter on random workloads: the fields
// of every block, the selection, the budget and the states after every step
// must agree (selections exactly, values within 1e-5 relative).
//
//===----------------------------------------------------------------------===//

#include "ProgramGenerator.h"

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/CppEmitter.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Interpreter.h"
#include "vflow/Compiler/Passes.h"
#include "vflow/Runtime/Error.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>
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
  for (const rt::CpuParam &p : cpu.info().params)
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
        interp::Tensor t;
        for (int64_t b = 0; b < n; ++b) {
          const interp::Tensor &one = refFields[b].at(name);
          if (b == 0) {
            t.names = one.names;
            t.names.insert(t.names.begin(), "block");
            t.sizes = one.sizes;
            t.sizes.insert(t.sizes.begin(), n);
          }
          t.data.insert(t.data.end(), one.data.begin(), one.data.end());
          stacked[f].insert(stacked[f].end(), cpuFields[b][f].begin(),
                            cpuFields[b][f].end());
        }
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
      cin.q = in.q.data.data();
      cin.mass = in.mass.data.data();
      cin.K = in.K.data.data();
      cin.V = in.V.data.data();
      cin.numBlocks = n;
      cin.contextLen = in.contextLen;
      cin.step = step;
      interp::Selection refSelection = fi->runIndexStage(in, refStates);
      const std::vector<int64_t> &ref = refSelection.blocks;
      std::vector<int64_t> got = cpu.runIndexStage(cin, cpuStates);
      std::string at = " at step " + std::to_string(step) + " (" +
                       std::to_string(n) + " blocks)";
      if (ref != got)
        return "selections differ" + at + ": interpreter " + idsText(ref) +
               ", cpu " + idsText(got);
      if (fi->finalBlocks(refSelection, n) != cpu.finalBlocks(got, n))
        return "final blocks differ" + at;
      int64_t rb = budgetRef->budget(n, in.contextLen);
      int64_t cb = cpu.budget(n, in.contextLen);
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
      if (!cpu)
        cpu = std::make_unique<rt::CpuFlow>(source, info, w.headDim, w.group,
                                            options);
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
      w.params = {{name == "sliding_window" ? "window"
                   : name == "above_mean"   ? "max_blocks"
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
                         ::testing::Values("block_topk", "quest", "h2o", "eps",
                                           "lserve", "running_avg",
                                           "value_gate", "above_mean",
                                           "sliding_window", "double_sparse"));

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
        "extern \"C\" int64_t vflow_quest_budget(", "// vt.kernel select",
        "vt.reduce max", "vk::selectTopK("})
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
