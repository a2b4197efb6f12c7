//===- EngineRequestsTest.cpp - The engine's requests on the CPU ----------===//
//
// vflow::model::Engine (EngineTest's fixture and tiny model,
// EngineTestUtil.h): requests that cannot run or are bad, the model's
// context and max_model_len, sampling params, seeded sampling alone and
// batched, waiting requests and the pool, huge max_tokens, threads sharing
// one engine, interrupted generate, non-finite logits.
//
//===----------------------------------------------------------------------===//

#include "EngineTestUtil.h"

#include <gtest/gtest.h>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::enginetest;

namespace {

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
