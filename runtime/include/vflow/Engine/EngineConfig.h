//===- EngineConfig.h - The serving engine's one config ---------*- C++ -*-===//
//
// Everything vflow.LLM, `vflow bench`, `vflow eval` and C++ users set on
// the serving engine, with its one set of defaults; validate() is the one
// check (Engine's constructor runs it), whose messages name the options as
// Python spells them. The runner's and the session's sizes are derived from
// it (runnerConfig), never set twice.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_ENGINE_ENGINECONFIG_H
#define VFLOW_ENGINE_ENGINECONFIG_H

#include "vflow/Model/Runner.h"

#include <cstdint>

namespace vflow::model {

struct EngineConfig {
  /// The model's side: device, dense layers, KV dtype, block size (with no
  /// flow; a flow brings its own), JIT cache, CUDA graphs, mass recall,
  /// observation window. Its pool and batch sizes are not read: they come
  /// from the fields below (runnerConfig).
  RunnerConfig runner;
  /// Requests running at once (max_batch), and tokens one step computes
  /// (max_tokens_per_step).
  int maxBatch = 64;
  int64_t maxTokensPerStep = 2048;
  /// Tokens the KV pool holds per layer (kv_pool_tokens), in pages of the
  /// flow's block size.
  int64_t kvPoolTokens = 32768;
  bool prefixCaching = true; ///< enable_prefix_caching
  /// Where every request's sampling stream comes from (a request's own
  /// seed overrides it).
  uint64_t seed = 0;

  /// Throws rt::Error naming the first bad option ("max_batch: 0 is out of
  /// range (must be >= 1)").
  void validate() const;
  /// The runner's config for a flow of `blockSize` tokens per block: the
  /// pool in pages, the batch, and the session's sequence slots (the
  /// running requests, one being admitted, one for prompt logits, and the
  /// prefix cache's holders when it is on).
  RunnerConfig runnerConfig(int64_t blockSize) const;
};

} // namespace vflow::model

#endif // VFLOW_ENGINE_ENGINECONFIG_H
