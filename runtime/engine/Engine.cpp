//===- Engine.cpp - Continuous batching over a model runner ---------------===//
//
// A step is schedule (Scheduler: which requests, how many tokens), run (the
// model runner: one forward, the next tokens) and apply (tokens appended,
// finished requests out, their blocks to the prefix cache); the public
// methods take the engine's lock around them.
//
//===----------------------------------------------------------------------===//

#include "vflow/Engine/Engine.h"

#include "PrefixCache.h"
#include "Request.h"
#include "Scheduler.h"

#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <chrono>
#include <limits>

using namespace vflow;
using namespace vflow::model;
using engine::PrefixCache;
using engine::Request;
using engine::Scheduler;
using engine::StepBatch;
using engine::StepRow;

namespace {

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The config, checked before anything is built from it.
const EngineConfig &validated(const EngineConfig &cfg) {
  cfg.validate();
  return cfg;
}

} // namespace

Engine::Engine(const ModelWeights &weights, const rt::FlowArtifact *flow,
               const EngineConfig &config)
    : cfg(validated(config)),
      runner(weights, flow,
             cfg.runnerConfig(flow ? flow->blockSize : cfg.runner.blockSize)) {
  const RunnerConfig &rc = cfg.runnerConfig(runner.blockSize());
  // The observation window when the flow reads `mass` (else 0): a prompt's
  // last prefill chunk holds at least that many tokens (prefix hits and
  // chunking leave them), so the window is the prompt's last tokens however
  // the prompt was split.
  const int64_t window = flow && flow->readsInput("mass") &&
                                 rc.denseLayers < runner.config().numLayers
                             ? rc.observeTokens
                             : 0;
  // Holders are live sequences: they leave the session's sequence slots to
  // the running requests and one being admitted.
  cache = std::make_unique<PrefixCache>(
      runner.session(), runner.blockSize(),
      int64_t(rc.maxSequences) - cfg.maxBatch - 1, cfg.prefixCaching);
  scheduler = std::make_unique<Scheduler>(
      runner.session(), *cache, cfg.maxBatch, cfg.maxTokensPerStep, window);
}

Engine::~Engine() = default;

int64_t Engine::addRequest(std::vector<int32_t> prompt,
                           const SamplingParams &params) {
  params.validate();
  std::lock_guard<std::mutex> lock(mu);
  return addLocked(std::move(prompt), params);
}

int64_t Engine::addLocked(std::vector<int32_t> prompt,
                          const SamplingParams &params) {
  auto r = std::make_unique<Request>();
  r->id = nextId++;
  r->promptLen = int64_t(prompt.size());
  r->tokens = std::move(prompt);
  r->params = params;
  r->seed = params.seed ? *params.seed
                        : splitmix64(cfg.seed ^ splitmix64(uint64_t(r->id)));
  const ModelConfig &m = runner.config();
  const int64_t bs = runner.blockSize();
  const int64_t pool = runner.session().config().numPages;
  // It stops at the model's context, whatever max_tokens says (any int64:
  // the sum saturates).
  int64_t longest =
      r->promptLen +
      std::min(params.maxTokens,
               std::numeric_limits<int64_t>::max() - r->promptLen);
  if (m.maxPositions > 0)
    longest = std::min(longest, m.maxPositions);
  if (r->promptLen == 0)
    r->error = "the prompt is empty";
  for (int32_t t : r->tokens)
    if (r->error.empty() && (t < 0 || t >= m.vocabSize))
      r->error = "token " + std::to_string(t) +
                 " is outside the vocabulary of " + std::to_string(m.vocabSize);
  if (r->error.empty() && m.maxPositions > 0 && r->promptLen >= m.maxPositions)
    r->error = "the prompt of " + std::to_string(r->promptLen) +
               " tokens does not fit the model's context of " +
               std::to_string(m.maxPositions) +
               (runner.maxModelLen() > 0 ? " (max_model_len)" : "");
  // The most pages it ever holds: every token, or with a flow's retain
  // block the prompt and the first decoded token (evicted after that step)
  // or the retained blocks and the partial one, whichever is more.
  int64_t pages = ceilDiv(longest, bs);
  if (const int64_t kept = runner.session().retainedBlocks(); kept >= 0)
    pages = std::min(pages, std::max(ceilDiv(r->promptLen + 1, bs), kept + 1));
  if (r->error.empty() && pages > pool)
    r->error = "the prompt of " + std::to_string(r->promptLen) +
               " tokens and max_tokens " + std::to_string(params.maxTokens) +
               " need " + std::to_string(pages) +
               " pages of the KV pool, which has " + std::to_string(pool);
  const int64_t id = r->id;
  scheduler->add(*r);
  requests[id] = std::move(r);
  return id;
}

std::optional<RequestOutput> Engine::abort(int64_t id) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = requests.find(id);
  if (it == requests.end())
    return std::nullopt;
  RequestOutput out = finish(*it->second, "abort");
  if (owned.count(id))
    finished[id] = out; // its generate() returns it too
  return out;
}

bool Engine::hasUnfinished() const {
  std::lock_guard<std::mutex> lock(mu);
  if (!requests.empty())
    return true;
  for (const auto &f : finished)
    if (!owned.count(f.first))
      return true;
  return false;
}

std::optional<Generated> Engine::generatedSince(int64_t id,
                                                int64_t from) const {
  std::lock_guard<std::mutex> lock(mu);
  auto tail = [from](const auto &items, size_t start) {
    start = std::min(start + size_t(std::max<int64_t>(0, from)), items.size());
    return std::decay_t<decltype(items)>(items.begin() + ptrdiff_t(start),
                                         items.end());
  };
  auto since = [&](const std::vector<int32_t> &tokens, size_t promptLen,
                   const std::vector<TokenLogprobs> &logprobs) {
    return Generated{tail(tokens, promptLen), tail(logprobs, 0)};
  };
  if (auto it = requests.find(id); it != requests.end())
    return since(it->second->tokens, size_t(it->second->promptLen),
                 it->second->logprobs);
  if (auto it = finished.find(id); it != finished.end())
    return since(it->second.tokens, 0, it->second.logprobs);
  return std::nullopt;
}

RequestOutput Engine::finish(Request &r, const std::string &reason,
                             const std::string &error) {
  RequestOutput out;
  out.id = r.id;
  out.promptTokens.assign(r.tokens.begin(), r.tokens.begin() + r.promptLen);
  out.tokens.assign(r.tokens.begin() + r.promptLen, r.tokens.end());
  out.finishReason = reason;
  out.error = error;
  out.logprobs = r.logprobs;
  if (r.seq)
    r.countAttended(runner.session(), *r.seq);
  out.blocksAttended = r.attended.blocksAttended;
  out.blocksAvailable = r.attended.blocksAvailable;
  out.blocksEvicted = r.attended.blocksEvicted;
  out.tokensEvicted = r.attended.tokensEvicted;
  if (r.seq)
    cache->keep(*r.seq, r.tokens, r.computed / runner.blockSize());
  r.seq.reset();
  scheduler->remove(r);
  requests.erase(r.id);
  return out;
}

void Engine::finishStep(Request &r, const std::string &reason,
                        const std::string &error) {
  const int64_t id = r.id;
  finished[id] = finish(r, reason, error);
}

void Engine::clearPrefixCache() {
  std::lock_guard<std::mutex> lock(mu);
  cache->clear();
}

std::vector<RequestOutput> Engine::step() {
  std::lock_guard<std::mutex> lock(mu);
  stepLocked();
  std::vector<RequestOutput> out;
  for (auto it = finished.begin(); it != finished.end();) {
    if (owned.count(it->first)) {
      ++it;
      continue;
    }
    out.push_back(std::move(it->second));
    it = finished.erase(it);
  }
  return out;
}

void Engine::stepLocked() {
  const auto hostStart = Clock::now();
  // Requests that cannot run finish now (collected first: finishing one
  // changes the queue).
  std::vector<Request *> failed;
  for (Request *r : scheduler->waitingRequests())
    if (!r->error.empty())
      failed.push_back(r);
  for (Request *r : failed)
    finishStep(*r, "error", std::string(r->error));
  StepBatch batch = scheduler->schedule(counters);
  if (Request *r = batch.stalled) {
    const int64_t need = ceilDiv(int64_t(r->tokens.size()), runner.blockSize());
    finishStep(*r, "error",
               "the request's " + std::to_string(r->tokens.size()) +
                   " tokens need " + std::to_string(need) +
                   " pages of the KV pool, and only " +
                   std::to_string(runner.session().freePages()) + " of its " +
                   std::to_string(runner.session().config().numPages) +
                   " are free with nothing else running (pages held "
                   "elsewhere in the session)");
  }
  double modelMs = 0;
  if (!batch.rows.empty()) {
    const auto t0 = Clock::now();
    std::vector<int32_t> next;
    std::vector<std::optional<TokenLogprobs>> logprobs;
    std::optional<std::string> error = run(batch, next, logprobs);
    modelMs = msSince(t0);
    if (error) {
      for (const StepRow &row : batch.rows)
        finishStep(*row.request, "error", *error);
    } else {
      apply(batch, next, logprobs);
    }
  }
  counters.hostMs += msSince(hostStart) - modelMs;
}

std::optional<std::string>
Engine::run(const StepBatch &batch, std::vector<int32_t> &next,
            std::vector<std::optional<TokenLogprobs>> &logprobs) {
  std::vector<rt::SeqId> seqs;
  std::vector<std::vector<int32_t>> feed;
  std::vector<bool> decode;
  // Every row draws (its draw number: the tokens it generated so far);
  // rows still inside their prompt ignore theirs.
  std::vector<RowSampling> draws;
  for (const StepRow &row : batch.rows) {
    const Request &r = *row.request;
    seqs.push_back(*r.seq);
    feed.push_back(row.tokens);
    decode.push_back(row.decode);
    RowSampling d;
    d.temperature = float(r.params.temperature);
    d.topP = float(r.params.topP);
    d.topK = r.params.topK;
    d.seed = r.seed;
    d.counter = uint64_t(r.generated());
    draws.push_back(d);
  }
  logprobs.assign(batch.rows.size(), std::nullopt);
  try {
    if (std::none_of(batch.rows.begin(), batch.rows.end(),
                     [](const StepRow &row) {
                       return row.request->params.logprobs >= 0;
                     }))
      next = runner.forward(seqs, feed, decode, draws);
    else
      sampleOnHost(seqs, feed, decode, draws, batch, next, logprobs);
  } catch (const rt::Error &e) {
    return std::string(e.what());
  }
  const ForwardTimes &ft = runner.lastTimes();
  counters.gemmMs += ft.gemmMs;
  counters.attentionMs += ft.attentionMs;
  counters.otherMs += ft.otherMs;
  counters.graphMs += ft.graphMs;
  counters.indexMs += ft.indexMs;
  counters.samplingMs += ft.samplingMs;
  ++counters.steps;
  return std::nullopt;
}

void Engine::sampleOnHost(const std::vector<rt::SeqId> &seqs,
                          const std::vector<std::vector<int32_t>> &feed,
                          const std::vector<bool> &decode,
                          const std::vector<RowSampling> &draws,
                          const StepBatch &batch, std::vector<int32_t> &next,
                          std::vector<std::optional<TokenLogprobs>> &logprobs) {
  // A row asks for log-probabilities: the logits come to the host and
  // every row is drawn there by the same rule (Sampling.h).
  const std::vector<float> logits = runner.forwardLogits(seqs, feed, decode);
  const int64_t V = runner.config().vocabSize;
  const auto t0 = std::chrono::steady_clock::now();
  next.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const float *row = logits.data() + i * size_t(V);
    next[i] = sampleToken(row, V, draws[i]);
    const int64_t k = batch.rows[i].request->params.logprobs;
    if (k >= 0 && next[i] != kNonFiniteLogits)
      logprobs[i] = tokenLogprobs(row, V, next[i], k);
  }
  counters.samplingMs += std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
}

void Engine::apply(const StepBatch &batch, const std::vector<int32_t> &next,
                   std::vector<std::optional<TokenLogprobs>> &logprobs) {
  const ModelConfig &m = runner.config();
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    Request &r = *batch.rows[i].request;
    r.computed += int64_t(batch.rows[i].tokens.size());
    counters.tokensComputed += int64_t(batch.rows[i].tokens.size());
    if (r.computed < int64_t(r.tokens.size()))
      continue;             // a prompt chunk: more to come
    if (r.generated() == 0) // the prompt is in: others may share it now
      cache->keepPrefix(*r.seq, r.tokens, r.promptLen / runner.blockSize());
    const int32_t t = next[i];
    if (t == kNonFiniteLogits) {
      finishStep(r, "error",
                 "the model's logits for token " +
                     std::to_string(r.generated() + 1) +
                     " hold NaN or infinity: its weights or activations are "
                     "not finite (a broken or overflowing model file?)");
      continue;
    }
    r.tokens.push_back(t);
    if (logprobs[i])
      r.logprobs.push_back(std::move(*logprobs[i]));
    const bool eos = !r.params.ignoreEos &&
                     std::find(m.eosTokenIds.begin(), m.eosTokenIds.end(), t) !=
                         m.eosTokenIds.end();
    if (eos)
      finishStep(r, "stop");
    else if (r.generated() >= r.params.maxTokens ||
             (m.maxPositions > 0 && int64_t(r.tokens.size()) >= m.maxPositions))
      finishStep(r, "length");
  }
}

std::vector<RequestOutput>
Engine::generate(const std::vector<std::vector<int32_t>> &prompts,
                 const SamplingParams &params,
                 const std::function<bool()> &keepGoing) {
  params.validate();
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const std::vector<int32_t> &p : prompts) {
      ids.push_back(addLocked(p, params));
      owned.insert(ids.back());
    }
  }
  try {
    // ids[0, done) have finished (each id finishes once, so a cursor does).
    size_t done = 0;
    while (true) {
      if (keepGoing && !keepGoing())
        throw Interrupted("generate: interrupted; its unfinished requests "
                          "were aborted");
      std::lock_guard<std::mutex> lock(mu);
      while (done < ids.size() && finished.count(ids[done]))
        ++done;
      if (done == ids.size())
        break;
      if (requests.empty())
        throw rt::Error("engine: internal: requests vanished");
      stepLocked();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu);
    for (int64_t id : ids) {
      auto it = requests.find(id);
      if (it != requests.end())
        finish(*it->second, "abort");
      finished.erase(id);
      owned.erase(id);
    }
    throw;
  }
  std::lock_guard<std::mutex> lock(mu);
  std::vector<RequestOutput> ordered;
  for (int64_t id : ids) {
    auto it = finished.find(id);
    ordered.push_back(std::move(it->second));
    finished.erase(it);
    owned.erase(id);
  }
  return ordered;
}

std::vector<float> Engine::promptLogits(const std::vector<int32_t> &prompt) {
  std::lock_guard<std::mutex> lock(mu);
  rt::Session &s = runner.session();
  const rt::SeqId seq = s.addSequence();
  try {
    std::vector<float> out = runner.forwardLogits({seq}, {prompt}, {false});
    s.release(seq);
    return out;
  } catch (...) {
    s.release(seq);
    throw;
  }
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu);
  EngineStats s = counters;
  s.running = scheduler->numRunning();
  s.waiting = scheduler->numWaiting();
  s.pagesTotal = runner.session().config().numPages;
  s.pagesUsed = s.pagesTotal - runner.session().freePages();
  const rt::SessionStats t = runner.session().stats();
  s.listsAttended = t.listsAttended;
  s.blocksAttended = t.blocksAttended;
  s.blocksAvailable = t.blocksAvailable;
  s.blocksEvicted = t.blocksEvicted;
  s.pagesReclaimed = t.pagesReclaimed;
  s.tokensEvicted = t.tokensEvicted;
  s.massRecallSum = t.massRecallSum;
  s.massRecallCount = t.massRecallCount;
  return s;
}
