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
// Requests, sampling, aborts and threads: EngineRequestsTest.cpp; the
// model, reference and helpers both use: EngineTestUtil.h.
//
// The CPU runner needs CBLAS: without it the tests skip. The H2O variant of
// the prefix test needs the artifact vflowc writes at build time
// (tests/compiler/stock.vfa, target vflow-stock-artifact): it skips when
// the build has no compiler or the artifact is not built yet.
//
//===----------------------------------------------------------------------===//

#include "EngineTestUtil.h"

#include <gtest/gtest.h>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::enginetest;

namespace {

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

} // namespace
