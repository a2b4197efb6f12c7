//===- GeneratorTest.cpp - Random programs compile and run ----------------===//
//
// Every generated program must compile to verified vt IR without errors and
// run in the reference interpreter (cache stage over a few blocks, index
// stage over a few steps with growing states) without throwing, returning a
// sorted selection within its budget. Across the seeds, the programs must
// use every builtin function and every storage dtype.
//
//===----------------------------------------------------------------------===//

#include "../common/Random.h"
#include "ProgramGenerator.h"

#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Interpreter.h"
#include "vflow/Frontend/Sema.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sys/stat.h>

using namespace vflow;
using namespace vflow::interp;
using vflow::testing::GeneratedProgram;
using vflow::testing::generateProgram;
using vflow::testing::GeneratorOptions;

namespace {

constexpr uint64_t kNumSeeds = 300;

/// Seeds of the compile-and-run test: 1..300, or VFLOW_GENERATOR_SEEDS
/// programs from VFLOW_GENERATOR_FIRST_SEED (1) for a longer search.
uint64_t envOr(const char *name, uint64_t fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

/// A directory of its own for the files that load(...) reads.
std::string dataDir(uint64_t seed) {
  std::string dir =
      ::testing::TempDir() + "vflow-generator-" + std::to_string(seed);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

Tensor randomTensor(std::vector<std::string> names, std::vector<int64_t> sizes,
                    std::mt19937 &rng) {
  Tensor t(std::move(names), std::move(sizes));
  vflow::testing::NormalDraws(rng).fill(t.data);
  return t;
}

bool allFinite(const Tensor &t) {
  for (float x : t.data)
    if (!std::isfinite(x))
      return false;
  return true;
}

/// Appends one block's value of every field to [block, ...] tensors.
void appendFields(std::map<std::string, Tensor> &stacked,
                  const std::map<std::string, Tensor> &block) {
  for (const auto &entry : block) {
    Tensor &dst = stacked[entry.first];
    if (dst.names.empty()) {
      dst.names = entry.second.names;
      dst.names.insert(dst.names.begin(), "block");
      dst.sizes = entry.second.sizes;
      dst.sizes.insert(dst.sizes.begin(), 0);
      dst.data.clear();
    }
    ++dst.sizes[0];
    dst.data.insert(dst.data.end(), entry.second.data.begin(),
                    entry.second.data.end());
  }
}

struct RunStats {
  int nonFinitePrograms = 0;
  int warnings = 0;
  int selectedBlocks = 0;
};

/// Compiles and runs one program; failures are reported through gtest.
void checkProgram(const GeneratedProgram &prog, uint64_t seed,
                  mlir::MLIRContext &context, RunStats &stats) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ":\n" + prog.source);
  SemaOptions options;
  if (!prog.files.empty()) {
    options.baseDir = dataDir(seed);
    for (const auto &file : prog.files) {
      std::ofstream out(options.baseDir + "/" + file.first, std::ios::binary);
      out << file.second;
    }
  }
  Compilation compilation(
      std::make_unique<SourceBuffer>(prog.flowName + ".vflow", prog.source));
  bool ok = compileSource(compilation, context, options, CompileStage::VT);
  ASSERT_TRUE(ok && compilation.diags.getNumErrors() == 0)
      << compilation.diags.renderText();
  stats.warnings += compilation.diags.getNumWarnings();
  EXPECT_EQ(compilation.diags.getNumWarnings(), 0u)
      << compilation.diags.renderText();

  vt::FlowOp flow = *compilation.vt->getBody()->getOps<vt::FlowOp>().begin();
  std::string error;
  std::unique_ptr<FlowInterpreter> fi = FlowInterpreter::create(
      flow, prog.headDim, prog.group, prog.runtimeParams, error);
  ASSERT_TRUE(fi) << error;

  std::mt19937 rng(static_cast<unsigned>(seed));
  const int64_t P = fi->blockSize(), D = prog.headDim, G = prog.group;
  int64_t n = std::uniform_int_distribution<int64_t>(1, 5)(rng);
  std::map<std::string, Tensor> fields;
  Tensor K({"block", "token", "dim"}, {0, P, D});
  Tensor V = K;
  StateValues states = fi->initialStates(n);
  bool finite = true;
  try {
    for (int64_t step = 0; step < 3; ++step) {
      // New complete blocks: their fields, then the states grow.
      while (K.sizes[0] < n) {
        Tensor kb = randomTensor({"token", "dim"}, {P, D}, rng);
        Tensor vb = randomTensor({"token", "dim"}, {P, D}, rng);
        std::map<std::string, Tensor> block = fi->runCacheStage(kb, vb);
        EXPECT_EQ(block.size(), fi->getFieldNames().size());
        for (const auto &f : block)
          finite &= allFinite(f.second);
        appendFields(fields, block);
        K.data.insert(K.data.end(), kb.data.begin(), kb.data.end());
        V.data.insert(V.data.end(), vb.data.begin(), vb.data.end());
        ++K.sizes[0];
        ++V.sizes[0];
      }
      fi->growStates(states, n);
      IndexInputs in;
      in.q = randomTensor({"head", "dim"}, {G, D}, rng);
      in.mass = Tensor({"block", "head"}, {n, G});
      std::uniform_real_distribution<float> unit(0.0f, 1.0f);
      for (float &m : in.mass.data)
        m = unit(rng);
      in.K = K;
      in.V = V;
      in.fields = fields;
      in.numBlocks = n;
      in.contextLen = n * P + static_cast<int64_t>(rng() % P);
      in.step = step;
      in.layer = int64_t(rng() % 40);
      in.kvHead = int64_t(rng() % 8);
      Selection sel = fi->runIndexStage(in, states);
      for (const auto &s : states)
        finite &= allFinite(s.second);
      // Sorted, unique, complete blocks only, never a kept block.
      for (size_t i = 0; i < sel.blocks.size(); ++i) {
        int64_t b = sel.blocks[i];
        EXPECT_TRUE(i == 0 || sel.blocks[i - 1] < b) << "unsorted selection";
        EXPECT_GE(b, fi->keepFirst());
        EXPECT_LT(b, n - fi->keepLast());
      }
      int64_t budget = fi->budget(n, in.contextLen, in.layer, in.kvHead);
      if (budget >= 0) {
        EXPECT_LE(static_cast<int64_t>(sel.blocks.size()), budget);
      }
      std::vector<int64_t> all = fi->finalBlocks(sel, n);
      EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
      stats.selectedBlocks += static_cast<int>(sel.blocks.size());
      n += std::uniform_int_distribution<int64_t>(0, 3)(rng);
    }
  } catch (const std::exception &e) {
    ADD_FAILURE() << "the interpreter threw: " << e.what();
  }
  stats.nonFinitePrograms += !finite;
}

/// Whether `word(` occurs in `text` as a call (not inside a longer name).
bool callsFunction(const std::string &text, const std::string &word) {
  std::string needle = word + "(";
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    char before = at ? text[at - 1] : ' ';
    if (!std::isalnum(static_cast<unsigned char>(before)) && before != '_')
      return true;
  }
  return false;
}

} // namespace

TEST(Generator, ProgramsCompileAndRun) {
  auto start = std::chrono::steady_clock::now();
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  RunStats stats;
  uint64_t first = envOr("VFLOW_GENERATOR_FIRST_SEED", 1);
  uint64_t count = envOr("VFLOW_GENERATOR_SEEDS", kNumSeeds);
  for (uint64_t seed = first; seed < first + count; ++seed) {
    GeneratorOptions options;
    options.seed = seed;
    checkProgram(generateProgram(options), seed, context, stats);
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("%llu programs in %.2f s; %d with a non-finite field or state "
              "value; %d blocks selected\n",
              static_cast<unsigned long long>(count), seconds,
              stats.nonFinitePrograms, stats.selectedBlocks);
  // NaN and infinity are legal but must stay rare.
  EXPECT_LE(stats.nonFinitePrograms, static_cast<int>(count / 20));
}

TEST(Generator, CoversEveryBuiltinAndDType) {
  std::vector<std::string> sources;
  for (uint64_t seed = 1; seed <= kNumSeeds; ++seed) {
    GeneratorOptions options;
    options.seed = seed;
    sources.push_back(generateProgram(options).source);
  }
  auto anyCalls = [&](const std::string &fn) {
    for (const std::string &s : sources)
      if (callsFunction(s, fn))
        return true;
    return false;
  };
  auto anyHas = [&](const std::string &text) {
    for (const std::string &s : sources)
      if (s.find(text) != std::string::npos)
        return true;
    return false;
  };
  for (const std::string &fn : builtinFunctionNames())
    EXPECT_TRUE(anyCalls(fn)) << "no program calls " << fn;
  for (const char *dtype : {"f32", "bf16", "f16", "fp8e4m3", "fp8e5m2"})
    EXPECT_TRUE(anyHas(std::string(": ") + dtype + " ")) << dtype;
  // Syntax and declaration forms.
  for (const char *form : {"param head_dim = ",
                           "param keep_first = ",
                           "param keep_last = ",
                           ": int = ",
                           ": float = ",
                           ": bool = ",
                           " = true;",
                           "axis ",
                           "const ",
                           "seed = ",
                           "cache {",
                           "cache f",
                           "let y",
                           "state ",
                           "[block]",
                           "[head",
                           "] = ",
                           "index {",
                           "(-inf)",
                           "inf)",
                           "(not ",
                           " and ",
                           " or ",
                           " < ",
                           " <= ",
                           " > ",
                           " >= ",
                           " == ",
                           " != ",
                           " -> ",
                           "scale = ",
                           "recall = ",
                           "max = ",
                           "per = head",
                           "num_blocks",
                           "context_len",
                           "step",
                           "group",
                           "position",
                           "mass",
                           "q",
                           "block_size",
                           "let sel",
                           "/*",
                           ".25",
                           "1e-3",
                           "2.5E-1"})
    EXPECT_TRUE(anyHas(form)) << "no program has '" << form << "'";
}

TEST(Generator, IsDeterministic) {
  std::set<std::string> distinct;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    GeneratorOptions options;
    options.seed = seed;
    GeneratedProgram a = generateProgram(options), b = generateProgram(options);
    EXPECT_EQ(a.source, b.source);
    EXPECT_EQ(a.files, b.files);
    EXPECT_EQ(a.runtimeParams, b.runtimeParams);
    distinct.insert(a.source);
  }
  EXPECT_EQ(distinct.size(), 20u);
}

TEST(Generator, RespectsOptions) {
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  RunStats stats;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    GeneratorOptions options;
    options.seed = seed;
    options.allowStates = options.allowConsts = options.allowSplit = false;
    options.allowRename = options.allowLoad = options.allowIndexKV = false;
    options.maxFields = 1;
    options.maxLets = 2;
    options.maxExprDepth = 2;
    GeneratedProgram prog = generateProgram(options);
    EXPECT_EQ(prog.source.find("state "), std::string::npos) << prog.source;
    EXPECT_EQ(prog.source.find("const "), std::string::npos) << prog.source;
    EXPECT_FALSE(callsFunction(prog.source, "split")) << prog.source;
    EXPECT_FALSE(callsFunction(prog.source, "rename")) << prog.source;
    EXPECT_TRUE(prog.files.empty());
    checkProgram(prog, seed, context, stats);
  }
}
