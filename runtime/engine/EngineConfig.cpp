//===- EngineConfig.cpp - The serving engine's one config -----------------===//

#include "vflow/Engine/EngineConfig.h"

#include "vflow/Runtime/Error.h"

#include <string>

using namespace vflow;
using namespace vflow::model;

namespace {

/// The words of the Python API's argument checks (vflow/_check.py).
void atLeast(const char *name, int64_t value, int64_t low) {
  if (value < low)
    throw rt::Error(std::string(name) + ": " + std::to_string(value) +
                    " is out of range (must be >= " + std::to_string(low) +
                    ")");
}

void atMost(const char *name, int64_t value, int64_t high) {
  if (value > high)
    throw rt::Error(std::string(name) + ": " + std::to_string(value) +
                    " is out of range (must be <= " + std::to_string(high) +
                    ")");
}

} // namespace

void EngineConfig::validate() const {
  atLeast("max_batch", maxBatch, 1);
  atMost("max_batch", maxBatch, 1 << 16);
  atLeast("max_tokens_per_step", maxTokensPerStep, 1);
  atLeast("kv_pool_tokens", kvPoolTokens, 1);
  atMost("kv_pool_tokens", kvPoolTokens, int64_t(1) << 40);
  atLeast("dense_layers", runner.denseLayers, 0);
  atLeast("block_size", runner.blockSize, 1);
  atMost("block_size", runner.blockSize, 1 << 20);
  atLeast("max_model_len", runner.maxModelLen, 0);
  atLeast("observe_tokens", runner.observeTokens, 0);
  atMost("observe_tokens", runner.observeTokens, 1 << 20);
}

RunnerConfig EngineConfig::runnerConfig(int64_t blockSize) const {
  RunnerConfig r = runner;
  r.blockSize = blockSize;
  r.numPages = (kvPoolTokens + blockSize - 1) / blockSize;
  r.maxBatch = maxBatch;
  // The running requests, one being admitted and one for prompt logits,
  // and with a prefix cache its holders (as many again and more). Each is
  // a sequence slot: on the GPU, block tables, states and mass sized for
  // max_model_len.
  r.maxSequences = prefixCaching ? 4 * maxBatch + 64 : maxBatch + 2;
  return r;
}
