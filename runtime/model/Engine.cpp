//===- Engine.cpp - Continuous batching over a model runner ---------------===//

#include "vflow/Model/Engine.h"

#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

using namespace vflow;
using namespace vflow::model;

namespace {

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 29);
}

} // namespace

void SamplingParams::validate() const {
  if (maxTokens < 1)
    throw rt::Error("max_tokens must be >= 1, got " +
                    std::to_string(maxTokens));
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw rt::Error("temperature must be finite and >= 0, got " +
                    std::to_string(temperature));
  if (!(topP > 0 && topP <= 1))
    throw rt::Error("top_p must be in (0, 1], got " + std::to_string(topP));
  if (topK < 0)
    throw rt::Error("top_k must be >= 0 (0: no limit), got " +
                    std::to_string(topK));
}

int32_t vflow::model::sampleToken(const float *logits, int64_t vocab,
                                  const RowSampling &row) {
  const float lowest = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isfinite(logits[i]))
      return kNonFiniteLogits;
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best])
      best = i;
  if (row.temperature <= 0)
    return int32_t(best);
  const float top = logits[best];
  auto weight = [&](float l) { return std::exp((l - top) / row.temperature); };
  std::vector<float> sorted(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    sorted[size_t(i)] = logits[i];
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  // Top-k: at least the k-th largest logit (ties kept).
  float threshold = lowest;
  if (row.topK > 0 && row.topK < vocab)
    threshold = sorted[size_t(row.topK - 1)];
  double kept = 0;
  for (float l : sorted)
    if (l >= threshold)
      kept += weight(l);
  // Top-p: the largest logit whose tokens and those above hold top_p.
  if (row.topP < 1) {
    double mass = 0;
    for (size_t i = 0; i < sorted.size() && sorted[i] >= threshold;) {
      const float v = sorted[i];
      for (; i < sorted.size() && sorted[i] == v; ++i)
        mass += weight(v);
      if (mass >= double(row.topP) * kept) {
        threshold = v;
        kept = mass;
        break;
      }
    }
  }
  double u = uniformDraw(row.seed, row.counter) * kept;
  int64_t last = best;
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (l < threshold)
      continue;
    last = i;
    u -= weight(l);
    if (u < 0)
      return int32_t(i);
  }
  return int32_t(last);
}

struct Engine::Request {
  int64_t id = 0;
  std::vector<int32_t> tokens; ///< the prompt, then what was generated
  int64_t promptLen = 0;
  SamplingParams params;
  uint64_t seed = 0; ///< the request's sampling stream
  std::optional<rt::SeqId> seq;
  int64_t computed = 0; ///< tokens whose K/V the sequence holds
  std::string error;    ///< set: finishes with this error at the next step
  int64_t generated() const { return int64_t(tokens.size()) - promptLen; }
};

struct Engine::Holder {
  rt::SeqId seq = 0;
  std::vector<int32_t> tokens; ///< its full blocks' tokens
  std::vector<uint64_t> hashes;
};

Engine::Engine(const ModelWeights &weights, const rt::FlowArtifact *flow,
               const EngineConfig &config)
    : cfg(config), runner(weights, flow, config.runner) {
  if (cfg.maxBatch < 1 || cfg.maxTokensPerStep < 1)
    throw rt::Error("engine: max_batch and max_tokens_per_step must be >= 1");
  if (cfg.runner.observeTokens < 0)
    throw rt::Error("engine: observe_tokens must be >= 0");
  if (flow && flow->readsInput("mass") &&
      cfg.runner.denseLayers < runner.config().numLayers)
    window = cfg.runner.observeTokens;
}

int64_t Engine::chunk(int64_t remaining, int64_t budget) const {
  if (remaining <= budget)
    return remaining;
  // Leave the last chunk the whole observation window (unless the step's
  // budget is smaller than the window).
  if (remaining - window >= 1)
    return std::min(budget, remaining - window);
  return budget;
}

Engine::~Engine() = default;

std::vector<uint64_t> Engine::blockHashes(const std::vector<int32_t> &tokens,
                                          int64_t blocks) const {
  const int64_t bs = runner.blockSize();
  std::vector<uint64_t> out;
  uint64_t h = 0x6a09e667f3bcc908ULL;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t t = b * bs; t < (b + 1) * bs; ++t)
      h = mix(h, uint64_t(uint32_t(tokens[size_t(t)])));
    out.push_back(h);
  }
  return out;
}

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
  const int64_t pool = cfg.runner.numPages;
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
               std::to_string(m.maxPositions);
  if (r->error.empty() && ceilDiv(longest, bs) > pool)
    r->error = "the prompt of " + std::to_string(r->promptLen) +
               " tokens and max_tokens " + std::to_string(params.maxTokens) +
               " need " + std::to_string(ceilDiv(longest, bs)) +
               " pages of the KV pool, which has " + std::to_string(pool);
  const int64_t id = r->id;
  requests[id] = std::move(r);
  waiting.push_back(id);
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

RequestOutput Engine::finish(Request &r, const std::string &reason,
                             const std::string &error) {
  RequestOutput out;
  out.id = r.id;
  out.promptTokens.assign(r.tokens.begin(), r.tokens.begin() + r.promptLen);
  out.tokens.assign(r.tokens.begin() + r.promptLen, r.tokens.end());
  out.finishReason = reason;
  out.error = error;
  if (r.seq)
    cacheBlocks(r);
  running.erase(std::remove(running.begin(), running.end(), r.id),
                running.end());
  waiting.erase(std::remove(waiting.begin(), waiting.end(), r.id),
                waiting.end());
  requests.erase(r.id);
  return out;
}

void Engine::cacheBlocks(Request &r) {
  rt::Session &s = runner.session();
  const int64_t bs = runner.blockSize(), blocks = r.computed / bs;
  const rt::SeqId seq = *r.seq;
  r.seq.reset();
  std::vector<uint64_t> hashes;
  if (cfg.prefixCaching && blocks > 0)
    hashes = blockHashes(r.tokens, blocks);
  if (hashes.empty() || cached.count(hashes.back())) {
    s.release(seq); // nothing new to keep
    return;
  }
  Holder h;
  h.seq = seq;
  h.tokens.assign(r.tokens.begin(), r.tokens.begin() + blocks * bs);
  h.hashes = hashes;
  holders.push_back(std::move(h));
  auto it = std::prev(holders.end());
  for (int64_t b = 0; b < blocks; ++b)
    cached.emplace(hashes[size_t(b)], std::make_pair(it, b + 1));
  // Holders are live sequences: they must leave the session's sequence
  // slots to the running requests (and one being admitted).
  const int64_t cap =
      std::max<int64_t>(0, int64_t(cfg.runner.maxSequences) - cfg.maxBatch - 1);
  while (int64_t(holders.size()) > cap)
    evictHolder();
}

void Engine::evictHolder() {
  auto it = holders.begin();
  for (uint64_t h : it->hashes) {
    auto found = cached.find(h);
    if (found != cached.end() && found->second.first == it)
      cached.erase(found);
  }
  runner.session().release(it->seq);
  holders.erase(it);
}

void Engine::clearPrefixCache() {
  std::lock_guard<std::mutex> lock(mu);
  while (!holders.empty())
    evictHolder();
}

bool Engine::makeRoom(int64_t pages, Request *) {
  while (runner.session().freePages() < pages && !holders.empty())
    evictHolder();
  return runner.session().freePages() >= pages;
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

void Engine::refuseUnrunnable() {
  if (!running.empty() || waiting.empty())
    return;
  Request &r = *requests.at(waiting.front());
  const int64_t bs = runner.blockSize();
  const int64_t need = ceilDiv(int64_t(r.tokens.size()), bs);
  const std::string error =
      "the request's " + std::to_string(r.tokens.size()) + " tokens need " +
      std::to_string(need) + " pages of the KV pool, and only " +
      std::to_string(runner.session().freePages()) + " of its " +
      std::to_string(cfg.runner.numPages) +
      " are free with nothing else running (pages held elsewhere in the "
      "session)";
  finished[r.id] = finish(r, "error", error);
}

void Engine::stepLocked() {
  const auto hostStart = Clock::now();
  double modelMs = 0, samplingMs = 0;
  auto done = [&](RequestOutput o) { finished[o.id] = std::move(o); };
  // Requests that cannot run finish now.
  // (Collected first: finish() erases from `waiting`.)
  std::vector<int64_t> failed;
  for (int64_t id : waiting)
    if (!requests.at(id)->error.empty())
      failed.push_back(id);
  for (int64_t id : failed) {
    Request &r = *requests.at(id);
    done(finish(r, "error", r.error));
  }
  const int64_t bs = runner.blockSize();
  int64_t budget = cfg.maxTokensPerStep, reserved = 0;
  std::vector<Request *> batch;
  std::vector<std::vector<int32_t>> feed;
  std::vector<bool> decode;
  auto pagesFor = [&](const Request &r, int64_t n) {
    return ceilDiv(r.computed + n, bs) - ceilDiv(r.computed, bs);
  };
  auto room = [&](int64_t pages) {
    return makeRoom(reserved + pages, nullptr);
  };
  auto schedule = [&](Request &r, int64_t n) {
    const int64_t total = int64_t(r.tokens.size());
    batch.push_back(&r);
    feed.emplace_back(r.tokens.begin() + r.computed,
                      r.tokens.begin() + r.computed + n);
    // One generated token whose context is computed: a decode row.
    decode.push_back(n == 1 && r.computed + 1 == total && total > r.promptLen);
    reserved += pagesFor(r, n);
    budget -= n;
  };
  auto preempt = [&](Request &r) {
    runner.session().release(*r.seq);
    r.seq.reset();
    r.computed = 0;
    running.erase(std::remove(running.begin(), running.end(), r.id),
                  running.end());
    waiting.push_front(r.id);
    ++counters.preemptions;
  };
  // Running requests first: the next token, or the next chunk of a prompt.
  bool preempted = false;
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    Request &r = *requests.at(running[i]);
    const int64_t n = chunk(int64_t(r.tokens.size()) - r.computed, budget);
    bool selfPreempted = false;
    while (!room(pagesFor(r, n))) {
      Request &victim = *requests.at(running.back());
      preempt(victim);
      preempted = true;
      if (&victim == &r) {
        selfPreempted = true;
        break;
      }
    }
    if (selfPreempted)
      break;
    schedule(r, n);
  }
  // Then waiting ones, unless this step preempted (as vLLM does).
  while (!preempted && budget > 0 && !waiting.empty() &&
         int64_t(running.size()) < cfg.maxBatch) {
    Request &r = *requests.at(waiting.front());
    rt::Session &s = runner.session();
    if (!r.seq) {
      // A prefix hit: full blocks another request computed, at least one
      // token (and the observation window) left to compute.
      int64_t matched = 0;
      Holder *holder = nullptr;
      if (cfg.prefixCaching) {
        const int64_t blocks =
            std::max<int64_t>(0, int64_t(r.tokens.size()) -
                                     std::max<int64_t>(1, window)) /
            bs;
        std::vector<uint64_t> hashes = blockHashes(r.tokens, blocks);
        for (int64_t b = blocks; b > 0; --b) {
          auto found = cached.find(hashes[size_t(b - 1)]);
          if (found == cached.end())
            continue;
          Holder &h = *found->second.first;
          if (std::equal(r.tokens.begin(), r.tokens.begin() + b * bs,
                         h.tokens.begin())) {
            matched = b;
            holder = &h;
            holders.splice(holders.end(), holders, found->second.first);
          }
          break;
        }
      }
      if (holder) {
        r.seq = s.sharePrefix(holder->seq, matched * bs);
        r.computed = matched * bs;
      } else {
        r.seq = s.addSequence();
        r.computed = 0;
      }
    }
    const int64_t n = chunk(int64_t(r.tokens.size()) - r.computed, budget);
    if (!room(pagesFor(r, n))) {
      // It waits for pages holding none: the prefix it shares (whose
      // holder room() evicted) would pin pages that the requests ahead of
      // it, preempted ones included, may need, and nothing would free them.
      s.release(*r.seq);
      r.seq.reset();
      r.computed = 0;
      break;
    }
    // The lookup and a hit are counted once it is admitted.
    if (cfg.prefixCaching)
      ++counters.prefixQueries;
    if (r.computed > 0) {
      ++counters.prefixHits;
      counters.prefixHitTokens += r.computed;
    }
    waiting.pop_front();
    running.push_back(r.id);
    schedule(r, n);
  }
  if (batch.empty() && !preempted)
    refuseUnrunnable();
  if (!batch.empty()) {
    std::vector<rt::SeqId> seqs;
    for (Request *r : batch)
      seqs.push_back(*r->seq);
    // Every row draws (its draw number: the tokens it generated so far);
    // rows still inside their prompt ignore theirs.
    std::vector<RowSampling> draws;
    for (Request *r : batch) {
      RowSampling d;
      d.temperature = float(r->params.temperature);
      d.topP = float(r->params.topP);
      d.topK = r->params.topK;
      d.seed = r->seed;
      d.counter = uint64_t(r->generated());
      draws.push_back(d);
    }
    const auto t0 = Clock::now();
    std::vector<int32_t> next;
    try {
      next = runner.forward(seqs, feed, decode, draws);
    } catch (const rt::Error &e) {
      for (Request *r : batch)
        done(finish(*r, "error", e.what()));
      counters.hostMs += msSince(hostStart);
      return;
    }
    modelMs = msSince(t0);
    const ForwardTimes &ft = runner.lastTimes();
    counters.gemmMs += ft.gemmMs;
    counters.attentionMs += ft.attentionMs;
    counters.otherMs += ft.otherMs;
    counters.graphMs += ft.graphMs;
    counters.indexMs += ft.indexMs;
    samplingMs = ft.samplingMs;
    ++counters.steps;
    const ModelConfig &m = runner.config();
    for (size_t i = 0; i < batch.size(); ++i) {
      Request &r = *batch[i];
      r.computed += int64_t(feed[i].size());
      counters.tokensComputed += int64_t(feed[i].size());
      if (r.computed < int64_t(r.tokens.size()))
        continue; // a prompt chunk: more to come
      const int32_t t = next[i];
      if (t == kNonFiniteLogits) {
        done(finish(r, "error",
                    "the model's logits for token " +
                        std::to_string(r.generated() + 1) +
                        " hold NaN or infinity: its weights or activations "
                        "are not finite (a broken or overflowing model "
                        "file?)"));
        continue;
      }
      r.tokens.push_back(t);
      const bool eos = !r.params.ignoreEos &&
                       std::find(m.eosTokenIds.begin(), m.eosTokenIds.end(),
                                 t) != m.eosTokenIds.end();
      if (eos)
        done(finish(r, "stop"));
      else if (r.generated() >= r.params.maxTokens ||
               (m.maxPositions > 0 &&
                int64_t(r.tokens.size()) >= m.maxPositions))
        done(finish(r, "length"));
    }
  }
  counters.samplingMs += samplingMs;
  counters.hostMs += msSince(hostStart) - modelMs;
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
  s.running = int64_t(running.size());
  s.waiting = int64_t(waiting.size());
  s.pagesTotal = cfg.runner.numPages;
  s.pagesUsed = s.pagesTotal - runner.session().freePages();
  const rt::SessionStats t = runner.session().stats();
  s.listsAttended = t.listsAttended;
  s.blocksAttended = t.blocksAttended;
  s.blocksAvailable = t.blocksAvailable;
  s.massRecallSum = t.massRecallSum;
  s.massRecallCount = t.massRecallCount;
  return s;
}
