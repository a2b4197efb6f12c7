//===- Engine.h - Continuous batching over a model runner -------*- C++ -*-===//
//
// The serving engine: requests (prompt token ids and sampling params) are
// scheduled step by step under one token budget, running requests first
// (one token each, or the next chunk of a prompt), then waiting ones
// (chunked prefill), as vLLM's v1 scheduler does. Full blocks of finished
// requests stay cached for prefix hits (a hash chain over the blocks'
// tokens, an LRU of the sequences holding them; a hit shares pages and
// cache fields, the flow's states start fresh, so it is exact). When the
// pool runs out, cached prefixes are evicted, then the last running
// request is preempted and later recomputed. A request that can never run
// (too long for the model or the pool) finishes with an error; the others
// go on.
//
//   Engine e(weights, flow, cfg);     // flow may be null: dense
//   int64_t id = e.addRequest(prompt, params);
//   while (e.hasUnfinished())
//     for (RequestOutput &o : e.step()) ...   // finished this step
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_ENGINE_H
#define VFLOW_MODEL_ENGINE_H

#include "vflow/Model/Runner.h"
#include "vflow/Model/Sampling.h"

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace vflow::model {

struct EngineConfig {
  RunnerConfig runner;
  /// Requests running at once, and tokens one step computes.
  int maxBatch = 64;
  int64_t maxTokensPerStep = 2048;
  bool prefixCaching = true;
  uint64_t seed = 0;
};

struct RequestOutput {
  int64_t id = 0;
  std::vector<int32_t> promptTokens, tokens;
  /// "length", "stop", "abort" or "error".
  std::string finishReason;
  std::string error;
};

struct EngineStats {
  int64_t running = 0, waiting = 0, pagesUsed = 0, pagesTotal = 0;
  int64_t prefixQueries = 0, prefixHits = 0, prefixHitTokens = 0;
  int64_t steps = 0, preemptions = 0, tokensComputed = 0;
  /// Decode attention so far (the session's telemetry): (sequence, layer,
  /// KV head) block lists, the blocks they attended and the blocks their
  /// sequences had; dense layers attend all of them.
  int64_t listsAttended = 0, blocksAttended = 0, blocksAvailable = 0;
  /// With RunnerConfig::massRecall: rt::SessionStats::massRecallSum and
  /// massRecallCount (the share of dense attention's mass each sparse
  /// layer's decodes attended, per query head).
  std::vector<double> massRecallSum;
  std::vector<int64_t> massRecallCount;
  /// Cumulative milliseconds: the model's GEMMs, attention, the rest of
  /// the forward, sampling and the host (scheduling).
  double gemmMs = 0, attentionMs = 0, otherMs = 0, samplingMs = 0, hostMs = 0;
  /// Decode steps replayed from CUDA graphs (their split is not measured).
  double graphMs = 0;
  /// The flow's index stage (CPU backend; on the GPU it is in attention).
  double indexMs = 0;
};

class Engine {
public:
  Engine(const ModelWeights &weights, const rt::FlowArtifact *flow,
         const EngineConfig &config);
  ~Engine();

  const ModelConfig &modelConfig() const { return runner.config(); }
  ModelRunner &modelRunner() { return runner; }

  /// Queues a request; returns its id. Bad params throw rt::Error; a
  /// prompt that cannot run finishes with an error at the next step.
  int64_t addRequest(std::vector<int32_t> prompt, const SamplingParams &params);
  /// Finishes a request now ("abort"), freeing its pages; its output so
  /// far, or nothing for an id that is not running or waiting.
  std::optional<RequestOutput> abort(int64_t id);
  bool hasUnfinished() const { return !requests.empty(); }
  /// One scheduling step and forward; returns the requests that finished.
  std::vector<RequestOutput> step();
  /// Runs every prompt to the end; outputs in prompt order.
  std::vector<RequestOutput>
  generate(const std::vector<std::vector<int32_t>> &prompts,
           const SamplingParams &params);

  EngineStats stats() const;
  /// Releases every cached prefix.
  void clearPrefixCache();

private:
  struct Request;
  struct Holder;
  RequestOutput finish(Request &r, const std::string &reason,
                       const std::string &error = "");
  bool makeRoom(int64_t pages, Request *self);
  void cacheBlocks(Request &r);
  void evictHolder();
  std::vector<uint64_t> blockHashes(const std::vector<int32_t> &tokens,
                                    int64_t blocks) const;

  EngineConfig cfg;
  /// The observation window when the flow reads `mass` (else 0): a
  /// prompt's last prefill chunk holds at least that many tokens (prefix
  /// hits and chunking leave them), so the window is the prompt's last
  /// tokens however the prompt was split.
  int64_t window = 0;
  /// The tokens of a prompt chunk of at most `budget` of `remaining`.
  int64_t chunk(int64_t remaining, int64_t budget) const;
  ModelRunner runner;
  int64_t nextId = 0;
  std::map<int64_t, std::unique_ptr<Request>> requests;
  std::vector<int64_t> running; ///< in admission order
  std::deque<int64_t> waiting;
  /// Prefix cache: finished sequences holding full blocks, least recently
  /// used first, and the chain hash of each block -> (holder, blocks).
  std::list<Holder> holders;
  std::unordered_map<uint64_t, std::pair<std::list<Holder>::iterator, int64_t>>
      cached;
  EngineStats counters;
};

} // namespace vflow::model

#endif // VFLOW_MODEL_ENGINE_H
