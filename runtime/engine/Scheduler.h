//===- Scheduler.h - Which requests a step runs, and how much ---*- C++ -*-===//
//
// vLLM v1's policy under one token budget (max_tokens_per_step): running
// requests first, in admission order, each its next token or the next chunk
// of its prompt; when the pool cannot hold a row's pages, cached prefixes
// are evicted, then the last running request is preempted (its pages freed,
// recomputed later from the front of the queue). Then waiting requests, in
// order, while there is budget, a free batch slot and pages (a prefix hit
// shares cached blocks first), unless this step preempted. How many pages a
// row needs is the session's answer (Session::pagesNeeded).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_ENGINE_SCHEDULER_H
#define VFLOW_RUNTIME_ENGINE_SCHEDULER_H

#include "PrefixCache.h"
#include "Request.h"

#include "vflow/Engine/Engine.h"

#include <deque>
#include <vector>

namespace vflow::model::engine {

/// One row of a step: a request and the tokens it feeds; `decode` when they
/// are one generated token whose context is computed (attended through the
/// flow), else prompt tokens (causal, dense).
struct StepRow {
  Request *request = nullptr;
  std::vector<int32_t> tokens;
  bool decode = false;
};

struct StepBatch {
  std::vector<StepRow> rows;
  /// Set when nothing runs and the first waiting request cannot get its
  /// pages even from the whole pool: it can never run as things stand.
  Request *stalled = nullptr;
};

class Scheduler {
public:
  /// `window`: the observation window a prompt's last chunk keeps whole
  /// (0: none).
  Scheduler(rt::Session &session, PrefixCache &cache, int maxBatch,
            int64_t maxTokensPerStep, int64_t window);

  void add(Request &r) { waiting.push_back(&r); }
  /// Forgets `r` (finished or aborted; its sequence is the caller's).
  void remove(const Request &r);
  const std::deque<Request *> &waitingRequests() const { return waiting; }
  int64_t numRunning() const { return int64_t(running.size()); }
  int64_t numWaiting() const { return int64_t(waiting.size()); }

  /// The next step's rows; the sequences of admitted requests are made
  /// (or shared from the prefix cache), counted in `stats`.
  StepBatch schedule(EngineStats &stats);

private:
  /// The tokens of a prompt chunk of at most `budget` of `remaining`.
  int64_t chunk(int64_t remaining, int64_t budget) const;
  /// Whether `pages` are free, after evicting cached prefixes for them.
  bool makeRoom(int64_t pages);
  void preempt(Request &r, EngineStats &stats);
  /// Gives the waiting `r` a sequence: a prefix hit or a new one.
  void attach(Request &r);
  void add(StepBatch &batch, Request &r, int64_t n);

  rt::Session &session;
  PrefixCache &cache;
  int maxBatch;
  int64_t maxTokensPerStep, window;
  std::vector<Request *> running; ///< in admission order
  std::deque<Request *> waiting;
  /// This step's budget left and the pages its rows reserved.
  int64_t budget = 0, reserved = 0;
};

} // namespace vflow::model::engine

#endif // VFLOW_RUNTIME_ENGINE_SCHEDULER_H
