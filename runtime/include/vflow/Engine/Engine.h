//===- Engine.h - Continuous batching over a model runner -------*- C++ -*-===//
//
// The serving engine: requests (prompt token ids and sampling params) are
// scheduled step by step under one token budget, running requests first
// (one token each, or the next chunk of a prompt), then waiting ones
// (chunked prefill), as vLLM's v1 scheduler does. A prompt's full blocks
// are cached once it is computed (so a request's other samples share them
// while it runs), a finished request's when it ends (a hash chain over the
// blocks' tokens, an LRU of the sequences holding them; a hit shares pages and
// cache fields, the flow's states start fresh, so it is exact). When the
// pool runs out, cached prefixes are evicted, then the last running
// request is preempted and later recomputed. A request that can never run
// (too long for the model or the pool) finishes with an error; the others
// go on. A request whose logits hold NaN or infinity (broken weights or
// inputs) finishes with an error instead of a token.
//
//   Engine e(weights, flow, cfg);     // flow may be null: dense
//   int64_t id = e.addRequest(prompt, params);
//   while (e.hasUnfinished())
//     for (RequestOutput &o : e.step()) ...   // finished this step
//
// Threads: every method may be called from any thread at any time; calls
// run one at a time (a mutex per engine), generate() releases it between
// steps, so generate() calls of several threads share their steps (one
// batch) and each returns its own outputs. step() returns the finished
// requests that no running generate() is waiting for.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_ENGINE_ENGINE_H
#define VFLOW_ENGINE_ENGINE_H

#include "vflow/Engine/EngineConfig.h"
#include "vflow/Model/Runner.h"
#include "vflow/Model/Sampling.h"
#include "vflow/Runtime/Error.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace vflow::model {

namespace engine {
struct Request;
class PrefixCache;
class Scheduler;
struct StepBatch;
} // namespace engine

struct RequestOutput {
  int64_t id = 0;
  std::vector<int32_t> promptTokens, tokens;
  /// "length", "stop", "abort" or "error".
  std::string finishReason;
  std::string error;
  /// With SamplingParams::logprobs >= 0: one per generated token.
  std::vector<TokenLogprobs> logprobs;
  /// Blocks its decodes attended, and the blocks its sequence had then
  /// (summed over layers and KV heads; Session::sequenceStats).
  int64_t blocksAttended = 0, blocksAvailable = 0;
  /// Complete blocks a flow's retain block evicted from it (each held
  /// pageSize tokens), and every token evicted from it.
  int64_t blocksEvicted = 0, tokensEvicted = 0;
};

/// What a request generated from some index on (Engine::generatedSince).
struct Generated {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs; ///< when the request asked for them
};

struct EngineStats {
  int64_t running = 0, waiting = 0, pagesUsed = 0, pagesTotal = 0;
  int64_t prefixQueries = 0, prefixHits = 0, prefixHitTokens = 0;
  int64_t steps = 0, preemptions = 0, tokensComputed = 0;
  /// Decode attention so far (the session's telemetry): (sequence, layer,
  /// KV head) block lists, the blocks they attended and the blocks their
  /// sequences had; dense layers attend all of them.
  int64_t listsAttended = 0, blocksAttended = 0, blocksAvailable = 0;
  /// A flow's retain block: blocks evicted, pages returned to the pool;
  /// tokens evicted in all.
  int64_t blocksEvicted = 0, pagesReclaimed = 0, tokensEvicted = 0;
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

/// generate() was stopped by its keepGoing callback; its requests were
/// aborted (their pages freed).
class Interrupted : public rt::Error {
public:
  using rt::Error::Error;
};

class Engine {
public:
  Engine(const ModelWeights &weights, const rt::FlowArtifact *flow,
         const EngineConfig &config);
  ~Engine();

  const ModelConfig &modelConfig() const { return runner.config(); }
  /// The runner, for tools and tests; not synchronized: use it only while
  /// no other thread uses the engine.
  ModelRunner &modelRunner() { return runner; }

  /// Queues a request; returns its id. Bad params throw rt::Error; a
  /// prompt that cannot run finishes with an error at the next step.
  int64_t addRequest(std::vector<int32_t> prompt, const SamplingParams &params);
  /// Finishes a request now ("abort"), freeing its pages; its output so
  /// far, or nothing for an id that is not running or waiting.
  std::optional<RequestOutput> abort(int64_t id);
  /// Requests running or waiting, or finished outputs step() has yet to
  /// return.
  bool hasUnfinished() const;
  /// The tokens request `id` generated from its `from`-th on, while it runs
  /// or waits or until step() returns its output (a server streams them
  /// step by step); nothing for another id.
  std::optional<Generated> generatedSince(int64_t id, int64_t from) const;
  /// One scheduling step and forward; returns the requests that finished
  /// (in it or in another thread's generate() steps) and that no running
  /// generate() is waiting for.
  std::vector<RequestOutput> step();
  /// Runs every prompt to the end; outputs in prompt order. `keepGoing`,
  /// when given, is called between steps (without the engine's lock);
  /// false aborts this call's requests and throws Interrupted.
  std::vector<RequestOutput>
  generate(const std::vector<std::vector<int32_t>> &prompts,
           const SamplingParams &params,
           const std::function<bool()> &keepGoing = {});

  /// The logits after `prompt` (a fresh sequence, prefilled at once and
  /// released; no request): for comparisons with other implementations.
  std::vector<float> promptLogits(const std::vector<int32_t> &prompt);

  EngineStats stats() const;
  /// Releases every cached prefix.
  void clearPrefixCache();

private:
  using Request = engine::Request;
  int64_t addLocked(std::vector<int32_t> prompt, const SamplingParams &params);
  /// One step: schedule, run, apply; the requests that finished go to
  /// `finished`.
  void stepLocked();
  /// Runs the batch's rows through the model: each row's next token, or an
  /// error (then every row of the step finishes with it).
  std::optional<std::string>
  run(const engine::StepBatch &batch, std::vector<int32_t> &next,
      std::vector<std::optional<TokenLogprobs>> &logprobs);
  /// A step whose rows ask for log-probabilities: the logits on the host,
  /// every row drawn there (sampleToken), the asked log-probabilities.
  void sampleOnHost(const std::vector<rt::SeqId> &seqs,
                    const std::vector<std::vector<int32_t>> &feed,
                    const std::vector<bool> &decode,
                    const std::vector<RowSampling> &draws,
                    const engine::StepBatch &batch, std::vector<int32_t> &next,
                    std::vector<std::optional<TokenLogprobs>> &logprobs);
  /// Appends each row's token (and its log-probabilities) and finishes the
  /// requests that end.
  void apply(const engine::StepBatch &batch, const std::vector<int32_t> &next,
             std::vector<std::optional<TokenLogprobs>> &logprobs);
  /// Finishes `r` now (its full blocks go to the prefix cache, it leaves
  /// the engine); its output.
  RequestOutput finish(Request &r, const std::string &reason,
                       const std::string &error = "");
  /// finish(), the output kept for step() or the generate() waiting for it.
  void finishStep(Request &r, const std::string &reason,
                  const std::string &error = "");

  EngineConfig cfg;
  ModelRunner runner;
  std::unique_ptr<engine::PrefixCache> cache;
  std::unique_ptr<engine::Scheduler> scheduler;
  int64_t nextId = 0;
  std::map<int64_t, std::unique_ptr<Request>> requests;
  EngineStats counters;
  /// Guards everything above; held for one call or one step.
  mutable std::mutex mu;
  /// Outputs of finished requests not yet returned, and the ids that
  /// running generate() calls wait for.
  std::map<int64_t, RequestOutput> finished;
  std::set<int64_t> owned;
};

} // namespace vflow::model

#endif // VFLOW_ENGINE_ENGINE_H
