//===- CudaSessionImpl.h - The GPU session --------------------*- C++ -*-===//
//
// rt::cuda::CudaSession: the session API (Session.h) on a GPU. Its parts:
//
//   DeviceKVCache   pools, page table, slots, token writes (the cache)
//   StepPlan        a decode step's rows on the device and its StepKey
//   FlowOps         the flow's kernels behind the C table (null when every
//                   layer is dense)
//   decodeLayer     the one decode-layer routine (DecodeLayer.h)
//
// Every decode runs through runLayer(): a step (beginStep, stepLayer per
// layer, endStep; eager or replayed from a CUDA graph) appends the step's
// token inside it; decode() attends tokens appended already. CudaSession.cpp
// holds the sequences and config, CudaStep.cpp appends and decodes,
// Measurements.cpp the telemetry, mass recall, observation window and
// profile.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_SESSION_CUDASESSIONIMPL_H
#define VFLOW_RUNTIME_CUDA_SESSION_CUDASESSIONIMPL_H

#include "DeviceKVCache.h"
#include "StepPlan.h"

#include "vflow/Runtime/Retain.h"
#include "vflow/Runtime/Session.h"
#include "vflow/Runtime/cuda/CudaSession.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace vflow::rt::cuda {

class CudaSession final : public Session {
public:
  CudaSession(const FlowArtifact &flow, const SessionConfig &config);
  ~CudaSession() override;
  CudaSession(const CudaSession &) = delete;
  CudaSession &operator=(const CudaSession &) = delete;

  const FlowArtifact &flow() const override { return artifact; }
  const SessionConfig &config() const override { return cfg; }
  SeqId addSequence() override;
  SeqId fork(SeqId parent) override;
  SeqId sharePrefix(SeqId parent, int64_t tokens) override;
  void release(SeqId seq) override;
  /// DeviceKVCache::evict after every decode in flight on any stream
  /// (outside a step; waits).
  void evict(SeqId seq, const std::vector<int64_t> &blocks) override;
  /// Not on the GPU yet: an Error (the compaction kernel is next).
  void evictTokens(SeqId seq, const std::vector<int64_t> &tokens) override;
  int64_t originalPosition(SeqId seq, int64_t token) const override;
  int64_t position(SeqId seq) const override;
  int64_t originalBlock(SeqId seq, int64_t block) const override;
  int64_t retainedBlocks() const override;
  int64_t length(SeqId seq) const override;
  int64_t freePages() const override;
  int64_t pagesNeeded(SeqId seq, int64_t tokens) const override;
  void append(SeqId seq, int64_t n, const float *k, const float *v) override;
  void append(const std::vector<SeqId> &seqs,
              const std::vector<int64_t> &counts, const float *k,
              const float *v) override;
  void append(int layer, const std::vector<SeqId> &seqs,
              const std::vector<int64_t> &counts, const Tensor &k,
              const Tensor &v, void *stream = nullptr) override;
  using Session::decode;
  void decode(int layer, const std::vector<SeqId> &seqs, const Tensor &q,
              const Tensor &out, void *stream = nullptr) override;
  void prefill(int layer, const std::vector<SeqId> &seqs,
               const std::vector<int64_t> &counts, const Tensor &q,
               const Tensor &out, void *stream = nullptr) override;
  using Session::beginStep;
  StepKey beginStep(const std::vector<SeqId> &seqs, int64_t rows,
                    void *stream = nullptr) override;
  void stepLayer(int layer, const Tensor &q, const Tensor &k, const Tensor &v,
                 const Tensor &out, void *stream = nullptr) override;
  void endStep() override;
  std::vector<BlockLists> selection(int layer) const override;
  std::vector<BlockLists> selectedPages(int layer) const override;
  void setAttentionMass(SeqId seq, int layer,
                        const std::vector<float> &mass) override;
  void setParam(const std::string &name, double value) override;
  double param(const std::string &name) const override;
  int64_t budget(SeqId seq) const override;
  SessionStats stats() const override;
  SequenceStats sequenceStats(SeqId seq) const override;
  std::vector<std::pair<std::string, float>> lastProfile() const override;

private:
  // CudaStep.cpp
  /// Device bf16 K/V [n, layers, kvHeads, headDim] of `seqs` (counts[i]
  /// tokens each, the pool checked for all first), every layer.
  void appendAll(const std::vector<SeqId> &seqs,
                 const std::vector<int64_t> &counts, const void *k,
                 const void *v, cudaStream_t st);
  /// Device bf16 K/V [sum(counts), kvHeads, headDim] at `layer`.
  void appendLayer(int layer, const std::vector<SeqId> &seqs,
                   const std::vector<int64_t> &counts, const void *k,
                   const void *v, cudaStream_t st);
  void checkLayer(int layer, const char *what) const;
  /// A step's rows: live, distinct, 1..maxBatch.
  void checkRows(const std::vector<SeqId> &rows, const char *what) const;
  /// Plans a step of `rows` (padded to `padded`) unless the plan holds it.
  void plan(const std::vector<SeqId> &rows, int64_t padded, cudaStream_t st);
  /// The decode layer over the planned rows (kNew, vNew: the step's token,
  /// or null when written already), then the mass recall.
  void runLayer(int layer, const void *q, const void *kNew, const void *vNew,
                void *out, cudaStream_t st);
  /// The flow's retain block runs (a flow layer, a retain block) and its
  /// rule with the current params.
  bool retains() const { return ops && artifact.retains(); }
  /// The scores the retain block gives a block: 1, the block size at token
  /// grain, 0 without one.
  int retainUnit() const {
    return !retains() ? 0 : artifact.retainTokens ? int(artifact.blockSize) : 1;
  }
  /// evictTokens' work (the session's counters too), on `st`.
  void compact(SeqId seq, const std::vector<int64_t> &tokens, cudaStream_t st);
  RetainRule retainRule() const;
  /// At a flow layer of a step: its retain scores folded into the step's
  /// (the first flow layer starts them over).
  void foldRetainScores(int layer, cudaStream_t st);
  /// After the step's last layer over `rows`: each row past the retained
  /// blocks reads its folded scores (one wait) and evicts what the rule
  /// cuts.
  void applyRetain(const std::vector<SeqId> &rows, cudaStream_t st);
  /// Decodes or prefills through host f32 arrays (converted, copied, the
  /// output read back; waits).
  void throughHost(const Tensor &q, const Tensor &out, size_t rows,
                   const std::function<void(const void *, void *)> &run);

  // Measurements.cpp
  /// Keeps the lists of the decode just run at `layer` (telemetry).
  void keepSelection(int layer, const std::vector<SeqId> &rows,
                     cudaStream_t st);
  /// With massRecall: the step densely at `layer`, each list's share of
  /// its mass.
  void recallMass(int layer, const PagedAttentionArgs &sparse, cudaStream_t st);
  /// After a prefill at `layer`: each sequence's mass slot from its last
  /// observeTokens rows of q (SessionConfig::observeTokens).
  void observe(int layer, const std::vector<SeqId> &seqs,
               const std::vector<int64_t> &counts, const void *q,
               cudaStream_t st);
  /// A profiling event before the next launch (with cfg.profile).
  void mark(const char *what);
  /// What the host knows of `layers` layers of a decode of `seqs`.
  void countDecode(const std::vector<SeqId> &seqs, int layers);
  int64_t blocksAttended() const;

  FlowArtifact artifact; ///< what the session keeps of the flow
  SessionConfig cfg;     ///< the caller's, defaults resolved
  cudaStream_t stream = nullptr;
  std::unique_ptr<FlowOps> ops; ///< null: dense at every layer
  std::unique_ptr<DeviceKVCache> cache;
  std::unique_ptr<StepPlan> steps;
  /// beginStep's rows and stream until endStep (empty: no step open).
  std::vector<SeqId> stepRows;
  cudaStream_t stepStream = nullptr;
  bool stepOpen = false;
  /// The rows whose retain scores the plan's folded buffer holds for the
  /// step (empty: none, or a layer of it decoded other rows).
  std::vector<SeqId> foldRows;
  std::vector<float> retainHost;
  /// The layer of the last decode whose lists the plan's buffers hold
  /// (-1: none).
  int lastLayer = -1;

  // Host arrays through the device (throughHost, host appends).
  DeviceArray qBuf, kBuf, vBuf, outBuf;
  IntUpload prefillMeta;

  // Telemetry: per layer, a copy of the last decode's lists and its rows;
  // a device total of the blocks sparse layers attended, the host total of
  // dense ones.
  struct Snapshot {
    DeviceArray count, blocks;
    std::vector<int> starts;
    std::vector<SeqId> rows;
    std::vector<int64_t> denseBlocks; ///< a dense layer: each row's blocks
  };
  std::vector<Snapshot> snapshots;
  DeviceArray attendedTotal;
  int64_t denseAttended = 0;
  /// Per sequence: the host's counts (lists, blocks available, dense
  /// layers' blocks), and per slot the device's count of sparse layers'
  /// blocks (maxSequences + 1 slots: padding rows count into the last).
  std::map<SeqId, SequenceStats> perSequence;
  DeviceArray slotAttended;
  /// A new sequence's slot counts from zero.
  SeqId counted(SeqId seq);
  SessionStats counters;
  double fieldBytes = 0;
  // Mass recall: the dense pass's mass and output; per layer the sums and
  // samples.
  DeviceArray recallMassRows, recallOut, recallSum, recallSamples;
  // The observation window's mass, output and metadata.
  DeviceArray observeMass, observeOut;
  IntUpload observeMeta;
  // Profiling: an event before each launch of the last decode layer.
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  cudaStream_t markStream = nullptr;
};

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_SESSION_CUDASESSIONIMPL_H
