//===- CudaSession.cpp - The GPU session: config and sequences ------------===//

#include "CudaSessionImpl.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cmath>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

/// The caller's config with the GPU's defaults: 64 sequences, 64 rows a
/// step, sequences up to the whole pool, 1/sqrt(headDim).
SessionConfig resolved(SessionConfig cfg) {
  if (cfg.maxSequences <= 0)
    cfg.maxSequences = 64;
  if (cfg.maxBatch <= 0)
    cfg.maxBatch = 64;
  if (cfg.maxBlocksPerSeq <= 0)
    cfg.maxBlocksPerSeq = cfg.numPages;
  if (cfg.scale == 0 && cfg.headDim > 0)
    cfg.scale = 1.0f / std::sqrt(float(cfg.headDim));
  return cfg;
}

/// A latent cache (valuesAreKeys: one bf16 row a token that attention
/// reads as K and, whole, as V; multi-head latent attention) on the GPU:
/// the latent kernels' shapes (LatentAttention.cu); the values alias the
/// keys' pool, so flows that move tokens (retain) are refused.
void checkLatent(const FlowArtifact &flow, const SessionConfig &cfg,
                 bool runsFlow) {
  const std::string what = "GPU session: a latent cache (valuesAreKeys) ";
  if (cfg.kvDType != DType::BF16)
    throw Error(what + "is bf16 on the GPU, not " +
                std::string(dtypeName(cfg.kvDType)));
  if (cfg.numKVHeads != 1)
    throw Error(what + "has one KV head, not " +
                std::to_string(cfg.numKVHeads));
  if (cfg.headDim < 2 || cfg.headDim % 2 || cfg.headDim > 1024)
    throw Error(what +
                "needs an even row width of at most 1024 on the GPU, "
                "not " +
                std::to_string(cfg.headDim));
  for (int64_t w : cfg.slidingWindow)
    if (w > 0)
      throw Error(what + "has no sliding windows");
  if (runsFlow && flow.retains())
    throw Error(what + "does not run flow '" + flow.name +
                "' on the GPU: it evicts tokens, and the values share the "
                "keys' pages");
}

/// What the GPU session and its kernels support, said before anything is
/// allocated; `runsFlow`: some layer is sparse.
void checkConfig(const FlowArtifact &flow, const SessionConfig &cfg,
                 bool runsFlow) {
  checkDenseLayers(cfg);
  checkRetainWithWindows(flow, cfg, runsFlow);
  if (cfg.valuesAreKeys)
    checkLatent(flow, cfg, runsFlow);
  for (int64_t w : cfg.slidingWindow)
    if (w > INT32_MAX)
      throw Error("GPU session: a sliding window of " + std::to_string(w) +
                  " tokens is over the kernels' 2^31");
  if (runsFlow && flow.gpu.source.empty())
    throw Error("GPU session: flow '" + flow.name +
                "' has no CUDA source (an artifact from an older vflowc?)");
  // The flow's code is compiled and run: its metadata must be what the
  // compiler produced for it (Artifact.h).
  if (runsFlow)
    validateFlowArtifact(flow, "GPU session");
  if (cfg.numLayers < 1 || cfg.numKVHeads < 1 || cfg.group < 1 ||
      cfg.headDim < 1 || cfg.numPages < 1)
    throw Error("GPU session: numLayers, numKVHeads, group, headDim and "
                "numPages must be positive");
  if (flow.headDim && flow.headDim != cfg.headDim)
    throw Error("GPU session: flow '" + flow.name +
                "' is specialized to head_dim " + std::to_string(flow.headDim) +
                ", not " + std::to_string(cfg.headDim));
  // (A latent cache's kernels take the head dims and groups checkLatent
  // allowed.)
  if (!cfg.valuesAreKeys && cfg.headDim != 64 && cfg.headDim != 128 &&
      cfg.headDim != 256)
    throw Error("GPU session: head dim " + std::to_string(cfg.headDim) +
                " is not supported by the GPU attention kernels (64, 128 or "
                "256)");
  if (cfg.group > 16 && !cfg.valuesAreKeys)
    throw Error("GPU session: group " + std::to_string(cfg.group) +
                " (query heads per KV head) is not supported by the GPU "
                "attention kernels (at most 16)");
  if (flow.blockSize % 16 != 0 || flow.blockSize < 16 || flow.blockSize > 256)
    throw Error("GPU session: flow '" + flow.name + "' has block_size " +
                std::to_string(flow.blockSize) +
                "; the GPU attention kernels need a multiple of 16 in "
                "[16, 256] (the CPU backend runs any block size)");
  kvTypeOf(cfg.kvDType, "GPU session");
}

} // namespace

CudaSession::CudaSession(const FlowArtifact &flow, const SessionConfig &config)
    : artifact(sessionFlow(flow, config.denseLayers, config.numLayers)),
      cfg(resolved(config)) {
  // A session dense at every layer never runs the flow: nothing compiled.
  const bool runsFlow = cfg.denseLayers < cfg.numLayers;
  checkConfig(artifact, cfg, runsFlow);
  checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            "creating a stream");
  try {
    if (runsFlow) {
      ops = std::make_unique<FlowOps>(artifact, cfg.group, cfg.headDim,
                                      cfg.kvDType, cfg.quiet, cfg.cacheDir,
                                      stream, cfg.launch);
      const BudgetScope scope = budgetScope(cfg);
      ops->kernels().setBudgetScope(scope.firstLayer, scope.numLayers,
                                    scope.firstKVHead, scope.numKVHeads);
    }
    cache = std::make_unique<DeviceKVCache>(artifact, cfg, ops.get(), stream);
    const bool observes = cfg.observeTokens > 0 && cache->readsMass();
    // Windowed layers are dense too: they need the every-block lists.
    const bool windows =
        std::any_of(cfg.slidingWindow.begin(), cfg.slidingWindow.end(),
                    [](int64_t w) { return w > 0; });
    steps = std::make_unique<StepPlan>(
        cfg, ops.get(), cache->readsMass(),
        cfg.denseLayers > 0 || cfg.massRecall || observes || windows,
        retainUnit(), artifact.readsInput("first_token"), stream);
    const int64_t lists = int64_t(cfg.maxBatch) * cfg.numKVHeads;
    const int64_t maxBlocks = cfg.maxBlocksPerSeq;
    const size_t L = size_t(cfg.numLayers), G = size_t(cfg.group);
    const size_t massBytes = size_t(lists * maxBlocks) * G * sizeof(float);
    const size_t outBytes = size_t(lists) * G * size_t(cfg.headDim) * 2;
    if (observes) {
      observeMass = DeviceArray(massBytes);
      observeOut = DeviceArray(outBytes);
    }
    auto zeroed = [&](DeviceArray &a, size_t bytes) {
      a = DeviceArray(bytes);
      checkCuda(cudaMemsetAsync(a.get(), 0, bytes, stream), "zeroing");
    };
    if (cfg.massRecall) {
      recallMassRows = DeviceArray(massBytes);
      recallOut = DeviceArray(outBytes);
      zeroed(recallSum, L * size_t(cfg.numKVHeads) * G * sizeof(double));
      zeroed(recallSamples, L * sizeof(unsigned long long));
    }
    zeroed(attendedTotal, sizeof(unsigned long long));
    zeroed(slotAttended,
           size_t(cfg.maxSequences + 1) * sizeof(unsigned long long));
    snapshots.resize(L);
    checkCuda(cudaStreamSynchronize(stream), "setting up the session");
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  for (const ArtifactTensor &f : artifact.fields)
    fieldBytes +=
        double(f.elements(cfg.headDim, cfg.group)) * bytesPerElement(f.dtype);
}

CudaSession::~CudaSession() {
  for (auto &m : marks)
    cudaEventDestroy(m.second);
  if (stream)
    cudaStreamSynchronize(stream);
  // The buffers are freed (members) before the stream goes.
  steps.reset();
  cache.reset();
  ops.reset();
  if (stream)
    cudaStreamDestroy(stream);
}

std::unique_ptr<Session>
vflow::rt::cuda::openCudaSession(const FlowArtifact &flow,
                                 const SessionConfig &config) {
  return std::make_unique<CudaSession>(flow, config);
}

SeqId CudaSession::counted(SeqId seq) {
  // Done before this returns: decodes of the sequence may run on the
  // caller's stream, not the session's.
  if (cfg.telemetry) {
    checkCuda(cudaMemsetAsync(slotAttended.get<unsigned long long>() +
                                  cache->slotOf(seq).slot,
                              0, sizeof(unsigned long long), stream),
              "zeroing a sequence's counts");
    checkCuda(cudaStreamSynchronize(stream), "zeroing a sequence's counts");
  }
  return seq;
}

SeqId CudaSession::addSequence() { return counted(cache->add()); }

SeqId CudaSession::fork(SeqId parent) { return counted(cache->fork(parent)); }

SeqId CudaSession::sharePrefix(SeqId parent, int64_t tokens) {
  return counted(cache->sharePrefix(parent, tokens));
}

void CudaSession::release(SeqId seq) {
  cache->release(seq);
  perSequence.erase(seq);
  steps->invalidate();
}

void CudaSession::evict(SeqId seq, const std::vector<int64_t> &blocks) {
  if (stepOpen)
    throw Error("GPU session: evict inside a step (beginStep): endStep first");
  // Decodes may still run on the caller's streams: the rows moved here are
  // theirs until they finish.
  checkCuda(cudaDeviceSynchronize(), "evicting blocks");
  cache->evict(seq, blocks, stream);
  counters.tokensEvicted += int64_t(blocks.size()) * artifact.blockSize;
  perSequence[seq].tokensEvicted += int64_t(blocks.size()) * artifact.blockSize;
  steps->invalidate();
}

void CudaSession::evictTokens(SeqId seq, const std::vector<int64_t> &tokens) {
  if (stepOpen)
    throw Error(
        "GPU session: evict_tokens inside a step (beginStep): endStep first");
  // Decodes may still run on the caller's streams: the pages and rows
  // moved here are theirs until they finish.
  checkCuda(cudaDeviceSynchronize(), "evicting tokens");
  compact(seq, tokens, stream);
}

void CudaSession::compact(SeqId seq, const std::vector<int64_t> &tokens,
                          cudaStream_t st) {
  const int64_t freeBefore = freePages();
  cache->evictTokens(seq, tokens, st);
  counters.tokensEvicted += int64_t(tokens.size());
  perSequence[seq].tokensEvicted += int64_t(tokens.size());
  counters.pagesReclaimed += freePages() - freeBefore;
  steps->invalidate();
}

int64_t CudaSession::originalPosition(SeqId seq, int64_t token) const {
  cache->table.require(seq, "GPU session");
  return cache->table.originalPosition(seq, token);
}

int64_t CudaSession::length(SeqId seq) const {
  cache->table.require(seq, "GPU session");
  return cache->table.length(seq);
}

int64_t CudaSession::position(SeqId seq) const {
  return length(seq) + cache->table.evictedTokens(seq);
}

int64_t CudaSession::originalBlock(SeqId seq, int64_t block) const {
  cache->table.require(seq, "GPU session");
  return cache->table.originalBlock(seq, block);
}

RetainRule CudaSession::retainRule() const {
  return RetainRule::of(ops->kernels().params(), artifact.retainBudget,
                        cfg.group, artifact.retainCombine,
                        artifact.retainTokens, artifact.blockSize);
}

int64_t CudaSession::retainedBlocks() const {
  return retains() ? retainRule().retainedBlocks() : -1;
}

int64_t CudaSession::freePages() const {
  return cache->table.blockManager().numFree();
}

int64_t CudaSession::pagesNeeded(SeqId seq, int64_t tokens) const {
  cache->table.require(seq, "GPU session");
  return cache->table.pagesNeeded(seq, tokens);
}

void CudaSession::setAttentionMass(SeqId seq, int layer,
                                   const std::vector<float> &mass) {
  cache->setMass(seq, layer, mass);
}

void CudaSession::setParam(const std::string &name, double value) {
  if (!ops)
    throw noParams(name);
  ops->kernels().setParam(name, value);
}

double CudaSession::param(const std::string &name) const {
  if (!ops)
    throw noParams(name);
  return ops->kernels().params().get(name);
}

int64_t CudaSession::budget(SeqId seq) const {
  const int64_t len = length(seq), blocks = len / artifact.blockSize;
  return ops ? ops->kernels().params().budget(blocks, len) : blocks;
}
