//===- InterpreterTest.cpp - The reference interpreter against hand math --===//
//
// Each stock program's cache and index stages, run by the interpreter on
// fresh random data, against the same math written out by hand here.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Interpreter.h"
#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Driver.h"

#include "../common/Random.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

using namespace vflow;
using namespace vflow::interp;

namespace {

/// A compiled program and an interpreter for its first flow.
struct Program {
  mlir::MLIRContext context;
  std::unique_ptr<Compilation> compilation;
  std::unique_ptr<FlowInterpreter> interp;

  Program(const std::string &path, int64_t headDim, int64_t group,
          std::vector<ParamOverride> overrides = {},
          std::map<std::string, double> runtimeParams = {}) {
    registerCompilerDialects(context);
    std::string text, error;
    EXPECT_TRUE(readSourceFile(path, text, error)) << error;
    compilation = std::make_unique<Compilation>(
        std::make_unique<SourceBuffer>(path, text));
    SemaOptions options;
    options.overrides = std::move(overrides);
    options.baseDir = path.substr(0, path.rfind('/'));
    bool ok = compileSource(*compilation, context, options, CompileStage::VT);
    EXPECT_TRUE(ok) << compilation->diags.renderText();
    if (!ok)
      return;
    vt::FlowOp flow = *compilation->vt->getBody()->getOps<vt::FlowOp>().begin();
    interp =
        FlowInterpreter::create(flow, headDim, group, runtimeParams, error);
    EXPECT_TRUE(interp) << error;
  }
};

std::string example(const char *name) {
  return std::string(VFLOW_EXAMPLES_DIR) + "/" + name + ".vflow";
}

Tensor randomTensor(std::vector<std::string> names, std::vector<int64_t> sizes,
                    std::mt19937 &rng, float scale = 1.0f) {
  Tensor t(std::move(names), std::move(sizes));
  vflow::testing::NormalDraws(rng, scale).fill(t.data);
  return t;
}

float bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

/// Top-k of `score` among blocks that are not kept, ties to the lower index.
std::vector<int64_t> handTopK(const std::vector<float> &score, int64_t k,
                              int64_t keepFirst, int64_t keepLast) {
  int64_t n = score.size();
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < n; ++j)
    if (j >= keepFirst && j < n - keepLast)
      ids.push_back(j);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return score[a] > score[b]; });
  ids.resize(std::min<size_t>(ids.size(), std::max<int64_t>(k, 0)));
  std::sort(ids.begin(), ids.end());
  return ids;
}

/// Runs the cache stage on every block of K/V [block, token, dim] and stacks
/// each field into [block, ...].
std::map<std::string, Tensor> fieldsOf(const FlowInterpreter &fi,
                                       const Tensor &K, const Tensor &V) {
  int64_t n = K.sizes[0], p = K.sizes[1], d = K.sizes[2];
  std::map<std::string, Tensor> stacked;
  for (int64_t b = 0; b < n; ++b) {
    Tensor kb({"token", "dim"}, {p, d}), vb({"token", "dim"}, {p, d});
    std::copy(K.data.begin() + b * p * d, K.data.begin() + (b + 1) * p * d,
              kb.data.begin());
    std::copy(V.data.begin() + b * p * d, V.data.begin() + (b + 1) * p * d,
              vb.data.begin());
    for (auto &entry : fi.runCacheStage(kb, vb)) {
      Tensor &dst = stacked[entry.first];
      if (dst.names.empty()) {
        dst.names = entry.second.names;
        dst.names.insert(dst.names.begin(), "block");
        dst.sizes = entry.second.sizes;
        dst.sizes.insert(dst.sizes.begin(), n);
        dst.data.clear();
      }
      dst.data.insert(dst.data.end(), entry.second.data.begin(),
                      entry.second.data.end());
    }
  }
  return stacked;
}

} // namespace

TEST(Interpreter, QuestMatchesHandMath) {
  const int64_t D = 64, G = 4, P = 16;
  for (unsigned seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    int64_t n = 40 + seed * 17;
    Program prog(example("quest"), D, G, {}, {{"budget", 9}});
    ASSERT_TRUE(prog.interp);
    Tensor K = randomTensor({"block", "token", "dim"}, {n, P, D}, rng);
    Tensor V = randomTensor({"block", "token", "dim"}, {n, P, D}, rng);
    IndexInputs in;
    in.q = randomTensor({"head", "dim"}, {G, D}, rng);
    in.fields = fieldsOf(*prog.interp, K, V);
    in.numBlocks = n;
    in.contextLen = n * P + 5;
    // Hand math: kmax/kmin in bf16, bound per head, max over heads.
    std::vector<float> score(n);
    for (int64_t b = 0; b < n; ++b) {
      float best = -INFINITY;
      for (int64_t h = 0; h < G; ++h) {
        float s = 0;
        for (int64_t d = 0; d < D; ++d) {
          float mx = -INFINITY, mn = INFINITY;
          for (int64_t t = 0; t < P; ++t) {
            float k = K.data[(b * P + t) * D + d];
            mx = std::max(mx, k);
            mn = std::min(mn, k);
          }
          float qd = in.q.data[h * D + d];
          s += std::max(qd * bf16(mx), qd * bf16(mn));
        }
        best = std::max(best, s);
      }
      score[b] = best;
    }
    EXPECT_FLOAT_EQ(in.fields["kmax"].data[3 * D + 5], [&] {
      float mx = -INFINITY;
      for (int64_t t = 0; t < P; ++t)
        mx = std::max(mx, K.data[(3 * P + t) * D + 5]);
      return bf16(mx);
    }());
    StateValues states = prog.interp->initialStates(n);
    Selection sel = prog.interp->runIndexStage(in, states);
    EXPECT_EQ(sel.blocks, handTopK(score, 9, 1, 1)) << "seed " << seed;
    std::vector<int64_t> all = prog.interp->finalBlocks(sel, n);
    EXPECT_EQ(all.size(), 11u);
    EXPECT_EQ(all.front(), 0);
    EXPECT_EQ(all.back(), n - 1);
    EXPECT_EQ(prog.interp->budget(n, n * P), 9);
  }
}

TEST(Interpreter, BlockTopKMatchesHandMath) {
  const int64_t D = 32, G = 2, P = 16, n = 30;
  std::mt19937 rng(7);
  Program prog(example("block_topk"), D, G, {}, {{"budget", 5}});
  ASSERT_TRUE(prog.interp);
  Tensor K = randomTensor({"block", "token", "dim"}, {n, P, D}, rng);
  IndexInputs in;
  in.q = randomTensor({"head", "dim"}, {G, D}, rng);
  in.fields = fieldsOf(*prog.interp, K, K);
  in.numBlocks = n;
  in.contextLen = n * P;
  std::vector<float> score(n, 0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t d = 0; d < D; ++d) {
      float c = 0, qm = 0;
      for (int64_t t = 0; t < P; ++t)
        c += K.data[(b * P + t) * D + d];
      for (int64_t h = 0; h < G; ++h)
        qm += in.q.data[h * D + d];
      score[b] += (qm / G) * bf16(c / P);
    }
  StateValues states;
  EXPECT_EQ(prog.interp->runIndexStage(in, states).blocks,
            handTopK(score, 5, 1, 1));
}

TEST(Interpreter, H2OAccumulatesDecayedMass) {
  const int64_t D = 16, G = 4;
  std::mt19937 rng(11);
  Program prog(example("h2o"), D, G, {}, {{"budget", 3}});
  ASSERT_TRUE(prog.interp);
  EXPECT_EQ(prog.interp->keepLast(), 8);
  int64_t n = 20;
  StateValues states = prog.interp->initialStates(n);
  std::vector<double> acc(n, 0.0);
  std::vector<int64_t> sel;
  for (int step = 0; step < 4; ++step) {
    IndexInputs in;
    in.numBlocks = n;
    in.contextLen = n * 16;
    in.step = step;
    in.mass = Tensor({"block", "head"}, {n, G});
    std::uniform_real_distribution<float> u(0, 1);
    for (float &m : in.mass.data)
      m = u(rng);
    for (int64_t b = 0; b < n; ++b) {
      float s = 0;
      for (int64_t h = 0; h < G; ++h)
        s += in.mass.data[b * G + h];
      acc[b] = static_cast<float>(acc[b]) * 0.984375f + s;
    }
    sel = prog.interp->runIndexStage(in, states).blocks;
  }
  std::vector<float> accf(acc.begin(), acc.end());
  for (int64_t b = 0; b < n; ++b)
    EXPECT_NEAR(states["acc"].data[b], accf[b], 1e-5 * std::abs(accf[b]));
  EXPECT_EQ(sel, handTopK(accf, 3, 1, 8));
}

TEST(Interpreter, PerBlockStatesGrowWithInit) {
  const int64_t D = 8, G = 1;
  Program prog(example("h2o"), D, G);
  ASSERT_TRUE(prog.interp);
  StateValues states = prog.interp->initialStates(2);
  states["acc"].data = {5, 6};
  prog.interp->growStates(states, 4);
  EXPECT_EQ(states["acc"].data, (std::vector<float>{5, 6, 0, 0}));
}

TEST(Interpreter, SlidingWindowKeepsTheMostRecentBlocks) {
  Program prog(example("sliding_window"), 8, 2, {}, {{"window", 4}});
  ASSERT_TRUE(prog.interp);
  IndexInputs in;
  in.numBlocks = 12;
  in.contextLen = 12 * 16 + 3;
  StateValues states;
  Selection sel = prog.interp->runIndexStage(in, states);
  // Candidates exclude the sink block 0 (keep_first) and block 11
  // (keep_last): the 4 most recent others are 7..10.
  EXPECT_EQ(sel.blocks, (std::vector<int64_t>{7, 8, 9, 10}));
  EXPECT_EQ(prog.interp->finalBlocks(sel, 12),
            (std::vector<int64_t>{0, 7, 8, 9, 10, 11}));
  // Fewer blocks than the budget: every block.
  in.numBlocks = 3;
  EXPECT_EQ(prog.interp->finalBlocks(prog.interp->runIndexStage(in, states), 3),
            (std::vector<int64_t>{0, 1, 2}));
}

TEST(Interpreter, EPSGramSketchAndThreshold) {
  const int64_t D = 32, G = 2, P = 128, n = 12;
  std::mt19937 rng(5);
  Program prog(example("eps"), D, G, {}, {{"budget", 3}, {"alpha", 1.5}});
  ASSERT_TRUE(prog.interp);
  const Tensor &phi = prog.interp->getConsts().at("Phi");
  ASSERT_EQ(phi.sizes, (std::vector<int64_t>{D, 8}));
  for (float x : phi.data)
    EXPECT_FLOAT_EQ(std::abs(x), 1.0f / std::sqrt(8.0f));
  Tensor K = randomTensor({"block", "token", "dim"}, {n, P, D}, rng);
  auto fields = fieldsOf(*prog.interp, K, K);
  // G = (K Phi)^T (K Phi) for block 2, entry (1, 3); frob = ||K||_F.
  double g13 = 0, frob = 0;
  for (int64_t t = 0; t < P; ++t) {
    double y1 = 0, y3 = 0;
    for (int64_t d = 0; d < D; ++d) {
      float k = K.data[(2 * P + t) * D + d];
      y1 += k * phi.data[d * 8 + 1];
      y3 += k * phi.data[d * 8 + 3];
      frob += double(k) * k;
    }
    g13 += y1 * y3;
  }
  EXPECT_NEAR(fields["G"].data[2 * 64 + 1 * 8 + 3], g13,
              1e-3 * std::abs(g13) + 1e-3);
  EXPECT_NEAR(fields["frob"].data[2], std::sqrt(frob), 1e-3);
  IndexInputs in;
  in.q = randomTensor({"head", "dim"}, {G, D}, rng);
  in.fields = fields;
  in.numBlocks = n;
  in.contextLen = n * P;
  StateValues states;
  Selection sel = prog.interp->runIndexStage(in, states);
  // At most 2 * budget blocks, none of them kept (first 1, last 8).
  EXPECT_LE(sel.blocks.size(), 6u);
  for (int64_t b : sel.blocks)
    EXPECT_TRUE(b >= 1 && b < n - 8);
  EXPECT_EQ(prog.interp->budget(n, n * P), 6);
}

TEST(Interpreter, EveryBuiltinRuns) {
  Program prog(std::string(VFLOW_LIT_DIR) + "/frontend/every-builtin.vflow", 4,
               3);
  ASSERT_TRUE(prog.interp);
  std::mt19937 rng(3);
  int64_t n = 9, P = 8, D = 4;
  Tensor K = randomTensor({"block", "token", "dim"}, {n, P, D}, rng);
  Tensor V = randomTensor({"block", "token", "dim"}, {n, P, D}, rng);
  IndexInputs in;
  in.q = randomTensor({"head", "dim"}, {3, D}, rng);
  in.fields = fieldsOf(*prog.interp, K, V);
  in.mass = randomTensor({"block", "head"}, {n, 3}, rng);
  in.numBlocks = n;
  in.contextLen = n * P;
  StateValues states = prog.interp->initialStates(n);
  Selection sel = prog.interp->runIndexStage(in, states);
  EXPECT_FALSE(sel.blocks.empty());
  EXPECT_TRUE(std::is_sorted(sel.blocks.begin(), sel.blocks.end()));
}

TEST(Interpreter, RejectsCompileTimeOverridesAndWrongHeadDim) {
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  std::string text, error;
  ASSERT_TRUE(readSourceFile(example("double_sparse"), text, error));
  Compilation c(std::make_unique<SourceBuffer>(example("double_sparse"), text));
  SemaOptions options;
  options.baseDir = VFLOW_EXAMPLES_DIR;
  ASSERT_TRUE(compileSource(c, context, options, CompileStage::VT));
  vt::FlowOp flow = *c.vt->getBody()->getOps<vt::FlowOp>().begin();
  EXPECT_FALSE(FlowInterpreter::create(flow, 64, 4, {}, error));
  EXPECT_NE(error.find("specialized to head_dim 128"), std::string::npos)
      << error;
  EXPECT_FALSE(
      FlowInterpreter::create(flow, 128, 4, {{"head_dim", 64}}, error));
  EXPECT_NE(error.find("compile-time"), std::string::npos) << error;
  EXPECT_FALSE(FlowInterpreter::create(flow, 128, 4, {{"nope", 1}}, error));
  EXPECT_NE(error.find("no param 'nope'"), std::string::npos) << error;
  EXPECT_TRUE(FlowInterpreter::create(flow, 128, 4, {{"budget", 3}}, error));
}

TEST(Interpreter, ReadsAfterAStoreSeeTheRoundedState) {
  // 1.00390625 is not a bf16 value: the state stores 1.0, and the threshold
  // below passes every block only if the read after the store sees 1.0.
  std::string path = ::testing::TempDir() + "/rounded-state.vflow";
  {
    std::ofstream out(path);
    out << "flow f { param keep_first = 0; param keep_last = 0;\n"
           "state st[block]: bf16 = 0;\n"
           "index { st = position * 0 + 1.00390625;\n"
           "return threshold(position, mean(st, block) * 1000 - 1000); } }\n";
  }
  Program prog(path, 8, 1);
  ASSERT_TRUE(prog.interp);
  IndexInputs in;
  in.numBlocks = 6;
  in.contextLen = 6 * 16;
  StateValues states = prog.interp->initialStates(6);
  Selection sel = prog.interp->runIndexStage(in, states);
  EXPECT_EQ(sel.blocks, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(states["st"].data[0], 1.0f);
}
