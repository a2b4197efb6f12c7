//===- EngineTest.cpp - The serving engine on the CPU ---------------------===//
//
// vflow::model::Engine on a tiny random Llama (2 layers, hidden 64, 4 heads
// over 2 KV heads of 16, vocabulary 100) that the suite writes as
// safetensors + config.json: what the engine's scheduling must not change
// (continuous batching, chunked prefill, preemption and recompute, prefix
// hits, seeded sampling), that no page leaks, abort, and requests that
// cannot run. The C++ side of tests/python/test_engine.py.
//
// Every comparison is between real outputs: runs of the engine under
// different schedules, and a reference that feeds the model one token at a
// time through a ModelRunner of its own. The reference also checks that
// every greedy step it compares has a clear winner (a top-2 logit margin
// above kMinMargin, far above the f32 rounding that differs between batch
// shapes), so equality is what a correct engine gives, not luck.
//
// The CPU runner needs CBLAS: without it the tests skip. The H2O variant of
// the prefix test needs the artifact vflowc writes at build time
// (tests/compiler/stock.vfa, target vflow-stock-artifact): it skips when
// the build has no compiler or the artifact is not built yet.
//
//===----------------------------------------------------------------------===//

#include "ModelTestUtil.h"

#include "../common/Random.h"

#include "vflow/Engine/Engine.h"
#include "vflow/Model/Runner.h"
#include "vflow/Model/Weights.h"
#include "vflow/Runtime/Artifact.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::test;
using vflow::rt::Json;

namespace {

constexpr int64_t kVocab = 100;
constexpr int32_t kEos = 2;
constexpr int64_t kMaxPositions = 256;
constexpr int64_t kBlock = 16;
/// The smallest top-2 logit gap a compared greedy step may have.
constexpr double kMinMargin = 1e-3;

using Prompt = std::vector<int32_t>;
using Tokens = std::vector<int32_t>;

ModelConfig engineModel() {
  ModelConfig c = shapedConfig(
      "llama", {kVocab, /*hiddenSize=*/64, /*intermediateSize=*/128,
                /*numLayers=*/2, /*numHeads=*/4, /*numKVHeads=*/2,
                /*headDim=*/16});
  c.maxPositions = kMaxPositions;
  c.tieEmbeddings = false;
  return c;
}

/// Writes config.json and model.safetensors (F32) of a random model of
/// config `c`, scaled as tests/python/tiny_model.py does so that logits
/// spread over a few units and greedy decoding does not collapse. The
/// tensor named `poison` (if any) gets a NaN.
void writeRandomModel(const TempDir &dir, const ModelConfig &c, unsigned seed,
                      const std::string &poison = "") {
  Json j = hfConfig(c, kEos);
  Json archs = Json::array();
  archs.push("LlamaForCausalLM");
  j.set("architectures", std::move(archs));
  j.set("hidden_act", "silu");
  writeFile(dir.path("config.json"), j.dump());

  std::mt19937 rng(seed);
  vflow::testing::NormalDraws<std::mt19937> normal(rng);
  auto endsWith = [](const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() &&
           s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  SafetensorsWriter w;
  for (const TensorSpec &t : modelTensors(c)) {
    std::vector<float> v = normal.take(size_t(count(t.shape)));
    const float fanIn = float(t.shape.back());
    float scale = 1.0f / std::sqrt(fanIn), shift = 0.0f;
    if (t.name == "model.embed_tokens.weight")
      scale = 0.05f;
    else if (t.name == "lm_head.weight")
      scale = 0.5f;
    else if (endsWith(t.name, "norm.weight"))
      scale = 0.1f, shift = 1.0f;
    else if (endsWith(t.name, "o_proj.weight") ||
             endsWith(t.name, "down_proj.weight"))
      scale = 2.0f / std::sqrt(fanIn);
    for (float &x : v)
      x = shift + scale * x;
    if (t.name == poison)
      v[v.size() / 2] = std::nanf("");
    w.addFloats(t.name, "F32", t.shape, v);
  }
  writeFile(dir.path("model.safetensors"), w.build());
}

/// A fixed random prompt of ordinary ids (3 .. kVocab-1: no BOS or EOS).
Prompt makePrompt(int64_t length, unsigned salt) {
  std::mt19937 rng(1000u + 7919u * salt + unsigned(length));
  std::uniform_int_distribution<int32_t> id(3, int32_t(kVocab - 1));
  Prompt p(static_cast<size_t>(length));
  for (int32_t &t : p)
    t = id(rng);
  return p;
}

SamplingParams greedy(int64_t maxTokens = 12) {
  SamplingParams p;
  p.maxTokens = maxTokens;
  p.temperature = 0;
  p.ignoreEos = true;
  return p;
}

SamplingParams sampled(uint64_t seed, int64_t maxTokens = 16) {
  SamplingParams p;
  p.maxTokens = maxTokens;
  p.temperature = 0.8;
  p.topP = 0.9;
  p.topK = 20;
  p.seed = seed;
  p.ignoreEos = true;
  return p;
}

/// An engine config on the CPU with f32 K/V (so batch shapes change
/// nothing but f32 rounding), blocks of 16 and `pages` pages.
EngineConfig engineConfig(int64_t pages = 512) {
  EngineConfig cfg;
  cfg.runner.device = rt::Device::Cpu;
  cfg.runner.kvDType = rt::DType::F32;
  cfg.runner.blockSize = kBlock;
  cfg.kvPoolTokens = pages * kBlock;
  cfg.runner.cacheDir = ::testing::TempDir() + "/vflow-engine-jit";
  cfg.maxBatch = 16;
  return cfg;
}

/// Steps `e` until nothing is unfinished (a failure, not a hang, after
/// `maxSteps`); the outputs by request id.
std::map<int64_t, RequestOutput> drain(Engine &e, int64_t maxSteps = 5000) {
  std::map<int64_t, RequestOutput> done;
  for (int64_t s = 0; e.hasUnfinished(); ++s) {
    if (s == maxSteps) {
      EngineStats st = e.stats();
      ADD_FAILURE() << "requests still unfinished after " << maxSteps
                    << " steps: " << st.running << " running, " << st.waiting
                    << " waiting, " << st.pagesUsed << "/" << st.pagesTotal
                    << " pages used, " << st.preemptions << " preemptions";
      break;
    }
    for (RequestOutput &o : e.step()) {
      EXPECT_EQ(done.count(o.id), 0u) << "request " << o.id << " ended twice";
      done[o.id] = std::move(o);
    }
  }
  return done;
}

/// Adds every prompt with `params`, runs them to the end; outputs in
/// prompt order (empty outputs for any that never ended).
std::vector<RequestOutput> run(Engine &e, const std::vector<Prompt> &prompts,
                               const SamplingParams &params) {
  std::vector<int64_t> ids;
  for (const Prompt &p : prompts)
    ids.push_back(e.addRequest(p, params));
  std::map<int64_t, RequestOutput> done = drain(e);
  std::vector<RequestOutput> out;
  for (int64_t id : ids)
    out.push_back(done.count(id) ? done[id] : RequestOutput());
  return out;
}

std::vector<Tokens> tokensOf(const std::vector<RequestOutput> &outs) {
  std::vector<Tokens> t;
  for (const RequestOutput &o : outs)
    t.push_back(o.tokens);
  return t;
}

/// A request that ended normally with `want` after `prompt`.
void expectOutput(const RequestOutput &o, const Prompt &prompt,
                  const Tokens &want, const std::string &finish = "length") {
  EXPECT_EQ(o.error, "");
  EXPECT_EQ(o.finishReason, finish);
  EXPECT_EQ(o.promptTokens, prompt);
  EXPECT_EQ(o.tokens, want);
}

/// Nothing running or waiting.
void expectIdle(const Engine &e) {
  EngineStats s = e.stats();
  EXPECT_FALSE(e.hasUnfinished());
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
}

class EngineTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    dir = new TempDir;
    writeRandomModel(*dir, engineModel(), 7);
    weights = new ModelWeights(ModelWeights::open(dir->str()));
  }
  static void TearDownTestSuite() {
    delete weights;
    weights = nullptr;
    delete dir;
    dir = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(weights);
    // The CPU runner's GEMMs are CBLAS: a build without it cannot run.
    try {
      RunnerConfig rc = engineConfig(4).runner;
      ModelRunner runner(*weights, nullptr, rc);
      rt::SeqId seq = runner.session().addSequence();
      runner.forwardLogits({seq}, {{3}}, {false});
    } catch (const rt::Error &e) {
      if (std::string(e.what()).find("no BLAS") != std::string::npos)
        GTEST_SKIP() << "the CPU runner has no GEMMs: " << e.what();
      throw;
    }
  }

  /// Sets `out` to the stock artifact's H2O flow (VFLOW_STOCK_ARTIFACT),
  /// or skips the test (out stays null) when this build has none.
  void stockH2O(const rt::FlowArtifact *&out) {
    out = nullptr;
#ifndef VFLOW_STOCK_ARTIFACT
    GTEST_SKIP() << "this build has no compiler to write the H2O artifact";
#else
    if (!std::ifstream(VFLOW_STOCK_ARTIFACT).good())
      GTEST_SKIP() << VFLOW_STOCK_ARTIFACT
                   << " is not built (ninja vflow-stock-artifact)";
    stock = rt::loadArtifact(VFLOW_STOCK_ARTIFACT);
    out = stock.findFlow("h2o");
    EXPECT_TRUE(out) << "the stock artifact has no h2o";
#endif
  }
  rt::Artifact stock;

  /// `n` tokens after `prompt` from a runner of its own, one token a step
  /// (the prompt in one prefill): greedy, with the check that every step's
  /// winner is clear; or, given `sampling`, drawn by the sampling rule
  /// (Sampling.h) with its seed, draw i for the i-th token.
  static Tokens reference(const Prompt &prompt, int64_t n,
                          const SamplingParams *sampling = nullptr) {
    RunnerConfig rc = engineConfig(64).runner;
    ModelRunner runner(*weights, nullptr, rc);
    rt::SeqId seq = runner.session().addSequence();
    Tokens out;
    std::vector<int32_t> feed = prompt;
    bool decode = false;
    double margin = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> logits = runner.forwardLogits({seq}, {feed}, {decode});
      EXPECT_EQ(int64_t(logits.size()), kVocab);
      size_t best = size_t(std::max_element(logits.begin(), logits.end()) -
                           logits.begin());
      float second = -std::numeric_limits<float>::infinity();
      for (size_t v = 0; v < logits.size(); ++v)
        if (v != best)
          second = std::max(second, logits[v]);
      margin = std::min(margin, double(logits[best]) - double(second));
      int32_t next = int32_t(best);
      if (sampling) {
        RowSampling row;
        row.temperature = float(sampling->temperature);
        row.topP = float(sampling->topP);
        row.topK = sampling->topK;
        row.seed = sampling->seed.value();
        row.counter = uint64_t(i);
        next = sampleToken(logits.data(), kVocab, row);
      }
      out.push_back(next);
      feed = {next};
      decode = true;
    }
    if (!sampling) {
      EXPECT_GT(margin, kMinMargin)
          << "test setup: a greedy step after a prompt of " << prompt.size()
          << " tokens has a top-2 margin of " << margin
          << "; pick another prompt or seed (the comparison would hinge on "
             "rounding)";
    }
    return out;
  }

  static TempDir *dir;
  static ModelWeights *weights;
};

TempDir *EngineTest::dir = nullptr;
ModelWeights *EngineTest::weights = nullptr;

// The model is not degenerate: greedy decoding depends on the prompt and
// does not repeat one token (else the comparisons below would prove
// little).
TEST_F(EngineTest, ReferenceIsNotDegenerate) {
  Tokens a = reference(makePrompt(7, 13), 20);
  Tokens b = reference(makePrompt(9, 14), 20);
  EXPECT_GE(std::set<int32_t>(a.begin(), a.end()).size(), 4u);
  EXPECT_NE(a, b);
}

// Prompts of different lengths and max_tokens, some joining while others
// run, at most 16 or at most 3 at a time, equal each prompt run alone (an
// engine of max_batch 1) and the reference.
TEST_F(EngineTest, ContinuousBatchingEqualsOneAtATime) {
  std::vector<Prompt> prompts;
  for (int64_t n : {3, 9, 17, 26, 40, 1})
    prompts.push_back(makePrompt(n, 1));
  const int64_t maxTokens[] = {12, 5, 16, 8, 10, 7};
  std::vector<Tokens> want;
  for (size_t i = 0; i < prompts.size(); ++i)
    want.push_back(reference(prompts[i], maxTokens[i]));

  EngineConfig one = engineConfig();
  one.maxBatch = 1;
  Engine alone(*weights, nullptr, one);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<RequestOutput> o =
        alone.generate({prompts[i]}, greedy(maxTokens[i]));
    ASSERT_EQ(o.size(), 1u);
    expectOutput(o[0], prompts[i], want[i]);
  }
  expectIdle(alone);

  for (int maxBatch : {16, 3}) {
    SCOPED_TRACE("max_batch " + std::to_string(maxBatch));
    EngineConfig cfg = engineConfig();
    cfg.maxBatch = maxBatch;
    Engine e(*weights, nullptr, cfg);
    std::map<int64_t, size_t> index;
    for (size_t i = 0; i < 4; ++i)
      index[e.addRequest(prompts[i], greedy(maxTokens[i]))] = i;
    std::map<int64_t, RequestOutput> done;
    int64_t mostRunning = 0;
    for (int64_t s = 0; e.hasUnfinished() && s < 1000; ++s) {
      if (s == 3) // two more join while the first ones decode
        for (size_t i = 4; i < prompts.size(); ++i)
          index[e.addRequest(prompts[i], greedy(maxTokens[i]))] = i;
      for (RequestOutput &o : e.step())
        done[o.id] = std::move(o);
      mostRunning = std::max(mostRunning, e.stats().running);
    }
    ASSERT_EQ(done.size(), prompts.size());
    for (auto &[id, i] : index)
      expectOutput(done[id], prompts[i], want[i]);
    EXPECT_LE(mostRunning, maxBatch);
    EXPECT_GE(mostRunning, 3); // it did batch
    expectIdle(e);
    e.clearPrefixCache();
    EXPECT_EQ(e.stats().pagesUsed, 0);
  }

  // generate() returns outputs in prompt order.
  Engine e(*weights, nullptr, engineConfig());
  std::vector<RequestOutput> outs = e.generate(prompts, greedy(12));
  ASSERT_EQ(outs.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    expectOutput(outs[i], prompts[i], reference(prompts[i], 12));
}

// Prompts fed a few tokens a step (chunks that split blocks, several
// requests sharing one step's budget) give the tokens of whole prompts.
TEST_F(EngineTest, ChunkedPrefillEqualsUnchunked) {
  std::vector<Prompt> prompts = {makePrompt(40, 1), makePrompt(17, 0),
                                 makePrompt(33, 2)};
  Engine whole(*weights, nullptr, engineConfig());
  std::vector<RequestOutput> base = run(whole, prompts, greedy());
  for (size_t i = 0; i < prompts.size(); ++i)
    expectOutput(base[i], prompts[i], reference(prompts[i], 12));
  for (int64_t budget : {8, 5, 1}) {
    SCOPED_TRACE("max_tokens_per_step " + std::to_string(budget));
    EngineConfig cfg = engineConfig();
    cfg.maxTokensPerStep = budget;
    Engine chunked(*weights, nullptr, cfg);
    std::vector<int64_t> ids;
    for (const Prompt &p : prompts)
      ids.push_back(chunked.addRequest(p, greedy()));
    // No step computes more than the budget.
    std::map<int64_t, RequestOutput> done;
    int64_t computed = 0;
    for (int s = 0; chunked.hasUnfinished() && s < 1000; ++s) {
      for (RequestOutput &o : chunked.step())
        done[o.id] = std::move(o);
      const int64_t now = chunked.stats().tokensComputed;
      EXPECT_LE(now - computed, budget) << "step " << s;
      computed = now;
    }
    for (size_t i = 0; i < prompts.size(); ++i)
      expectOutput(done[ids[i]], prompts[i], base[i].tokens);
    EXPECT_EQ(chunked.stats().tokensComputed, whole.stats().tokensComputed);
    EXPECT_GT(chunked.stats().steps, whole.stats().steps); // it did chunk
    expectIdle(chunked);
  }
}

// A pool of 4 pages of 16 tokens; 4 requests of 6 prompt + 36 new tokens
// (3 pages each: each fits alone, all 4 need 12). They are preempted and
// recomputed, with the tokens of a large pool; with prefix caching on too
// (cached blocks are evicted first), and with chunked recompute.
TEST_F(EngineTest, PreemptionEqualsNoPreemption) {
  std::vector<Prompt> prompts;
  for (unsigned i = 0; i < 4; ++i)
    prompts.push_back(makePrompt(6, 3 + i));
  const SamplingParams p = greedy(36);
  EngineConfig bigCfg = engineConfig();
  bigCfg.prefixCaching = false;
  Engine big(*weights, nullptr, bigCfg);
  std::vector<RequestOutput> base = run(big, prompts, p);
  for (size_t i = 0; i < prompts.size(); ++i)
    expectOutput(base[i], prompts[i], reference(prompts[i], 36));
  EXPECT_EQ(big.stats().preemptions, 0);

  struct Case {
    bool caching;
    int64_t budget;
  };
  for (Case c : {Case{false, 2048}, Case{true, 2048}, Case{true, 8}}) {
    SCOPED_TRACE(std::string("prefix caching ") + (c.caching ? "on" : "off") +
                 ", max_tokens_per_step " + std::to_string(c.budget));
    EngineConfig cfg = engineConfig(4);
    cfg.prefixCaching = c.caching;
    cfg.maxTokensPerStep = c.budget;
    Engine small(*weights, nullptr, cfg);
    std::vector<RequestOutput> outs = run(small, prompts, p);
    for (size_t i = 0; i < prompts.size(); ++i)
      expectOutput(outs[i], prompts[i], base[i].tokens);
    expectIdle(small);
    EngineStats s = small.stats();
    EXPECT_GT(s.preemptions, 0);
    EXPECT_EQ(s.pagesTotal, 4);
    small.clearPrefixCache();
    EXPECT_EQ(small.stats().pagesUsed, 0);
  }
}

// P (40 tokens: 2 full blocks), then P + 10 more: the second request reuses
// P's blocks, and its tokens equal a run without caching. The same prompt
// again, and twice in one batch, gives the same tokens.
TEST_F(EngineTest, PrefixHitEqualsColdRun) {
  const Prompt p = makePrompt(40, 4);
  Prompt longer = p;
  for (int32_t t : makePrompt(10, 5))
    longer.push_back(t);
  EngineConfig plainCfg = engineConfig();
  plainCfg.prefixCaching = false;
  Engine plain(*weights, nullptr, plainCfg);
  std::vector<RequestOutput> cold = run(plain, {p, longer}, greedy());
  expectOutput(cold[0], p, reference(p, 12));
  expectOutput(cold[1], longer, reference(longer, 12));
  EXPECT_EQ(plain.stats().prefixHits, 0);

  Engine e(*weights, nullptr, engineConfig());
  std::vector<RequestOutput> first = run(e, {p}, greedy());
  expectOutput(first[0], p, cold[0].tokens);
  EXPECT_EQ(e.stats().prefixHits, 0);

  std::vector<RequestOutput> again = run(e, {p}, greedy());
  EngineStats s1 = e.stats();
  EXPECT_EQ(s1.prefixHits, 1);
  EXPECT_EQ(s1.prefixHitTokens, 32); // (40 - 1) / 16 full blocks
  expectOutput(again[0], p, cold[0].tokens);

  std::vector<RequestOutput> second = run(e, {longer}, greedy());
  EngineStats s2 = e.stats();
  EXPECT_GT(s2.prefixHits, s1.prefixHits);
  EXPECT_GT(s2.prefixQueries, 0);
  expectOutput(second[0], longer, cold[1].tokens);

  std::vector<RequestOutput> twins = run(e, {longer, longer}, greedy());
  expectOutput(twins[0], longer, cold[1].tokens);
  expectOutput(twins[1], longer, cold[1].tokens);
  expectIdle(e);
  EXPECT_GT(e.stats().pagesUsed, 0); // the cached prefixes
  e.clearPrefixCache();
  EXPECT_EQ(e.stats().pagesUsed, 0);
}

// The same with a stateful flow: H2O (per-block attention mass, decayed)
// selecting 1 block besides the first and last in every layer. A hit
// shares pages and cache fields and starts the states fresh, as a cold
// sequence has them: the tokens must equal recomputing the prefix. The
// flow matters for these prompts (dense attention gives other tokens).
/// The observation window (observe_tokens) is the prompt's last tokens
/// however the prompt is split: chunked prefill leaves the last chunk the
/// whole window, so H2O's first selection and the output do not depend on
/// the step's token budget.
TEST_F(EngineTest, ObservationWindowIgnoresChunking) {
  const rt::FlowArtifact *h2o = nullptr;
  stockH2O(h2o);
  if (!h2o)
    return;
  const Prompt p = makePrompt(120, 7);
  auto outputs = [&](int64_t stepTokens, int observe) {
    EngineConfig cfg = engineConfig();
    cfg.runner.denseLayers = 0;
    cfg.runner.blockSize = h2o->blockSize;
    cfg.runner.observeTokens = observe;
    cfg.maxTokensPerStep = stepTokens;
    Engine e(*weights, h2o, cfg);
    e.modelRunner().session().setParam("budget", 1);
    e.modelRunner().session().setParam("keep_last", 1);
    std::vector<RequestOutput> out = run(e, {p}, greedy(12));
    EXPECT_EQ(out[0].error, "");
    return out[0].tokens;
  };
  const std::vector<int32_t> whole = outputs(4096, 16);
  // 120 tokens in steps of 50: 50, 54 and the last 16 (not 50, 50, 20).
  EXPECT_EQ(outputs(50, 16), whole);
  EXPECT_EQ(outputs(111, 16), whole);
  // A window larger than the budget still runs (the last chunk's rows).
  EXPECT_EQ(outputs(8, 16).size(), whole.size());
}

TEST_F(EngineTest, PrefixHitWithH2OFlowEqualsColdRun) {
  const rt::FlowArtifact *h2o = nullptr;
  stockH2O(h2o);
  if (!h2o)
    return;
  ASSERT_FALSE(h2o->states.empty()); // stateful
  const Prompt p = makePrompt(100, 4);
  Prompt longer = p;
  for (int32_t t : makePrompt(10, 5))
    longer.push_back(t);
  auto flowEngine = [&](bool caching) {
    EngineConfig cfg = engineConfig();
    cfg.runner.denseLayers = 0;
    cfg.runner.blockSize = h2o->blockSize;
    cfg.prefixCaching = caching;
    auto e = std::make_unique<Engine>(*weights, h2o, cfg);
    e->modelRunner().session().setParam("budget", 1);
    e->modelRunner().session().setParam("keep_last", 1);
    return e;
  };
  const SamplingParams params = greedy(20);
  std::unique_ptr<Engine> plain = flowEngine(false);
  std::vector<RequestOutput> cold = run(*plain, {p, longer}, params);
  ASSERT_EQ(cold[1].error, "");
  ASSERT_EQ(cold[1].tokens.size(), 20u);

  std::unique_ptr<Engine> cached = flowEngine(true);
  std::vector<RequestOutput> first = run(*cached, {p}, params);
  expectOutput(first[0], p, cold[0].tokens);
  std::vector<RequestOutput> again = run(*cached, {p}, params);
  std::vector<RequestOutput> second = run(*cached, {longer}, params);
  EXPECT_EQ(cached->stats().prefixHits, 2);
  expectOutput(again[0], p, cold[0].tokens);
  expectOutput(second[0], longer, cold[1].tokens);
  cached->clearPrefixCache();
  EXPECT_EQ(cached->stats().pagesUsed, 0);

  Engine dense(*weights, nullptr, engineConfig());
  std::vector<RequestOutput> d = run(dense, {p, longer}, params);
  EXPECT_TRUE(d[0].tokens != cold[0].tokens || d[1].tokens != cold[1].tokens)
      << "H2O with budget 1 decodes these prompts as dense attention does: "
         "the test would not see the flow";
}

// After every request ends, no page is held: without caching at once, with
// caching once the cache is cleared (and the engine still works after).
TEST_F(EngineTest, NoPageLeaked) {
  std::vector<Prompt> prompts;
  for (int64_t n : {1, 16, 33, 40})
    prompts.push_back(makePrompt(n, 6));
  EngineConfig plainCfg = engineConfig();
  plainCfg.prefixCaching = false;
  Engine plain(*weights, nullptr, plainCfg);
  EXPECT_EQ(plain.stats().pagesUsed, 0);
  run(plain, prompts, greedy(9));
  run(plain, {prompts[0]}, greedy(1));
  expectIdle(plain);
  EXPECT_EQ(plain.stats().pagesUsed, 0);
  EXPECT_EQ(plain.stats().pagesTotal, 512);

  Engine cached(*weights, nullptr, engineConfig());
  std::vector<RequestOutput> a = run(cached, prompts, greedy(9));
  std::vector<RequestOutput> b = run(cached, prompts, greedy(9));
  EXPECT_GT(cached.stats().prefixHits, 0);
  EXPECT_EQ(tokensOf(a), tokensOf(b));
  expectIdle(cached);
  EXPECT_GT(cached.stats().pagesUsed, 0);
  cached.clearPrefixCache();
  EXPECT_EQ(cached.stats().pagesUsed, 0);
  std::vector<RequestOutput> c = run(cached, {prompts[2]}, greedy());
  expectOutput(c[0], prompts[2], reference(prompts[2], 12));
  cached.clearPrefixCache();
  EXPECT_EQ(cached.stats().pagesUsed, 0);
}

// abort(id) ends a running request at once with its tokens so far ("abort")
// and frees its pages; the others go on unchanged. An id that is not
// running or waiting gives nothing.
/// Log-probabilities (SamplingParams::logprobs): each generated token's and
/// the top k's equal the log-softmax (in double) of the logits after the
/// tokens before it; asking for them changes no token, greedy or sampled,
/// alone or beside requests that do not ask; generatedSince streams them.
TEST_F(EngineTest, LogprobsOfTheModelsDistribution) {
  const Prompt prompt = makePrompt(7, 21);
  Engine plain(*weights, nullptr, engineConfig());
  Engine e(*weights, nullptr, engineConfig());
  for (SamplingParams params : {greedy(6), sampled(77, 6)}) {
    SamplingParams asked = params;
    asked.logprobs = 3;
    const int64_t a = e.addRequest(prompt, asked);
    const int64_t b = e.addRequest(makePrompt(8, 30), params); // no logprobs
    const int64_t c = plain.addRequest(prompt, params);
    std::map<int64_t, RequestOutput> out = drain(e), ref = drain(plain);
    ASSERT_EQ(out[a].tokens, ref[c].tokens);
    EXPECT_TRUE(out[b].logprobs.empty());
    ASSERT_EQ(out[a].logprobs.size(), out[a].tokens.size());
    Prompt context = prompt;
    for (size_t t = 0; t < out[a].tokens.size(); ++t) {
      const std::vector<float> logits = e.promptLogits(context);
      double max = logits[0], sum = 0;
      for (float x : logits)
        max = std::max(max, double(x));
      for (float x : logits)
        sum += std::exp(double(x) - max);
      auto logprob = [&](int32_t id) {
        return double(logits[size_t(id)]) - max - std::log(sum);
      };
      const TokenLogprobs &lp = out[a].logprobs[t];
      const int32_t token = out[a].tokens[t];
      EXPECT_NEAR(lp.logprob, logprob(token), 1e-4) << "token " << t;
      ASSERT_EQ(lp.topIds.size(), 3u);
      std::vector<int32_t> ids(logits.size());
      for (size_t i = 0; i < ids.size(); ++i)
        ids[i] = int32_t(i);
      std::partial_sort(ids.begin(), ids.begin() + 3, ids.end(),
                        [&](int32_t x, int32_t y) {
                          return logits[size_t(x)] > logits[size_t(y)];
                        });
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(lp.topIds[i], ids[i]) << "token " << t;
        EXPECT_NEAR(lp.topLogprobs[i], logprob(ids[i]), 1e-4);
      }
      if (params.temperature == 0) {
        EXPECT_EQ(lp.topIds[0], token);
      }
      context.push_back(token);
    }
  }
  SamplingParams bad = greedy(2);
  bad.logprobs = 21;
  EXPECT_THROW(e.addRequest(prompt, bad), rt::Error);
}

/// A running request's prompt is cached as soon as it is computed: the
/// same prompt added while it runs (another sample of it) shares its full
/// blocks, and both give the tokens of cold runs.
TEST_F(EngineTest, RunningPromptIsSharedWhileItRuns) {
  const Prompt prompt = makePrompt(2 * kBlock + 9, 3);
  Engine e(*weights, nullptr, engineConfig());
  const int64_t a = e.addRequest(prompt, greedy(10));
  for (RequestOutput &o : e.step()) // the prompt, and its first token
    FAIL() << "request " << o.id << " finished in its first step";
  const int64_t b = e.addRequest(prompt, greedy(6));
  std::map<int64_t, RequestOutput> done = drain(e);
  EXPECT_EQ(e.stats().prefixHits, 1);
  EXPECT_EQ(e.stats().prefixHitTokens, 2 * kBlock);
  expectOutput(done[a], prompt, reference(prompt, 10));
  expectOutput(done[b], prompt, reference(prompt, 6));
}

/// Each output says what its decodes attended; the outputs add up to the
/// engine's counts (no preemption here).
TEST_F(EngineTest, OutputsCountTheBlocksTheyAttended) {
  Engine e(*weights, nullptr, engineConfig());
  for (int64_t n : {5, 40, 70})
    e.addRequest(makePrompt(n, 9), greedy(8));
  int64_t attended = 0, available = 0;
  for (auto &[id, o] : drain(e)) {
    EXPECT_GT(o.blocksAttended, 0) << id;
    EXPECT_EQ(o.blocksAttended, o.blocksAvailable) << id; // dense
    attended += o.blocksAttended;
    available += o.blocksAvailable;
  }
  EXPECT_EQ(attended, e.stats().blocksAttended);
  EXPECT_EQ(available, e.stats().blocksAvailable);
}

/// What a server streams: after every step, each request's new tokens
/// (generatedSince from what it has seen) add up to its final output; an
/// unknown id, or one whose output step() returned, has none.
TEST_F(EngineTest, GeneratedSinceStreamsTheOutput) {
  std::vector<Prompt> prompts;
  for (int64_t n : {1, 16, 33})
    prompts.push_back(makePrompt(n, 6));
  Engine e(*weights, nullptr, engineConfig());
  std::map<int64_t, size_t> index;
  std::map<int64_t, Tokens> streamed;
  for (size_t i = 0; i < prompts.size(); ++i)
    index[e.addRequest(prompts[i], greedy(int64_t(5 + 4 * i)))] = i;
  std::map<int64_t, RequestOutput> done;
  while (e.hasUnfinished()) {
    std::vector<RequestOutput> finished = e.step();
    for (auto &[id, i] : index) {
      if (done.count(id))
        continue;
      Tokens &seen = streamed[id];
      std::optional<Generated> more =
          e.generatedSince(id, int64_t(seen.size()));
      // Finished in this step: step() returned it, nothing more to read.
      const bool returned =
          std::any_of(finished.begin(), finished.end(),
                      [&](const RequestOutput &o) { return o.id == id; });
      ASSERT_EQ(more.has_value(), !returned) << "request " << id;
      if (more)
        seen.insert(seen.end(), more->tokens.begin(), more->tokens.end());
    }
    for (RequestOutput &o : finished)
      done[o.id] = std::move(o);
  }
  ASSERT_EQ(done.size(), prompts.size());
  for (auto &[id, i] : index) {
    expectOutput(done[id], prompts[i],
                 reference(prompts[i], 5 + 4 * int64_t(i)));
    // The last step's token is in the output only: everything before it
    // was streamed.
    const Tokens &all = done[id].tokens;
    EXPECT_EQ(streamed[id], Tokens(all.begin(), all.end() - 1));
  }
  EXPECT_FALSE(e.generatedSince(12345, 0).has_value());
  EXPECT_FALSE(e.generatedSince(index.begin()->first, 0).has_value());
}

TEST_F(EngineTest, AbortReturnsOutputSoFar) {
  std::vector<Prompt> prompts;
  for (int64_t n : {1, 16, 33})
    prompts.push_back(makePrompt(n, 6));
  EngineConfig cfg = engineConfig();
  cfg.prefixCaching = false;
  Engine e(*weights, nullptr, cfg);
  std::vector<int64_t> ids;
  for (const Prompt &p : prompts)
    ids.push_back(e.addRequest(p, greedy(12)));
  std::map<int64_t, RequestOutput> done;
  for (int s = 0; s < 4; ++s)
    for (RequestOutput &o : e.step())
      done[o.id] = std::move(o);
  EXPECT_TRUE(done.empty());
  const int64_t pagesBefore = e.stats().pagesUsed;
  std::optional<RequestOutput> aborted = e.abort(ids[1]);
  ASSERT_TRUE(aborted.has_value());
  EXPECT_EQ(aborted->id, ids[1]);
  EXPECT_EQ(aborted->finishReason, "abort");
  EXPECT_EQ(aborted->error, "");
  EXPECT_EQ(aborted->promptTokens, prompts[1]);
  // 4 steps: the prompt and 3 decodes, 4 tokens.
  Tokens full = reference(prompts[1], 12);
  EXPECT_EQ(aborted->tokens, Tokens(full.begin(), full.begin() + 4));
  // Its 2 pages (19 tokens computed) went back to the pool.
  EXPECT_EQ(e.stats().pagesUsed, pagesBefore - 2);
  EXPECT_EQ(e.stats().running, 2);
  EXPECT_FALSE(e.abort(ids[1]).has_value()); // already gone
  EXPECT_FALSE(e.abort(12345).has_value());
  EXPECT_FALSE(e.abort(-1).has_value());
  for (auto &[id, o] : drain(e))
    done[id] = std::move(o);
  ASSERT_EQ(done.size(), 2u);
  for (size_t i : {size_t(0), size_t(2)})
    expectOutput(done[ids[i]], prompts[i], reference(prompts[i], 12));
  expectIdle(e);
  EXPECT_EQ(e.stats().pagesUsed, 0);
  EXPECT_FALSE(e.abort(ids[0]).has_value()); // finished

  // A waiting request (max_batch 1) and one inside its chunked prompt.
  cfg.maxBatch = 1;
  cfg.maxTokensPerStep = 8;
  Engine f(*weights, nullptr, cfg);
  int64_t chunking = f.addRequest(prompts[2], greedy(12));
  int64_t queued = f.addRequest(prompts[0], greedy(12));
  f.step();
  f.step();
  EXPECT_EQ(f.stats().running, 1);
  EXPECT_EQ(f.stats().waiting, 1);
  EXPECT_EQ(f.stats().pagesUsed, 1); // 16 of its 33 tokens
  std::optional<RequestOutput> w = f.abort(queued);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->finishReason, "abort");
  EXPECT_TRUE(w->tokens.empty());
  EXPECT_EQ(w->promptTokens, prompts[0]);
  std::optional<RequestOutput> c = f.abort(chunking);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->finishReason, "abort");
  EXPECT_TRUE(c->tokens.empty());
  expectIdle(f);
  EXPECT_EQ(f.stats().pagesUsed, 0);
}

// Requests that cannot run (an empty prompt, ids outside the vocabulary, a
// prompt too long for the model's context or for the pool) end with
// "error" and a message naming the problem; good requests submitted with
// them get the tokens they get alone.
TEST_F(EngineTest, BadRequestsFailAloneGoodOnesRun) {
  // 8 pages of 16 tokens: less than the model's context of 256.
  EngineConfig cfg = engineConfig(8);
  cfg.prefixCaching = false;
  const Prompt good1 = makePrompt(5, 0), good2 = makePrompt(17, 0);
  Engine solo(*weights, nullptr, cfg);
  std::vector<RequestOutput> alone = {run(solo, {good1}, greedy())[0],
                                      run(solo, {good2}, greedy())[0]};
  expectOutput(alone[0], good1, reference(good1, 12));
  expectOutput(alone[1], good2, reference(good2, 12));

  struct Bad {
    Prompt prompt;
    std::vector<std::string> says;
  };
  Prompt oov = good1;
  oov[2] = int32_t(kVocab);
  std::vector<Bad> bads = {
      {{}, {"empty"}},
      {oov, {"token 100", "vocabulary of 100"}},
      {{5, -1, 7}, {"token -1", "vocabulary"}},
      {{1000000}, {"token 1000000", "vocabulary"}},
      {makePrompt(150, 7), {"150 tokens", "pages of the KV pool", "8"}},
      {makePrompt(300, 8), {"300 tokens", "context of 256"}},
  };
  // Each alone, all together, and among the good ones.
  std::vector<std::vector<size_t>> batches = {{0}, {1},    {4},
                                              {5}, {0, 1}, {0, 1, 2, 3, 4, 5}};
  for (const std::vector<size_t> &badSet : batches) {
    std::vector<Prompt> prompts;
    for (size_t b : badSet)
      prompts.push_back(bads[b].prompt);
    for (bool withGood : {false, true}) {
      std::vector<Prompt> all = prompts;
      if (withGood) {
        all.insert(all.begin(), good1);
        all.insert(all.begin() + 2, good2);
        all.push_back(good1);
      }
      Engine e(*weights, nullptr, cfg);
      std::vector<RequestOutput> outs = run(e, all, greedy());
      ASSERT_EQ(outs.size(), all.size());
      size_t nextBad = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        const RequestOutput &o = outs[i];
        if (withGood && (i == 0 || i == 2 || i + 1 == all.size())) {
          const RequestOutput &a = alone[i == 2 ? 1 : 0];
          expectOutput(o, a.promptTokens, a.tokens);
          continue;
        }
        const Bad &bad = bads[badSet[nextBad++]];
        SCOPED_TRACE("bad prompt of " + std::to_string(bad.prompt.size()) +
                     " tokens");
        EXPECT_EQ(o.finishReason, "error");
        EXPECT_TRUE(o.tokens.empty());
        EXPECT_EQ(o.promptTokens, bad.prompt);
        ASSERT_FALSE(o.error.empty());
        for (const std::string &s : bad.says)
          EXPECT_NE(o.error.find(s), std::string::npos)
              << "error '" << o.error << "' lacks '" << s << "'";
      }
      expectIdle(e);
      EXPECT_EQ(e.stats().pagesUsed, 0);
    }
  }

  // max_tokens counts too: 100 + 50 tokens need 10 pages of the 8.
  Engine e(*weights, nullptr, cfg);
  std::vector<RequestOutput> o = run(e, {makePrompt(100, 9)}, greedy(50));
  EXPECT_EQ(o[0].finishReason, "error");
  EXPECT_NE(o[0].error.find("max_tokens 50"), std::string::npos) << o[0].error;
}

// A request that reaches the model's context stops there ("length"); the
// pool need only hold the tokens it computes.
TEST_F(EngineTest, RequestStopsAtTheModelsContext) {
  // 16 pages of 16 tokens: the context of 256 tokens exactly.
  EngineConfig cfg = engineConfig(kMaxPositions / kBlock);
  cfg.prefixCaching = false;
  Engine e(*weights, nullptr, cfg);
  const Prompt p = makePrompt(kMaxPositions - 6, 10);
  std::vector<RequestOutput> o = run(e, {p}, greedy(16));
  EXPECT_EQ(o[0].error, "");
  EXPECT_EQ(o[0].finishReason, "length");
  EXPECT_EQ(o[0].tokens.size(), 6u);
  Engine big(*weights, nullptr, engineConfig());
  std::vector<RequestOutput> b = run(big, {p}, greedy(6));
  EXPECT_EQ(o[0].tokens, b[0].tokens);
  EXPECT_EQ(e.stats().pagesUsed, 0);
}

// max_model_len is the context a request sees below the model's: it stops
// there as at the model's own, and a longer prompt is refused naming it.
TEST_F(EngineTest, MaxModelLenCapsTheContext) {
  EngineConfig cfg = engineConfig();
  cfg.runner.maxModelLen = 40;
  Engine e(*weights, nullptr, cfg);
  std::vector<RequestOutput> o =
      run(e, {makePrompt(34, 10), makePrompt(40, 11)}, greedy(16));
  EXPECT_EQ(o[0].error, "");
  EXPECT_EQ(o[0].finishReason, "length");
  EXPECT_EQ(o[0].tokens.size(), 6u);
  EXPECT_NE(o[1].error.find("max_model_len"), std::string::npos) << o[1].error;
  cfg.runner.maxModelLen = -1;
  EXPECT_THROW(Engine(*weights, nullptr, cfg), rt::Error);
}

// Without a prefix cache the session has a slot per running request and
// two more (one being admitted, one for prompt logits): a full batch runs,
// and prompt logits between steps find a slot.
TEST_F(EngineTest, NoPrefixCacheNeedsNoHolderSlots) {
  EngineConfig cfg = engineConfig();
  cfg.prefixCaching = false;
  cfg.maxBatch = 3;
  EXPECT_EQ(cfg.runnerConfig(kBlock).maxSequences, 5);
  Engine e(*weights, nullptr, cfg);
  for (int i = 0; i < 5; ++i)
    e.addRequest(makePrompt(20 + i, i), greedy(6));
  e.step();
  EXPECT_EQ(e.stats().running, 3);
  EXPECT_FALSE(e.promptLogits(makePrompt(9, 7)).empty());
  std::vector<RequestOutput> done;
  while (e.hasUnfinished())
    for (RequestOutput &o : e.step())
      done.push_back(std::move(o));
  EXPECT_EQ(done.size(), 5u);
  for (const RequestOutput &o : done)
    EXPECT_EQ(o.error, "") << o.error;
}

// Bad sampling params throw rt::Error naming the field from addRequest and
// generate(), and queue nothing.
TEST_F(EngineTest, BadSamplingParamsThrow) {
  Engine e(*weights, nullptr, engineConfig());
  const Prompt p = makePrompt(5, 0);
  struct Case {
    const char *field;
    SamplingParams params;
  };
  std::vector<Case> cases;
  auto with = [](auto set) {
    SamplingParams s = greedy();
    set(s);
    return s;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  cases.push_back({"max_tokens", with([](auto &s) { s.maxTokens = 0; })});
  cases.push_back({"max_tokens", with([](auto &s) { s.maxTokens = -1; })});
  cases.push_back({"temperature", with([](auto &s) { s.temperature = -0.5; })});
  cases.push_back({"temperature", with([&](auto &s) { s.temperature = nan; })});
  cases.push_back({"temperature", with([&](auto &s) { s.temperature = inf; })});
  cases.push_back({"top_p", with([](auto &s) { s.topP = 0.0; })});
  cases.push_back({"top_p", with([](auto &s) { s.topP = 1.5; })});
  cases.push_back({"top_p", with([](auto &s) { s.topP = -0.1; })});
  cases.push_back({"top_p", with([&](auto &s) { s.topP = nan; })});
  cases.push_back({"top_k", with([](auto &s) { s.topK = -5; })});
  for (const Case &c : cases) {
    SCOPED_TRACE(c.field);
    expectError([&] { e.addRequest(p, c.params); }, c.field);
    expectError([&] { e.generate({p}, c.params); }, c.field);
    EXPECT_FALSE(e.hasUnfinished());
  }
  // The edges are fine.
  SamplingParams edge = greedy(1);
  edge.topP = 1.0;
  edge.topK = 0;
  edge.temperature = 0;
  EXPECT_EQ(e.generate({p}, edge)[0].finishReason, "length");
}

// A seeded request draws the same tokens alone, batched with other
// requests (greedy ones, other seeds), chunked and preempted: its draws
// depend only on its seed and how many tokens it generated.
TEST_F(EngineTest, SeededSamplingSameAloneAndBatched) {
  std::vector<Prompt> prompts;
  for (int64_t n : {4, 11, 23})
    prompts.push_back(makePrompt(n, 9));
  // Alone: the sampling rule on the model's logits, draw i for token i.
  const SamplingParams params = sampled(123);
  std::vector<Tokens> alone;
  for (const Prompt &p : prompts) {
    Engine e(*weights, nullptr, engineConfig());
    std::vector<RequestOutput> o = run(e, {p}, params);
    expectOutput(o[0], p, reference(p, 16, &params));
    alone.push_back(o[0].tokens);
  }
  // Sampling does something, and the seed matters.
  std::vector<Tokens> greedyTokens, otherSeed;
  for (const Prompt &p : prompts) {
    greedyTokens.push_back(reference(p, 16));
    Engine e(*weights, nullptr, engineConfig());
    otherSeed.push_back(run(e, {p}, sampled(456))[0].tokens);
  }
  EXPECT_NE(alone, greedyTokens);
  EXPECT_NE(alone, otherSeed);

  struct Case {
    const char *what;
    int64_t pages, budget;
  };
  for (Case c : {Case{"batched", 512, 2048}, Case{"chunked", 512, 7},
                 Case{"preempted", 4, 2048}}) {
    SCOPED_TRACE(c.what);
    EngineConfig cfg = engineConfig(c.pages);
    cfg.maxTokensPerStep = c.budget;
    Engine e(*weights, nullptr, cfg);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      // Others in front of and among the seeded ones.
      e.addRequest(makePrompt(int64_t(6 + i), 20), greedy(10));
      e.addRequest(makePrompt(int64_t(9 + i), 21), sampled(456 + i, 12));
      ids.push_back(e.addRequest(prompts[i], params));
    }
    std::map<int64_t, RequestOutput> done = drain(e);
    for (size_t i = 0; i < prompts.size(); ++i)
      expectOutput(done[ids[i]], prompts[i], alone[i]);
    if (c.pages == 4) {
      EXPECT_GT(e.stats().preemptions, 0);
    }
    expectIdle(e);
  }
}

// A prefix hit that cannot be admitted yet must not pin the pages it
// shares while it waits. Here room() evicts the hit's holder for it, yet
// the pool stays short: had the waiting request kept its shared pages (the
// holder's, now its alone), the running request, preempted when it next
// needed a page, could never come back (it needs more than the rest of the
// pool) and nothing would ever run again. Everything must finish, with the
// tokens of a big pool.
TEST_F(EngineTest, WaitingPrefixHitDoesNotStarveThePool) {
  // 8 pages of 16 tokens.
  EngineConfig cfg = engineConfig(8);
  Engine e(*weights, nullptr, cfg);
  // A: 40 + 9 tokens; it ends having computed 48, 3 full blocks, cached.
  const Prompt a = makePrompt(40, 11);
  std::vector<RequestOutput> outA = run(e, {a}, greedy(9));
  ASSERT_EQ(outA[0].tokens.size(), 9u);
  EXPECT_EQ(e.stats().pagesUsed, 3);
  // R: 6 + 122 tokens (8 pages at the end). Run it until it holds 5 pages
  // (65 tokens computed) and the pool is full.
  const Prompt r = makePrompt(6, 12);
  int64_t idR = e.addRequest(r, greedy(122));
  while (e.stats().pagesUsed < 8)
    ASSERT_TRUE(e.step().empty());
  // B: A's 48 computed tokens and one more: a hit on all 3 cached blocks,
  // then a 4th page it cannot have now.
  Prompt b(a);
  b.insert(b.end(), outA[0].tokens.begin(), outA[0].tokens.begin() + 8);
  b.push_back(3);
  int64_t idB = e.addRequest(b, greedy(4));
  ASSERT_TRUE(e.step().empty());
  EngineStats s = e.stats();
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.waiting, 1);
  EXPECT_EQ(s.pagesUsed, 5); // R's: the waiting B holds none
  std::map<int64_t, RequestOutput> done = drain(e, 2000);
  ASSERT_EQ(done.size(), 2u);

  EngineConfig bigCfg = engineConfig();
  bigCfg.prefixCaching = false;
  Engine big(*weights, nullptr, bigCfg);
  std::vector<RequestOutput> base = run(big, {r, b}, greedy(122));
  expectOutput(done[idR], r, base[0].tokens);
  expectOutput(done[idB], b,
               Tokens(base[1].tokens.begin(), base[1].tokens.begin() + 4));
  e.clearPrefixCache();
  EXPECT_EQ(e.stats().pagesUsed, 0);
}

// max_tokens of any size (INT64_MAX: "no limit") with a pool smaller than
// the model's context: the request is refused at once, and one that fits
// runs to the context (prompt + max_tokens overflowed, the request was
// admitted and the engine spun forever).
TEST_F(EngineTest, HugeMaxTokensNeverOverflows) {
  EngineConfig cfg = engineConfig(8); // 128 tokens < the context of 256
  cfg.prefixCaching = false;
  Engine e(*weights, nullptr, cfg);
  const int64_t huge = std::numeric_limits<int64_t>::max();
  std::vector<RequestOutput> o = run(e, {makePrompt(10, 20)}, greedy(huge));
  EXPECT_EQ(o[0].finishReason, "error");
  EXPECT_NE(o[0].error.find("pages of the KV pool"), std::string::npos)
      << o[0].error;
  Engine whole(*weights, nullptr, engineConfig(kMaxPositions / kBlock));
  o = run(whole, {makePrompt(kMaxPositions - 3, 21)}, greedy(huge));
  EXPECT_EQ(o[0].finishReason, "length");
  EXPECT_EQ(o[0].tokens.size(), 3u);
  for (int64_t big : {huge, huge - 1, int64_t(1) << 62})
    EXPECT_NO_THROW(greedy(big).validate());
}

// A request that fits the pool but cannot get its pages because the
// session holds them elsewhere, with nothing running that could free them,
// finishes with an error instead of waiting forever.
TEST_F(EngineTest, UnrunnableWaitingRequestFinishesWithAnError) {
  EngineConfig cfg = engineConfig(8);
  cfg.prefixCaching = false;
  Engine e(*weights, nullptr, cfg);
  rt::Session &s = e.modelRunner().session();
  rt::SeqId hog = s.addSequence();
  const int64_t n = 6 * kBlock;
  const rt::SessionConfig &sc = s.config();
  std::vector<float> kv(size_t(n) * sc.numLayers * sc.numKVHeads * sc.headDim,
                        0.5f);
  s.append(hog, n, kv.data(), kv.data());
  ASSERT_EQ(s.freePages(), 2);
  std::vector<RequestOutput> o = run(e, {makePrompt(50, 22)}, greedy(4));
  EXPECT_EQ(o[0].finishReason, "error");
  EXPECT_NE(o[0].error.find("only 2 of its 8"), std::string::npos)
      << o[0].error;
  s.release(hog);
  o = run(e, {makePrompt(50, 22)}, greedy(4));
  EXPECT_EQ(o[0].finishReason, "length");
}

// Threads share one engine: generate() from several threads at once (their
// steps batched together), with add_request/step/abort/stats from another
// thread, give every thread exactly the tokens it gets alone.
TEST_F(EngineTest, ThreadsShareOneEngine) {
  EngineConfig cfg = engineConfig();
  Engine e(*weights, nullptr, cfg);
  const int kThreads = 4;
  std::vector<std::vector<Prompt>> prompts(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (int64_t n : {3, 17, 30})
      prompts[size_t(t)].push_back(makePrompt(n + t, unsigned(30 + t)));
  std::vector<std::vector<RequestOutput>> got(kThreads);
  std::vector<std::string> errors(kThreads + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        got[size_t(t)] = e.generate(prompts[size_t(t)], greedy(8 + t));
      } catch (const std::exception &x) {
        errors[size_t(t)] = x.what();
      }
    });
  // Meanwhile: requests of its own, driven by step(), and reads.
  std::map<int64_t, RequestOutput> mine;
  threads.emplace_back([&] {
    try {
      std::vector<int64_t> ids;
      for (int i = 0; i < 3; ++i)
        ids.push_back(e.addRequest(makePrompt(9 + i, 40), greedy(6)));
      int64_t dropped = e.addRequest(makePrompt(12, 41), greedy(50));
      e.abort(dropped);
      for (int steps = 0; mine.size() < 3 && steps < 10000; ++steps) {
        for (RequestOutput &o : e.step())
          mine[o.id] = std::move(o);
        (void)e.stats();
      }
    } catch (const std::exception &x) {
      errors[kThreads] = x.what();
    }
  });
  for (std::thread &t : threads)
    t.join();
  for (const std::string &x : errors)
    EXPECT_EQ(x, "");
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(got[size_t(t)].size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      expectOutput(got[size_t(t)][i], prompts[size_t(t)][i],
                   reference(prompts[size_t(t)][i], 8 + t));
  }
  ASSERT_EQ(mine.size(), 3u);
  for (auto &[id, o] : mine)
    EXPECT_EQ(o.finishReason, "length") << o.error;
  expectIdle(e);
  e.clearPrefixCache();
  EXPECT_EQ(e.stats().pagesUsed, 0);
}

// generate()'s keepGoing returning false (Ctrl-C in Python) aborts its
// requests, frees their pages and throws Interrupted; the engine goes on.
TEST_F(EngineTest, InterruptedGenerateAbortsItsRequests) {
  EngineConfig cfg = engineConfig();
  cfg.prefixCaching = false;
  Engine e(*weights, nullptr, cfg);
  int calls = 0;
  const std::vector<Prompt> prompts = {makePrompt(20, 50), makePrompt(5, 51)};
  EXPECT_THROW(e.generate(prompts, greedy(40), [&] { return ++calls < 4; }),
               Interrupted);
  EXPECT_EQ(calls, 4);
  expectIdle(e);
  EXPECT_EQ(e.stats().pagesUsed, 0);
  std::vector<RequestOutput> o = e.generate(prompts, greedy(5));
  expectOutput(o[0], prompts[0], reference(prompts[0], 5));
}

// NaN in the weights: every request finishes with "error" and a message
// (it got token 0 again and again and finished with "length").
TEST_F(EngineTest, NonFiniteLogitsFinishWithAnError) {
  TempDir bad;
  writeRandomModel(bad, engineModel(), 7,
                   "model.layers.1.mlp.down_proj.weight");
  ModelWeights w = ModelWeights::open(bad.str());
  Engine e(w, nullptr, engineConfig());
  std::vector<RequestOutput> o =
      run(e, {makePrompt(7, 60), makePrompt(20, 61)}, greedy(5));
  for (const RequestOutput &r : o) {
    EXPECT_EQ(r.finishReason, "error");
    EXPECT_TRUE(r.tokens.empty());
    EXPECT_NE(r.error.find("NaN or infinity"), std::string::npos) << r.error;
  }
  expectIdle(e);
}

} // namespace
