//===- SessionTest.cpp - Compile, artifact, HostSession vs the oracle -----===//
//
// The public path end to end: compileFile -> artifact (saved and loaded) ->
// HostSession on a paged cache, checked step by step against the reference
// interpreter fed with the same fields, states and mass.
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Session.h"
#include "vflow/Compiler/ASTToVT.h"
#include "vflow/Compiler/Compile.h"
#include "vflow/Compiler/CppEmitter.h"
#include "vflow/Compiler/Driver.h"
#include "vflow/Compiler/Interpreter.h"
#include "vflow/Runtime/Error.h"

#include "../common/Configs.h"
#include "../common/Random.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <cmath>

#include <random>

using namespace vflow;

namespace {

std::string example(const std::string &name) {
  return std::string(VFLOW_EXAMPLES_DIR) + "/" + name + ".vflow";
}

rt::SessionConfig smallConfig() {
  return vflow::testing::sessionConfig(
      2, 2, 3, 16, 512, ::testing::TempDir() + "/vflow-session-jit");
}

/// Checks a session against the interpreter over a few decode steps.
void checkAgainstInterpreter(
    const std::string &name,
    std::vector<std::pair<std::string, std::string>> params) {
  SCOPED_TRACE(name);
  CompileOptions options;
  options.params = params;
  CompileResult r = compileFile(example(name), options);
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  std::string path = ::testing::TempDir() + "/" + name + ".vfa";
  rt::saveArtifact(r.artifact, path);
  rt::Artifact loaded = rt::loadArtifact(path);
  const rt::FlowArtifact &flow = loaded.flows.at(0);

  // The oracle: the interpreter on the lowered IR of the same program.
  mlir::MLIRContext context;
  registerCompilerDialects(context);
  std::string text, error;
  ASSERT_TRUE(readSourceFile(example(name), text, error));
  Compilation c(std::make_unique<SourceBuffer>(example(name), text));
  SemaOptions sema;
  sema.baseDir = VFLOW_EXAMPLES_DIR;
  for (const auto &p : params)
    sema.overrides.push_back({p.first, p.second});
  ASSERT_TRUE(compileSource(c, context, sema, CompileStage::VT));
  vt::FlowOp vflow = *c.vt->getBody()->getOps<vt::FlowOp>().begin();

  // The artifact describes the flow exactly as the emitter does.
  rt::CpuFlowInfo described;
  ASSERT_TRUE(describeCpuFlow(vflow, described, error)) << error;
  rt::CpuFlowInfo fromArtifact = rt::cpuFlowInfo(flow);
  ASSERT_EQ(described.params.size(), fromArtifact.params.size());
  for (size_t i = 0; i < described.params.size(); ++i) {
    EXPECT_EQ(described.params[i].name, fromArtifact.params[i].name);
    EXPECT_EQ(described.params[i].compileTime,
              fromArtifact.params[i].compileTime);
  }
  EXPECT_EQ(described.readsMass, fromArtifact.readsMass);
  EXPECT_EQ(described.readsKV, fromArtifact.readsKV);

  rt::SessionConfig cfg = smallConfig();
  rt::HostSession session(flow, cfg);
  auto oracle =
      interp::FlowInterpreter::create(vflow, cfg.headDim, cfg.group, {}, error);
  ASSERT_TRUE(oracle) << error;

  std::mt19937 rng(11);
  vflow::testing::NormalDraws normal(rng);
  const int L = cfg.numLayers, H = cfg.numKVHeads, G = cfg.group,
            D = cfg.headDim;
  const int64_t P = flow.blockSize;
  rt::SeqId seq = session.addSequence();
  int64_t prompt = 11 * P + 5;
  std::vector<float> k(prompt * L * H * D), v(k.size());
  normal.fill(k, v);
  session.append(seq, prompt, k.data(), v.data());

  std::vector<std::vector<interp::StateValues>> states(
      L, std::vector<interp::StateValues>(H));
  for (int step = 0; step < 2 * int(P) + 3; ++step) {
    std::vector<float> kn(L * H * D), vn(L * H * D);
    normal.fill(kn, vn);
    session.append(seq, 1, kn.data(), vn.data());
    rt::PagedKVCache &cache = session.cache();
    int64_t complete = cache.numCompleteBlocks(seq);
    for (int layer = 0; layer < L; ++layer) {
      std::vector<float> q(H * G * D), out(H * G * D);
      normal.fill(q);
      std::vector<float> mass = session.attentionMass(seq, layer);
      int64_t massBlocks = mass.size() / (H * G);
      std::vector<rt::BlockLists> attended;
      session.decode(layer, {seq}, q.data(), out.data());
      attended = session.selection(layer);
      for (int kh = 0; kh < H; ++kh) {
        interp::IndexInputs in;
        in.numBlocks = complete;
        in.contextLen = cache.length(seq);
        in.step = step;
        in.q = interp::Tensor({"head", "dim"}, {G, D});
        std::copy(q.begin() + kh * G * D, q.begin() + (kh + 1) * G * D,
                  in.q.data.begin());
        for (size_t f = 0; f < flow.fields.size(); ++f) {
          interp::Tensor t;
          t.names.push_back("block");
          t.sizes.push_back(complete);
          for (const rt::ArtifactAxis &a : flow.fields[f].axes) {
            t.names.push_back(a.name);
            t.sizes.push_back(a.size == -3 ? D : a.size);
          }
          t.data = cache.gatherField(seq, int(f), layer, kh);
          in.fields[flow.fields[f].name] = t;
        }
        in.mass = interp::Tensor({"block", "head"}, {complete, G});
        for (int64_t b = 0; b < std::min(complete, massBlocks); ++b)
          for (int j = 0; j < G; ++j)
            in.mass.data[b * G + j] = mass[(kh * massBlocks + b) * G + j];
        interp::StateValues &st = states[layer][kh];
        if (st.empty())
          st = oracle->initialStates(complete);
        oracle->growStates(st, complete);
        interp::Selection sel = oracle->runIndexStage(in, st);
        std::vector<int64_t> want = oracle->finalBlocks(sel, complete);
        if (cache.numBlocks(seq) > complete)
          want.push_back(complete);
        std::vector<int64_t> got = attended[0][kh];
        EXPECT_EQ(got, want)
            << "step " << step << " layer " << layer << " kv head " << kh;
      }
    }
  }
  EXPECT_EQ(session.steps(seq, 1), 2 * P + 3);
}

} // namespace

TEST(Session, MatchesTheInterpreter) {
  checkAgainstInterpreter("quest", {{"budget", "4"}});
  checkAgainstInterpreter("h2o", {{"budget", "3"}, {"keep_last", "2"}});
  checkAgainstInterpreter(
      "eps", {{"budget", "2"}, {"keep_last", "1"}, {"block_size", "16"}});
  checkAgainstInterpreter("running_avg", {{"budget", "3"}});
}

TEST(Session, SparseEqualsDenseWhenEveryBlockIsSelected) {
  CompileResult r = compileFile(example("quest"), {{{"budget", "1000"}}, "."});
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::SessionConfig cfg = smallConfig();
  cfg.numLayers = 1;
  rt::HostSession session(r.artifact.flows[0], cfg);
  rt::SeqId seq = session.addSequence();
  std::mt19937 rng(3);
  int64_t n = 100;
  std::vector<float> k(n * 2 * 16), v(k.size()), q(2 * 3 * 16);
  vflow::testing::NormalDraws(rng).fill(k, v, q);
  session.append(seq, n, k.data(), v.data());
  std::vector<float> sparse(q.size()), dense(q.size());
  session.decode(0, {seq}, q.data(), sparse.data());
  rt::denseDecodeAttention(session.cache(), seq, 0, q.data(), 3, 1.0f / 4.0f,
                           dense.data());
  for (size_t i = 0; i < dense.size(); ++i)
    EXPECT_NEAR(sparse[i], dense[i], 1e-5f);
  EXPECT_EQ(session.budget(seq), 6); // every complete block
  session.setParam("budget", 2);
  EXPECT_EQ(session.budget(seq), 2);
  EXPECT_THROW(session.setParam("block_size", 32), rt::Error);
  EXPECT_THROW(session.setParam("budget", 2.5), rt::Error);
  EXPECT_THROW(session.setParam("keep_last", -1), rt::Error);
  EXPECT_THROW(session.setParam("nosuch", 1), rt::Error);
}

// Block-grain eviction through the session: the pages return to the
// pool, the per-block state and the last step's mass lose the evicted
// rows, the position counts the evicted tokens, and attention reads
// exactly the kept tokens (here every block is selected: the output equals
// a sequence that appended only the kept tokens).
TEST(Session, EvictKeepsTheRestExactly) {
  CompileResult r = compileFile(
      example("h2o"), {{{"budget", "1000"}, {"keep_last", "1"}}, "."});
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::SessionConfig cfg = smallConfig();
  rt::HostSession a(r.artifact.flows[0], cfg), b(r.artifact.flows[0], cfg);
  std::mt19937 rng(17);
  const int64_t n = 100, token = 2 * 2 * 16;
  std::vector<float> k(n * token), v(k.size()), q(2 * 3 * 16);
  vflow::testing::NormalDraws(rng).fill(k, v, q);
  rt::SeqId seq = a.addSequence();
  a.append(seq, n, k.data(), v.data());
  std::vector<float> out(q.size()), want(q.size());
  for (int step = 0; step < 2; ++step)
    for (int layer = 0; layer < 2; ++layer)
      a.decode(layer, {seq}, q.data(), out.data());
  const int acc = a.cache().stateIndex("acc");
  const std::vector<float> accBefore = a.cache().readState(seq, acc, 1, 1);
  const std::vector<float> massBefore = a.attentionMass(seq, 1);
  ASSERT_EQ(accBefore.size(), 6u);
  ASSERT_EQ(massBefore.size(), 2u * 7 * 3); // the partial block too
  const int64_t free = a.freePages();

  const std::vector<int64_t> evicted = {1, 4};
  a.evict(seq, evicted);
  EXPECT_EQ(a.length(seq), n - 32);
  EXPECT_EQ(a.position(seq), n);
  EXPECT_EQ(a.freePages(), free + 2);
  EXPECT_EQ(a.cache().readState(seq, acc, 1, 1),
            (std::vector<float>{accBefore[0], accBefore[2], accBefore[3],
                                accBefore[5]}));
  const std::vector<float> mass = a.attentionMass(seq, 1);
  ASSERT_EQ(mass.size(), 2u * 5 * 3);
  const int kept[] = {0, 2, 3, 5, 6};
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 3; ++j)
        EXPECT_EQ(mass[size_t((h * 5 + i) * 3 + j)],
                  massBefore[size_t((h * 7 + kept[i]) * 3 + j)]);

  // The same kept tokens appended by a fresh sequence.
  std::vector<float> keptK, keptV;
  for (int64_t t = 0; t < n; ++t)
    if (t / 16 != 1 && t / 16 != 4) {
      keptK.insert(keptK.end(), k.begin() + t * token,
                   k.begin() + (t + 1) * token);
      keptV.insert(keptV.end(), v.begin() + t * token,
                   v.begin() + (t + 1) * token);
    }
  rt::SeqId fresh = b.addSequence();
  b.append(fresh, n - 32, keptK.data(), keptV.data());
  for (int layer = 0; layer < 2; ++layer) {
    a.decode(layer, {seq}, q.data(), out.data());
    b.decode(layer, {fresh}, q.data(), want.data());
    EXPECT_EQ(out, want) << "layer " << layer;
  }
  // Appending goes on after the kept tokens.
  a.append(seq, 1, k.data(), v.data());
  EXPECT_EQ(a.position(seq), n + 1);
  EXPECT_THROW(a.evict(seq, {2, 2}), rt::Error);
  EXPECT_THROW(a.sharePrefix(seq, 16), rt::Error);
  EXPECT_EQ(a.length(seq), n - 31);
}

TEST(Session, MassRecallIsTheDenseMassOfTheAttendedBlocks) {
  CompileResult r = compileFile(example("quest"), {{{"budget", "2"}}, "."});
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::SessionConfig cfg = smallConfig(); // 2 layers, 2 KV heads, group 3
  cfg.denseLayers = 1;
  cfg.massRecall = true;
  rt::HostSession session(r.artifact.flows[0], cfg);
  const int H = cfg.numKVHeads, G = cfg.group, D = cfg.headDim;
  std::mt19937 rng(5);
  vflow::testing::NormalDraws normal(rng);
  std::vector<rt::SeqId> seqs = {session.addSequence(), session.addSequence()};
  for (rt::SeqId seq : seqs) {
    int64_t n = seq == seqs[0] ? 150 : 97;
    std::vector<float> k(n * 2 * H * D), v(k.size());
    normal.fill(k, v);
    session.append(seq, n, k.data(), v.data());
  }
  // By hand: the dense mass of the blocks each list attended.
  std::vector<double> want(size_t(2) * H * G, 0.0);
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<float> q(2 * H * G * D), out(q.size());
    normal.fill(q);
    session.decode(layer, seqs, q.data(), out.data());
    if (layer == 0)
      continue;
    std::vector<rt::BlockLists> lists = session.selection(layer);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int64_t blocks = session.cache().numBlocks(seqs[b]);
      std::vector<float> mass(size_t(H) * blocks * G), o(H * G * D);
      rt::denseDecodeAttention(session.cache(), seqs[b], layer,
                               q.data() + b * H * G * D, G, 0.25f, o.data(),
                               mass.data());
      for (int kh = 0; kh < H; ++kh) {
        EXPECT_LT(lists[b][kh].size(), size_t(blocks)); // a real selection
        for (int j = 0; j < G; ++j)
          for (int64_t blk : lists[b][kh])
            want[size_t(layer) * H * G + kh * G + j] +=
                mass[(size_t(kh) * blocks + blk) * G + j];
      }
    }
  }
  rt::SessionStats stats = session.stats();
  ASSERT_EQ(stats.massRecallSum.size(), want.size());
  EXPECT_EQ(stats.massRecallCount, (std::vector<int64_t>{0, 2}));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(stats.massRecallSum[i], want[i], 1e-5) << i;
    if (i >= size_t(H) * G) { // the sparse layer: a share per sequence
      EXPECT_GT(stats.massRecallSum[i], 0.0);
      EXPECT_LE(stats.massRecallSum[i], 2.0 + 1e-5);
    }
  }
  // Off by default: no sums.
  rt::SessionConfig plain = smallConfig();
  rt::HostSession off(r.artifact.flows[0], plain);
  EXPECT_TRUE(off.stats().massRecallSum.empty());
}

TEST(Session, ObservationWindowSetsTheFirstMass) {
  CompileResult r = compileFile(example("h2o"), {{{"budget", "2"}}, "."});
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  const int H = 2, G = 3, D = 16;
  std::mt19937 rng(8);
  vflow::testing::NormalDraws normal(rng);
  const int64_t n = 75; // 4 complete blocks and a partial one
  std::vector<float> k(n * H * D), v(k.size()), q(n * H * G * D), out(q.size());
  normal.fill(k, v, q);
  // The n tokens appended to a new sequence of `session` and prefilled.
  auto prefillAll = [&](rt::HostSession &session) {
    rt::SeqId seq = session.addSequence();
    session.append(0, {seq}, {n}, rt::Tensor::host(k.data()),
                   rt::Tensor::host(v.data()));
    session.prefill(0, {seq}, {n}, rt::Tensor::host(q.data()),
                    rt::Tensor::host(out.data()));
    return seq;
  };
  for (int window : {1, 5}) {
    SCOPED_TRACE(window);
    rt::SessionConfig cfg = smallConfig();
    cfg.numLayers = 1;
    cfg.observeTokens = window;
    rt::HostSession session(r.artifact.flows[0], cfg);
    rt::SeqId seq = prefillAll(session);
    std::vector<float> got = session.attentionMass(seq, 0);
    ASSERT_EQ(got.size(), size_t(H) * 5 * G);
    // By hand: row i (position i) attends tokens 0..i.
    std::vector<double> want(got.size(), 0.0);
    for (int64_t i = n - window; i < n; ++i)
      for (int kh = 0; kh < H; ++kh)
        for (int j = 0; j < G; ++j) {
          const float *qr = q.data() + ((i * H + kh) * G + j) * D;
          std::vector<double> logit(size_t(i + 1));
          double top = -1e300, sum = 0;
          for (int64_t t = 0; t <= i; ++t) {
            double dot = 0;
            for (int d = 0; d < D; ++d)
              dot += double(qr[d]) *
                     rt::roundToDType(rt::DType::BF16, k[(t * H + kh) * D + d]);
            logit[size_t(t)] = dot * 0.25;
            top = std::max(top, logit[size_t(t)]);
          }
          for (double &l : logit)
            sum += (l = std::exp(l - top));
          for (int64_t t = 0; t <= i; ++t)
            want[(size_t(kh) * 5 + t / 16) * G + j] +=
                logit[size_t(t)] / sum / window;
        }
    for (size_t e = 0; e < got.size(); ++e)
      EXPECT_NEAR(got[e], want[e], 2e-3) << e;
    // The first decode's selection reads it: H2O keeps the two blocks the
    // window paid most to (of the 4 complete ones, first and last kept).
    std::vector<float> qd(H * G * D), od(qd.size());
    normal.fill(qd);
    std::vector<float> kn(H * D), vn(kn.size());
    normal.fill(kn, vn);
    session.append(seq, 1, kn.data(), vn.data());
    session.decode(0, {seq}, qd.data(), od.data());
    EXPECT_FALSE(session.selection(0)[0][0].empty());
  }
  // Off (the default): the first mass is empty.
  rt::SessionConfig cfg = smallConfig();
  cfg.numLayers = 1;
  rt::HostSession off(r.artifact.flows[0], cfg);
  EXPECT_TRUE(off.attentionMass(prefillAll(off), 0).empty());
}

TEST(Session, ErrorsAreClear) {
  CompileResult bad = compileProgram("flow f { index { return x; } }", "x");
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.diagnosticsText.find("unknown name 'x'"), std::string::npos);
  EXPECT_NE(bad.diagnosticsJSON.find("\"errors\":1"), std::string::npos);
  CompileResult ds = compileFile(example("double_sparse"));
  ASSERT_TRUE(ds.ok) << ds.diagnosticsText;
  try {
    rt::HostSession s(ds.artifact.flows[0], smallConfig());
    ADD_FAILURE() << "a head_dim 128 flow ran with head dim 16";
  } catch (const rt::Error &e) {
    EXPECT_NE(std::string(e.what()).find("specialized to head_dim 128"),
              std::string::npos);
  }
  CompileResult q = compileFile(example("quest"));
  rt::HostSession s(q.artifact.flows[0], smallConfig());
  rt::SeqId seq = s.addSequence();
  std::vector<float> buf(2 * 3 * 16);
  EXPECT_THROW(s.decode(0, {seq}, buf.data(), buf.data()), rt::Error);
  EXPECT_THROW(s.decode(5, {seq}, buf.data(), buf.data()), rt::Error);
}

// A budget that a new param value makes NaN or negative is an error at
// setParam (not "select nothing"), and the old value stays.
TEST(Session, BudgetsMustStayNonNegative) {
  CompileResult r = compileProgram(
      "flow f { param budget = 4; param scale = 1.0; cache kmax = max(K, "
      "token); index { return topk(sum(q * kmax, head, dim), "
      "min(budget * scale, num_blocks)); } }",
      "f.vflow");
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::HostSession s(r.artifact.flows[0], smallConfig());
  rt::SeqId seq = s.addSequence();
  std::vector<float> k(40 * 2 * 16, 0.5f);
  s.append(seq, 40, k.data(), k.data());
  try {
    s.setParam("budget", -3);
    ADD_FAILURE() << "a negative budget was accepted";
  } catch (const rt::Error &e) {
    EXPECT_NE(std::string(e.what()).find("is -3 at num_blocks"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("a budget must be a number >= 0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.param("budget"), 4);
  EXPECT_THROW(s.setParam("scale", std::nan("")), rt::Error);
  EXPECT_THROW(s.setParam("scale", -1), rt::Error);
  EXPECT_EQ(s.param("scale"), 1.0);
  s.setParam("budget", 0); // zero is a budget: select nothing
  EXPECT_EQ(s.budget(seq), 0);
}

// `layer` and `kv_head` are the model's indices: budgets per layer and KV
// head (the session's list bound is the largest), and scores that differ
// by KV head, on a tensor-parallel slice (firstKVHead) with a dense first
// layer.
TEST(Session, LayerAndKVHeadAreTheModelsIndices) {
  CompileResult r = compileProgram(
      "flow f { param budget = 12; param keep_first = 0; param keep_last = "
      "0; cache kmax = max(K, token); index { let s = max(sum(q * kmax, "
      "dim), head); return topk(where(kv_head == 3, position, -position) + "
      "s * 0, max(1, budget - 4 * layer) + kv_head); } }",
      "f.vflow");
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::SessionConfig cfg = vflow::testing::sessionConfig(
      3, 2, 2, 16, 512, ::testing::TempDir() + "/vflow-session-jit");
  cfg.denseLayers = 1;
  cfg.firstKVHead = 2; // this slice holds the model's KV heads 2 and 3
  rt::HostSession s(r.artifact.flows[0], cfg);
  rt::SeqId seq = s.addSequence();
  const int64_t blocks = 40;
  std::vector<float> k(blocks * 16 * 3 * 2 * 16, 0.25f);
  s.append(seq, blocks * 16, k.data(), k.data());
  // The bound: layer 1 (12 - 4 = 8) plus KV head 3.
  EXPECT_EQ(s.budget(seq), 8 + 3);
  std::vector<float> q(2 * 2 * 16, 0.5f), out(q.size());
  for (int layer = 1; layer < 3; ++layer) {
    s.decode(layer, {seq}, q.data(), out.data());
    const rt::BlockLists lists = s.selection(layer).at(0);
    ASSERT_EQ(lists.size(), 2u);
    for (int h = 0; h < 2; ++h) {
      const int64_t kvHead = 2 + h;
      const int64_t k = std::max(1, 12 - 4 * layer) + kvHead;
      SCOPED_TRACE("layer " + std::to_string(layer) + ", KV head " +
                   std::to_string(kvHead));
      std::vector<int64_t> want;
      // KV head 3 takes the latest blocks, KV head 2 the earliest.
      for (int64_t j = 0; j < k; ++j)
        want.push_back(kvHead == 3 ? blocks - k + j : j);
      EXPECT_EQ(lists[size_t(h)], want);
    }
  }
  // A budget that a param makes negative at one of the session's layers
  // is refused, naming the layer; the old value stays.
  CompileResult shrink = compileProgram(
      "flow g { param budget = 600; cache kmax = max(K, token); index { "
      "return topk(max(sum(q * kmax, dim), head), budget - 4 * layer); } }",
      "g.vflow");
  ASSERT_TRUE(shrink.ok) << shrink.diagnosticsText;
  rt::HostSession g(shrink.artifact.flows[0], cfg);
  g.setParam("budget", 8); // 0 at layer 2
  try {
    g.setParam("budget", 7);
    ADD_FAILURE() << "a budget negative at layer 2 was accepted";
  } catch (const rt::Error &e) {
    EXPECT_NE(std::string(e.what()).find("is -1 at num_blocks = 0, "
                                         "context_len = 0, layer = 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(g.param("budget"), 8);
  rt::SessionConfig negativeHead = cfg;
  negativeHead.firstKVHead = -1;
  EXPECT_THROW(rt::HostSession(r.artifact.flows[0], negativeHead), rt::Error);
}

// A prefix hit is exact: a sequence that shares another's prompt
// (sharePrefix) decodes the same selections and outputs as one that
// appended the prompt itself, for a stateful flow (H2O's accumulated mass)
// as for a stateless one; the parent is left as it was.
TEST(Session, SharedPrefixEqualsACopiedPrompt) {
  for (const char *name : {"h2o", "quest"}) {
    SCOPED_TRACE(name);
    CompileResult r = compileFile(
        example(name),
        {{{"budget", "3"}, {"block_size", "16"}, {"keep_last", "1"}}, "."});
    ASSERT_TRUE(r.ok) << r.diagnosticsText;
    rt::SessionConfig cfg = smallConfig();
    rt::HostSession s(r.artifact.flows[0], cfg);
    const size_t token = size_t(cfg.numLayers) * cfg.numKVHeads * cfg.headDim;
    const size_t row = size_t(cfg.numKVHeads) * cfg.group * cfg.headDim;
    std::mt19937 rng(5);
    vflow::testing::NormalDraws normal(rng);
    const int64_t prompt = 160, extra = 7; // 10 shared blocks, then more
    std::vector<float> k = normal.take(prompt * token),
                       v = normal.take(prompt * token);
    rt::SeqId parent = s.addSequence();
    s.append(parent, prompt, k.data(), v.data());
    // The parent decodes a few steps first, from an attention mass that
    // favours blocks 5-7 (as if its prompt had paid them the most), so its
    // states (H2O's acc) move away from their initial values.
    const int64_t blocks = prompt / 16;
    std::vector<float> mass(size_t(cfg.numKVHeads * blocks * cfg.group), 0.0f);
    for (int h = 0; h < cfg.numKVHeads; ++h)
      for (int64_t b = 5; b < 8; ++b)
        for (int g = 0; g < cfg.group; ++g)
          mass[size_t((h * blocks + b) * cfg.group + g)] = 1.0f;
    for (int l = 0; l < cfg.numLayers; ++l)
      s.setAttentionMass(parent, l, mass);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> kn = normal.take(token), vn = normal.take(token);
      s.append(parent, 1, kn.data(), vn.data());
      for (int l = 0; l < cfg.numLayers; ++l) {
        std::vector<float> q = normal.take(row), out(row);
        s.decode(l, {parent}, q.data(), out.data());
      }
    }
    rt::SeqId hit = s.sharePrefix(parent, prompt);
    rt::SeqId cold = s.addSequence();
    s.append(cold, prompt, k.data(), v.data());
    std::vector<float> ke = normal.take(extra * token),
                       ve = normal.take(extra * token);
    s.append(hit, extra, ke.data(), ve.data());
    s.append(cold, extra, ke.data(), ve.data());
    for (int step = 0; step < 20; ++step) {
      std::vector<float> kn = normal.take(token), vn = normal.take(token);
      s.append(hit, 1, kn.data(), vn.data());
      s.append(cold, 1, kn.data(), vn.data());
      for (int l = 0; l < cfg.numLayers; ++l) {
        std::vector<float> q = normal.take(row), q2 = q;
        q2.insert(q2.end(), q.begin(), q.end());
        std::vector<float> out(2 * row);
        s.decode(l, {hit, cold}, q2.data(), out.data());
        std::vector<rt::BlockLists> sel = s.selection(l);
        ASSERT_EQ(sel.at(0), sel.at(1)) << "step " << step << " layer " << l;
        for (size_t i = 0; i < row; ++i)
          ASSERT_EQ(out[i], out[row + i]) << "step " << step << " at " << i;
      }
    }
    EXPECT_EQ(s.length(parent), prompt + 3);
    EXPECT_THROW(s.sharePrefix(parent, 10), rt::Error);
  }
}

// Layer by layer (append(layer, ...) then decode(layer, ...), as a model
// runs) gives the same selections and outputs as appending every layer at
// once, with bf16 tensors as with f32; a decode before its layer holds
// every token is a clear error, and so are host/device mix-ups.
TEST(Session, LayerByLayerEqualsAllLayersAtOnce) {
  CompileResult r = compileFile(
      example("h2o"),
      {{{"budget", "3"}, {"block_size", "16"}, {"keep_last", "1"}}, "."});
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::SessionConfig cfg = smallConfig();
  const int L = cfg.numLayers;
  const size_t row = size_t(cfg.numKVHeads) * cfg.headDim;
  const size_t qrow = row * size_t(cfg.group);
  rt::HostSession whole(r.artifact.flows[0], cfg),
      layered(r.artifact.flows[0], cfg);
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  auto draw = [&](size_t n) {
    std::vector<float> x(n);
    for (float &e : x)
      e = rt::roundToDType(rt::DType::BF16, normal(rng));
    return x;
  };
  auto bf16 = [](const std::vector<float> &x) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      out[i] = rt::floatToBF16(x[i]);
    return out;
  };
  // [tokens, layers, H, D] -> layer l's [tokens, H, D].
  auto layerOf = [&](const std::vector<float> &x, size_t tokens, int l) {
    std::vector<float> out;
    for (size_t t = 0; t < tokens; ++t)
      out.insert(out.end(), x.begin() + (t * L + l) * row,
                 x.begin() + (t * L + l + 1) * row);
    return out;
  };
  // Two sequences, prompts of 50 and 37 tokens in one call per layer.
  std::vector<rt::SeqId> w = {whole.addSequence(), whole.addSequence()};
  std::vector<rt::SeqId> y = {layered.addSequence(), layered.addSequence()};
  const std::vector<int64_t> prompt = {50, 37};
  std::vector<float> k = draw(87 * L * row), v = draw(87 * L * row);
  whole.append(w, prompt, k.data(), v.data());
  for (int l = 0; l < L; ++l) {
    // This layer's K/V as bf16.
    std::vector<uint16_t> kb = bf16(layerOf(k, 87, l)),
                          vb = bf16(layerOf(v, 87, l));
    layered.append(l, y, prompt, {kb.data(), rt::DType::BF16, rt::Device::Cpu},
                   {vb.data(), rt::DType::BF16, rt::Device::Cpu});
  }
  for (int step = 0; step < 12; ++step) {
    std::vector<float> kn = draw(2 * L * row), vn = draw(2 * L * row);
    whole.append(w, {1, 1}, kn.data(), vn.data());
    for (int l = 0; l < L; ++l) {
      std::vector<float> kl = layerOf(kn, 2, l), vl = layerOf(vn, 2, l);
      if (l == 0 && step == 0) {
        // Layer 1 has not got the new token yet.
        layered.append(0, y, {1, 1}, rt::Tensor::host(kl.data()),
                       rt::Tensor::host(vl.data()));
        std::vector<float> q(2 * qrow), o(2 * qrow);
        try {
          layered.decode(1, y, q.data(), o.data());
          ADD_FAILURE() << "a decode ran before its layer held every token";
        } catch (const rt::Error &e) {
          EXPECT_NE(std::string(e.what()).find(
                        "has 51 tokens but layer 1 holds the K/V of 50"),
                    std::string::npos)
              << e.what();
        }
      } else {
        layered.append(l, y, {1, 1}, rt::Tensor::host(kl.data()),
                       rt::Tensor::host(vl.data()));
      }
      std::vector<float> q = draw(2 * qrow), o1(2 * qrow), o2(2 * qrow);
      whole.decode(l, w, q.data(), o1.data());
      std::vector<uint16_t> qb = bf16(q), ob(2 * qrow);
      layered.decode(l, y, {qb.data(), rt::DType::BF16, rt::Device::Cpu},
                     {ob.data(), rt::DType::BF16, rt::Device::Cpu});
      ASSERT_EQ(whole.selection(l), layered.selection(l))
          << "step " << step << " layer " << l;
      for (size_t i = 0; i < o1.size(); ++i)
        ASSERT_EQ(rt::roundToDType(rt::DType::BF16, o1[i]),
                  rt::bf16ToFloat(ob[i]))
            << "step " << step << " layer " << l << " at " << i;
    }
  }
  EXPECT_EQ(whole.length(w[0]), layered.length(y[0]));
  EXPECT_EQ(whole.stats().blocksAttended, layered.stats().blocksAttended);
  // Each sequence's counts: the same in both sessions, adding up to the
  // session's.
  rt::SequenceStats sum;
  for (size_t i = 0; i < w.size(); ++i) {
    const rt::SequenceStats a = whole.sequenceStats(w[i]),
                            b = layered.sequenceStats(y[i]);
    EXPECT_EQ(a.blocksAttended, b.blocksAttended);
    EXPECT_EQ(a.listsAttended, b.listsAttended);
    EXPECT_EQ(a.blocksAvailable, b.blocksAvailable);
    EXPECT_GT(a.blocksAttended, 0);
    EXPECT_LE(a.blocksAttended, a.blocksAvailable);
    sum.blocksAttended += a.blocksAttended;
    sum.listsAttended += a.listsAttended;
    sum.blocksAvailable += a.blocksAvailable;
  }
  EXPECT_EQ(sum.blocksAttended, whole.stats().blocksAttended);
  EXPECT_EQ(sum.listsAttended, whole.stats().listsAttended);
  EXPECT_EQ(sum.blocksAvailable, whole.stats().blocksAvailable);
  // Mix-ups are errors that name the argument.
  std::vector<float> buf(qrow);
  EXPECT_THROW(layered.decode(0, {y[0]},
                              {buf.data(), rt::DType::F32, rt::Device::Cuda},
                              rt::Tensor::host(buf.data())),
               rt::Error);
  EXPECT_THROW(layered.append(0, {y[0], y[0]}, {1, 1},
                              rt::Tensor::host(buf.data()),
                              rt::Tensor::host(buf.data())),
               rt::Error);
  EXPECT_THROW(layered.append(0, {y[0]}, {1, 2}, rt::Tensor::host(buf.data()),
                              rt::Tensor::host(buf.data())),
               rt::Error);
  EXPECT_THROW(layered.append(3, {y[0]}, {1}, rt::Tensor::host(buf.data()),
                              rt::Tensor::host(buf.data())),
               rt::Error);
}

namespace {

/// float64 causal attention of rows [first, n) of one sequence's queries
/// ([n, H * G, D]) over its K/V ([n, H, D]).
std::vector<double> causalReference(const std::vector<float> &q,
                                    const std::vector<float> &k,
                                    const std::vector<float> &v, int64_t n,
                                    int64_t first, int H, int G, int D) {
  std::vector<double> out(size_t((n - first) * H * G * D));
  for (int64_t i = first; i < n; ++i)
    for (int h = 0; h < H; ++h)
      for (int g = 0; g < G; ++g) {
        const float *qr = &q[size_t(((i * H + h) * G + g) * D)];
        std::vector<double> s(size_t(i + 1));
        double top = -1e300, sum = 0;
        for (int64_t t = 0; t <= i; ++t) {
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += double(qr[d]) * k[size_t((t * H + h) * D + d)];
          s[size_t(t)] = dot / std::sqrt(double(D));
          top = std::max(top, s[size_t(t)]);
        }
        for (double &x : s)
          sum += (x = std::exp(x - top));
        double *o = &out[size_t((((i - first) * H + h) * G + g) * D)];
        for (int64_t t = 0; t <= i; ++t)
          for (int d = 0; d < D; ++d)
            o[d] += s[size_t(t)] / sum * v[size_t((t * H + h) * D + d)];
      }
  return out;
}

} // namespace

TEST(Session, PrefillIsCausalAndDenseLayersAttendEveryBlock) {
  CompileResult r = compileFile(example("quest"), {{{"budget", "1"}}, "."});
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::SessionConfig cfg = smallConfig(); // 2 layers, H 2, G 3, D 16
  cfg.denseLayers = 1;
  const int H = cfg.numKVHeads, G = cfg.group, D = cfg.headDim;
  rt::HostSession session(r.artifact.flows[0], cfg);
  rt::SeqId seq = session.addSequence();
  std::mt19937 rng(21);
  const int64_t n = 70;
  std::vector<float> k(size_t(n * H * D)), v(k.size()),
      q(size_t(n * H * G * D));
  vflow::testing::NormalDraws(rng).fill(k, v, q);
  for (std::vector<float> *x : {&k, &v, &q})
    for (float &e : *x)
      e = rt::roundToDType(rt::DType::BF16, e); // the cache stores bf16
  for (int l = 0; l < 2; ++l)
    session.append(l, {seq}, {n}, rt::Tensor::host(k.data()),
                   rt::Tensor::host(v.data()));
  // The whole prompt, then its last 5 rows (a chunk): causal, dense.
  std::vector<float> out(q.size());
  session.prefill(1, {seq}, {n}, rt::Tensor::host(q.data()),
                  rt::Tensor::host(out.data()));
  std::vector<double> want = causalReference(q, k, v, n, 0, H, G, D);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(out[i], want[i], 1e-4) << "at " << i;
  const size_t row = size_t(H) * G * D;
  std::vector<float> tail(5 * row);
  session.prefill(1, {seq}, {5}, rt::Tensor::host(q.data() + (n - 5) * row),
                  rt::Tensor::host(tail.data()));
  for (size_t i = 0; i < tail.size(); ++i)
    ASSERT_FLOAT_EQ(tail[i], out[(n - 5) * row + i]);
  EXPECT_THROW(session.prefill(1, {seq}, {n + 1}, rt::Tensor::host(q.data()),
                               rt::Tensor::host(out.data())),
               rt::Error);
  // Decode: layer 0 is dense (every block), layer 1 runs Quest (budget 1).
  std::vector<float> qd(row), od(row);
  vflow::testing::NormalDraws(rng).fill(qd);
  session.decode(0, {seq}, qd.data(), od.data());
  session.decode(1, {seq}, qd.data(), od.data());
  std::vector<int64_t> all = {0, 1, 2, 3, 4};
  EXPECT_EQ(session.selection(0)[0], rt::BlockLists(size_t(H), all));
  std::vector<rt::BlockLists> sparse = session.selection(1);
  for (const std::vector<int64_t> &list : sparse[0])
    EXPECT_LT(list.size(), all.size());
  EXPECT_THROW(
      {
        rt::SessionConfig bad = cfg;
        bad.denseLayers = -1;
        rt::HostSession(r.artifact.flows[0], bad);
      },
      rt::Error);
}

TEST(Session, DenseFlowNeedsNoCompiler) {
  rt::SessionConfig cfg = smallConfig();
  cfg.denseLayers = cfg.numLayers;
  cfg.jit.compiler = "/nonexistent/c++"; // nothing is compiled
  std::unique_ptr<rt::Session> s = rt::openSession(rt::denseFlow(16), cfg);
  rt::SeqId seq = s->addSequence();
  std::mt19937 rng(5);
  const int64_t n = 40;
  const size_t kv = size_t(n) * cfg.numLayers * cfg.numKVHeads * cfg.headDim;
  std::vector<float> k(kv), v(kv),
      q(size_t(cfg.numKVHeads) * cfg.group * cfg.headDim), out(q.size()),
      want(q.size());
  vflow::testing::NormalDraws(rng).fill(k, v, q);
  s->append(seq, n, k.data(), v.data());
  s->decode(1, {seq}, q.data(), out.data());
  auto &host = dynamic_cast<rt::HostSession &>(*s);
  rt::denseDecodeAttention(host.cache(), seq, 1, q.data(), cfg.group,
                           1.0f / std::sqrt(float(cfg.headDim)), want.data());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_FLOAT_EQ(out[i], want[i]);
  EXPECT_EQ(s->budget(seq), 2);
  EXPECT_THROW(s->setParam("budget", 4), rt::Error);
}

/// A flow with cache fields and states, dense at every layer
/// (denseLayers >= numLayers, as vflow.LLM's default dense_layers=2 on a
/// 2-layer model): no field or state is kept and every layer attends
/// densely, exactly as the dense flow does (the session crashed while it
/// was built, walking the fields through a CPU flow it never compiled).
TEST(Session, FlowWithFieldsDenseAtEveryLayer) {
  rt::SessionConfig cfg = smallConfig();
  for (int dense : {cfg.numLayers, cfg.numLayers + 3}) {
    cfg.denseLayers = dense;
    for (const char *name : {"quest", "h2o", "eps"}) {
      SCOPED_TRACE(name);
      CompileResult r = compileFile(example(name), {{}, VFLOW_EXAMPLES_DIR});
      ASSERT_TRUE(r.ok) << r.diagnosticsText;
      ASSERT_FALSE(r.artifact.flows[0].fields.empty() &&
                   r.artifact.flows[0].states.empty());
      std::unique_ptr<rt::Session> s =
          rt::openSession(r.artifact.flows[0], cfg);
      std::unique_ptr<rt::Session> d =
          rt::openSession(rt::denseFlow(r.artifact.flows[0].blockSize), cfg);
      std::mt19937 rng(17);
      const int64_t n = 53;
      const size_t kv =
          size_t(n) * cfg.numLayers * cfg.numKVHeads * cfg.headDim;
      std::vector<float> k(kv), v(kv),
          q(size_t(cfg.numKVHeads) * cfg.group * cfg.headDim), a(q.size()),
          b(q.size());
      vflow::testing::NormalDraws(rng).fill(k, v, q);
      rt::SeqId x = s->addSequence(), y = d->addSequence();
      s->append(x, n, k.data(), v.data());
      d->append(y, n, k.data(), v.data());
      for (int l = 0; l < cfg.numLayers; ++l) {
        s->decode(l, {x}, q.data(), a.data());
        d->decode(l, {y}, q.data(), b.data());
        for (size_t i = 0; i < a.size(); ++i)
          ASSERT_EQ(a[i], b[i]) << "layer " << l << " element " << i;
      }
    }
  }
}

/// A budget that is NaN only between the lengths the checker samples (here
/// at context_len = 100) is refused when a step reaches that length, naming
/// the budget and the length, before anything of the step runs (it selected
/// nothing, silently). Lengths around it decode.
TEST(Session, BudgetCheckedAtEveryRowsLength) {
  const std::string source =
      "flow nanat100 {\n"
      "  param budget = 4;\n"
      "  cache kmax = max(K, token);\n"
      "  index {\n"
      "    let s = sum(q * kmax, dim);\n"
      "    return topk(max(s, head), budget * (context_len - 100) / "
      "(context_len - 100));\n"
      "  }\n"
      "}\n";
  CompileResult r = compileProgram(source, "nanat100.vflow", {});
  ASSERT_TRUE(r.ok) << r.diagnosticsText;
  rt::SessionConfig cfg = smallConfig();
  cfg.denseLayers = 1;
  std::unique_ptr<rt::Session> s = rt::openSession(r.artifact.flows[0], cfg);
  rt::SeqId seq = s->addSequence();
  std::mt19937 rng(9);
  const size_t token = size_t(cfg.numLayers) * cfg.numKVHeads * cfg.headDim;
  std::vector<float> k(99 * token), v(k.size()),
      q(size_t(cfg.numKVHeads) * cfg.group * cfg.headDim), out(q.size());
  vflow::testing::NormalDraws(rng).fill(k, v, q);
  s->append(seq, 99, k.data(), v.data());
  s->decode(1, {seq}, q.data(), out.data()); // length 99
  s->append(seq, 1, k.data(), v.data());     // length 100
  try {
    s->decode(1, {seq}, q.data(), out.data());
    FAIL() << "a NaN budget at context_len 100 was not refused";
  } catch (const rt::Error &e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("is NaN at num_blocks = 6, context_len = 100"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("budget = 4"), std::string::npos) << m;
  }
  // The first layer is dense: no budget there.
  EXPECT_NO_THROW(s->decode(0, {seq}, q.data(), out.data()));
  s->append(seq, 1, k.data(), v.data()); // length 101
  EXPECT_NO_THROW(s->decode(1, {seq}, q.data(), out.data()));
}

/// A step padded past its sequences (beginStep's `rows`) computes them as
/// an unpadded step does; its key is the padded row count; more rows than
/// maxBatch are refused.
TEST(Session, PaddedStepComputesItsSequences) {
  rt::SessionConfig cfg = smallConfig();
  cfg.denseLayers = cfg.numLayers;
  cfg.maxBatch = 4;
  std::unique_ptr<rt::Session> plain = rt::openSession(rt::denseFlow(16), cfg);
  std::unique_ptr<rt::Session> padded = rt::openSession(rt::denseFlow(16), cfg);
  std::mt19937 rng(11);
  const size_t token = size_t(cfg.numLayers) * cfg.numKVHeads * cfg.headDim;
  std::vector<rt::SeqId> a, b;
  for (int64_t n : {37, 5}) {
    std::vector<float> k(size_t(n) * token), v(k.size());
    vflow::testing::NormalDraws(rng).fill(k, v);
    a.push_back(plain->addSequence());
    b.push_back(padded->addSequence());
    plain->append(a.back(), n, k.data(), v.data());
    padded->append(b.back(), n, k.data(), v.data());
  }
  const int64_t rows = 4;
  const size_t qRow = size_t(cfg.numKVHeads) * cfg.group * cfg.headDim,
               kvRow = size_t(cfg.numKVHeads) * cfg.headDim;
  EXPECT_EQ(plain->beginStep(a).rows, 2);
  EXPECT_EQ(padded->beginStep(b, rows).rows, rows);
  for (int l = 0; l < cfg.numLayers; ++l) {
    std::vector<float> q(rows * qRow), k(rows * kvRow), v(k.size()),
        out1(q.size(), 0.0f), out2(q.size(), 0.0f);
    vflow::testing::NormalDraws(rng).fill(q, k, v);
    plain->stepLayer(l, rt::Tensor::host(q.data()), rt::Tensor::host(k.data()),
                     rt::Tensor::host(v.data()), rt::Tensor::host(out1.data()));
    padded->stepLayer(l, rt::Tensor::host(q.data()), rt::Tensor::host(k.data()),
                      rt::Tensor::host(v.data()),
                      rt::Tensor::host(out2.data()));
    for (size_t i = 0; i < 2 * qRow; ++i)
      ASSERT_EQ(out1[i], out2[i]) << "layer " << l << " element " << i;
  }
  plain->endStep();
  padded->endStep();
  EXPECT_EQ(padded->length(b[0]), 38);
  EXPECT_THROW(padded->beginStep(b, 5), rt::Error);
  EXPECT_THROW(padded->beginStep(b, -1), rt::Error);
}
