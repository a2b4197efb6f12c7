//===- Scheduler.cpp - Which requests a step runs, and how much -----------===//

#include "Scheduler.h"

#include <algorithm>

using namespace vflow;
using namespace vflow::model;
using namespace vflow::model::engine;

Scheduler::Scheduler(rt::Session &session, PrefixCache &cache, int maxBatch,
                     int64_t maxTokensPerStep, int64_t window)
    : session(session), cache(cache), maxBatch(maxBatch),
      maxTokensPerStep(maxTokensPerStep), window(window) {}

void Scheduler::remove(const Request &r) {
  running.erase(std::remove(running.begin(), running.end(), &r), running.end());
  waiting.erase(std::remove(waiting.begin(), waiting.end(), &r), waiting.end());
}

int64_t Scheduler::chunk(int64_t remaining, int64_t budgetLeft) const {
  if (remaining <= budgetLeft)
    return remaining;
  // Leave the last chunk the whole observation window (unless the step's
  // budget is smaller than the window).
  if (remaining - window >= 1)
    return std::min(budgetLeft, remaining - window);
  return budgetLeft;
}

bool Scheduler::makeRoom(int64_t pages) {
  while (session.freePages() < pages && cache.evictOne()) {
  }
  return session.freePages() >= pages;
}

void Scheduler::preempt(Request &r, EngineStats &stats) {
  r.countAttended(session, *r.seq);
  session.release(*r.seq);
  r.seq.reset();
  r.computed = 0;
  running.erase(std::remove(running.begin(), running.end(), &r), running.end());
  waiting.push_front(&r);
  ++stats.preemptions;
}

void Scheduler::attach(Request &r) {
  // A prefix hit: full blocks another request computed, at least one token
  // (and the observation window) left to compute.
  const int64_t blocks =
      std::max<int64_t>(0, int64_t(r.tokens.size()) -
                               std::max<int64_t>(1, window)) /
      session.flow().blockSize;
  if (std::optional<PrefixCache::Hit> hit = cache.share(r.tokens, blocks)) {
    r.seq = hit->seq;
    r.computed = hit->tokens;
    return;
  }
  r.seq = session.addSequence();
  r.computed = 0;
}

void Scheduler::add(StepBatch &batch, Request &r, int64_t n) {
  const int64_t total = int64_t(r.tokens.size());
  StepRow row;
  row.request = &r;
  row.tokens.assign(r.tokens.begin() + r.computed,
                    r.tokens.begin() + r.computed + n);
  row.decode = n == 1 && r.computed + 1 == total && total > r.promptLen;
  batch.rows.push_back(std::move(row));
  reserved += session.pagesNeeded(*r.seq, n);
  budget -= n;
}

StepBatch Scheduler::schedule(EngineStats &stats) {
  StepBatch batch;
  budget = maxTokensPerStep;
  reserved = 0;
  // Running requests first: the next token, or the next chunk of a prompt.
  bool preempted = false;
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    Request &r = *running[i];
    const int64_t n = chunk(int64_t(r.tokens.size()) - r.computed, budget);
    bool selfPreempted = false;
    while (!makeRoom(reserved + session.pagesNeeded(*r.seq, n))) {
      Request &victim = *running.back();
      preempt(victim, stats);
      preempted = true;
      if (&victim == &r) {
        selfPreempted = true;
        break;
      }
    }
    if (selfPreempted)
      break;
    add(batch, r, n);
  }
  // Then waiting ones, unless this step preempted (as vLLM does).
  while (!preempted && budget > 0 && !waiting.empty() &&
         int64_t(running.size()) < maxBatch) {
    Request &r = *waiting.front();
    if (!r.seq)
      attach(r);
    const int64_t n = chunk(int64_t(r.tokens.size()) - r.computed, budget);
    if (!makeRoom(reserved + session.pagesNeeded(*r.seq, n))) {
      // It waits for pages holding none: the prefix it shares (whose holder
      // makeRoom evicted) would pin pages that the requests ahead of it,
      // preempted ones included, may need, and nothing would free them.
      session.release(*r.seq);
      r.seq.reset();
      r.computed = 0;
      if (running.empty() && batch.rows.empty())
        batch.stalled = &r;
      break;
    }
    // The lookup and a hit are counted once it is admitted.
    if (cache.enabled())
      ++stats.prefixQueries;
    if (r.computed > 0) {
      ++stats.prefixHits;
      stats.prefixHitTokens += r.computed;
    }
    waiting.pop_front();
    running.push_back(&r);
    add(batch, r, n);
  }
  return batch;
}
