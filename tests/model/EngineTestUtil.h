//===- EngineTestUtil.h - The engine tests' shared parts -------*- C++ -*-===//
//
// What EngineTest.cpp and EngineRequestsTest.cpp share: the tiny random
// Llama they write, prompts and sampling params, drain(), and the fixture
// (the model written once per suite; a one-token-at-a-time reference whose
// compared greedy steps must have a clear winner).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_MODEL_ENGINETESTUTIL_H
#define VFLOW_TESTS_MODEL_ENGINETESTUTIL_H

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

namespace vflow::model::enginetest {

using namespace vflow::model::test;
using vflow::rt::Json;

constexpr int64_t kVocab = 100;
constexpr int32_t kEos = 2;
constexpr int64_t kMaxPositions = 256;
constexpr int64_t kBlock = 16;
/// The smallest top-2 logit gap a compared greedy step may have.
constexpr double kMinMargin = 1e-3;

using Prompt = std::vector<int32_t>;
using Tokens = std::vector<int32_t>;

inline ModelConfig engineModel() {
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
inline void writeRandomModel(const TempDir &dir, const ModelConfig &c,
                             unsigned seed, const std::string &poison = "") {
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
inline Prompt makePrompt(int64_t length, unsigned salt) {
  std::mt19937 rng(1000u + 7919u * salt + unsigned(length));
  std::uniform_int_distribution<int32_t> id(3, int32_t(kVocab - 1));
  Prompt p(static_cast<size_t>(length));
  for (int32_t &t : p)
    t = id(rng);
  return p;
}

inline SamplingParams greedy(int64_t maxTokens = 12) {
  SamplingParams p;
  p.maxTokens = maxTokens;
  p.temperature = 0;
  p.ignoreEos = true;
  return p;
}

inline SamplingParams sampled(uint64_t seed, int64_t maxTokens = 16) {
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
inline EngineConfig engineConfig(int64_t pages = 512) {
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
inline std::map<int64_t, RequestOutput> drain(Engine &e,
                                              int64_t maxSteps = 5000) {
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
inline std::vector<RequestOutput> run(Engine &e,
                                      const std::vector<Prompt> &prompts,
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

inline std::vector<Tokens> tokensOf(const std::vector<RequestOutput> &outs) {
  std::vector<Tokens> t;
  for (const RequestOutput &o : outs)
    t.push_back(o.tokens);
  return t;
}

/// A request that ended normally with `want` after `prompt`.
inline void expectOutput(const RequestOutput &o, const Prompt &prompt,
                         const Tokens &want,
                         const std::string &finish = "length") {
  EXPECT_EQ(o.error, "");
  EXPECT_EQ(o.finishReason, finish);
  EXPECT_EQ(o.promptTokens, prompt);
  EXPECT_EQ(o.tokens, want);
}

/// Nothing running or waiting.
inline void expectIdle(const Engine &e) {
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

  inline static TempDir *dir = nullptr;
  inline static ModelWeights *weights = nullptr;
};

} // namespace vflow::model::enginetest

#endif // VFLOW_TESTS_MODEL_ENGINETESTUTIL_H
