//===- GpuSession.h - A compiled flow serving decode steps on a GPU -*- C++
//-*-===//
//
// The GPU counterpart of rt::HostSession: a paged KV cache in device
// memory (K/V pools per layer in bf16, f16 or fp8 e4m3 with per-KV-head
// scales; the flow's cache fields in pools indexed by the same page ids;
// states per sequence slot), the flow's kernels compiled with NVRTC for the
// device, and sparse paged decode attention over the blocks they select.
//
//   rt::cuda::GpuSession s(*artifact.findFlow("quest"), cfg);
//   rt::SeqId a = s.addSequence();
//   s.appendTokens(a, promptLen, k, v);   // host f32 [n, layers, kvHeads, D]
//   s.beginStep({a});                     // one new token per sequence
//   for (int l = 0; l < layers; ++l)      // device bf16 pointers
//     s.decodeLayer(l, q, kNew, vNew, out, stream);
//   s.endStep();
//
// One decode layer is: append (new K/V into the tail page; when that
// completes a block, its fields in the same kernel), the index kernels
// (score, reduce over the group, select, add kept blocks, write the sparse
// block table, update states), sparse attention (split-KV + merge) with the
// per-block attention mass when the flow reads it. decodeLayer launches a
// fixed grid and reads every per-step value from device memory that
// beginStep fills, so it can be captured in a CUDA graph and replayed after
// later beginStep calls with the same stepShape().
//
// Needs no compiler but NVRTC: the CUDA source (or PTX) comes from the
// artifact, and so do the consts' values (computed by the compiler for the
// head dimensions a GPU session may use) and the budgets (expressions the
// runtime evaluates, Budget.h). No host C++ compiler runs.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_GPUSESSION_H
#define VFLOW_RUNTIME_CUDA_GPUSESSION_H

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/PagedKVCache.h"
#include "vflow/Runtime/Session.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vflow::rt::cuda {

struct GpuSessionConfig {
  int numLayers = 1;
  int numKVHeads = 0;
  int group = 0; ///< query heads per KV head
  int headDim = 0;
  int64_t numPages = 0;         ///< pages per layer pool
  int maxSequences = 0;         ///< live sequences (state and mass slots)
  int maxBatch = 0;             ///< rows of one decode step
  int64_t maxBlocksPerSeq = 0;  ///< blocks one sequence may reach
  std::string kvDType = "bf16"; ///< bf16, f16 or fp8_e4m3
  /// fp8: K and V scales per KV head (empty: 1). Stored = value / scale.
  std::vector<float> kScale, vScale;
  float scale = 0; ///< softmax scale; 0 means 1/sqrt(headDim)
  /// Grids sized for maxBlocksPerSeq rather than this step's longest
  /// sequence, so a captured step stays valid while sequences grow.
  bool graphSafe = false;
  std::string arch; ///< NVRTC target; empty: the device's
  std::string cacheDir;
  bool quiet = false;
  /// Time every kernel of decodeLayer with CUDA events (lastProfile()).
  bool profile = false;
  /// Keep each layer's last block lists on the device (selection()) and
  /// count the blocks attended (blocksAttended()): two copies and a small
  /// kernel per decode.
  bool telemetry = true;
  /// rt::SessionConfig::massRecall: a second, dense attention at every
  /// sparse decode measures the mass the attended blocks held.
  bool massRecall = false;
  /// rt::SessionConfig::observeTokens: prefill sets a flow's mass from its
  /// last rows (SnapKV's observation window).
  int observeTokens = 0;
  /// Layers [0, denseLayers) attend every block (no index stage, no
  /// fields); denseLayers >= numLayers: the flow is not compiled at all
  /// (rt::SessionConfig::denseLayers).
  int denseLayers = 0;
  /// rt::SessionConfig::launch.
  GpuLaunchOptions launch;
};

/// What a captured decode step depends on besides device memory.
struct StepShape {
  int batch = 0;
  int64_t gridBlocks = 0, maxEntries = 0;
  /// The longest list of a dense layer (every block of a row).
  int64_t denseEntries = 0;
  /// The flow's selection takes every block of every row
  /// (FlowParams::takesEveryBlock) and it stores no states: its sparse
  /// layers write the lists without scoring (the append still runs).
  bool everyBlock = false;
  bool operator==(const StepShape &o) const {
    return batch == o.batch && gridBlocks == o.gridBlocks &&
           maxEntries == o.maxEntries && denseEntries == o.denseEntries &&
           everyBlock == o.everyBlock;
  }
};

class GpuSession {
public:
  GpuSession(const FlowArtifact &flow, const GpuSessionConfig &config);
  ~GpuSession();
  GpuSession(const GpuSession &) = delete;
  GpuSession &operator=(const GpuSession &) = delete;

  SeqId addSequence();
  /// A new sequence sharing `parent`'s pages and their cache fields (a
  /// partial tail page is copied on its first write) with a copy of its
  /// states and attention mass.
  SeqId fork(SeqId parent);
  /// A new sequence sharing the pages (and fields) of `parent`'s first
  /// `tokens` tokens, a whole number of blocks or all of `parent`, with
  /// fresh states and no attention mass (rt::Session::sharePrefix).
  SeqId sharePrefix(SeqId parent, int64_t tokens);
  void freeSequence(SeqId seq);
  /// The attention mass `seq`'s index stage reads at its next step at
  /// `layer`: host f32 [numKVHeads, numBlocks, group].
  void setAttentionMass(SeqId seq, int layer, const std::vector<float> &mass);
  int64_t length(SeqId seq) const;
  /// Logical block -> physical page of `seq`.
  std::vector<PageId> pageTable(SeqId seq) const;

  /// Appends `n` tokens to every layer (prefill): `k`, `v` are host f32
  /// [n, layers, kvHeads, headDim], stored in the KV dtype; the fields of
  /// every block they complete are computed.
  void appendTokens(SeqId seq, int64_t n, const float *k, const float *v);
  /// The same from device bf16 arrays [n, layers, kvHeads, headDim].
  void appendTokensDevice(SeqId seq, int64_t n, const void *k, const void *v);

  /// Layer by layer (rt::Session::append): writes `layer`'s K/V for the
  /// next counts[i] tokens of seqs[i] from device bf16 arrays [sum(counts),
  /// kvHeads, headDim], growing a sequence when this layer writes past its
  /// length (the pool is checked for every sequence first: an Error
  /// changes none). A decode step's one token per sequence is held and
  /// written by the next decode's fused append when it runs the same
  /// sequences; anything else is written at once (with the fields of the
  /// blocks it completes). Queued on `stream` (null: the session's).
  void appendLayer(int layer, const std::vector<SeqId> &seqs,
                   const std::vector<int64_t> &counts, const void *k,
                   const void *v, void *stream = nullptr);
  /// One decode layer for `seqs` (rt::Session::decode), each written up to
  /// its length at `layer`: device bf16 q and out [seqs.size(),
  /// kvHeads*group, headDim]. Queued on `stream` with no host wait (the
  /// step metadata is uploaded through pinned memory when the rows or a
  /// length changed). After the last layer the sequences' step count
  /// moves on.
  void decode(int layer, const std::vector<SeqId> &seqs, const void *q,
              void *out, void *stream = nullptr);
  /// Causal prefill attention at `layer` (rt::Session::prefill): device
  /// bf16 q and out [sum(counts), kvHeads*group, headDim]; queued on
  /// `stream`, no host wait.
  void prefill(int layer, const std::vector<SeqId> &seqs,
               const std::vector<int64_t> &counts, const void *q, void *out,
               void *stream = nullptr);
  /// Pages of the pool no sequence holds.
  int64_t freePages() const;
  /// Session::pagesNeeded.
  int64_t pagesNeeded(SeqId seq, int64_t tokens) const;
  /// Tokens of `seq` whose K/V `layer` holds.
  int64_t written(SeqId seq, int layer) const;
  /// With telemetry: what the last decode at `layer` attended, per row and
  /// KV head (logical blocks ascending), and its rows (waits for it).
  std::vector<std::vector<std::vector<int64_t>>>
  selection(int layer, std::vector<SeqId> *rows = nullptr) const;
  /// With telemetry: blocks attended by all decodes so far (waits).
  int64_t blocksAttended() const;
  /// With massRecall: rt::SessionStats::massRecallSum and massRecallCount
  /// (waits); empty without.
  void massRecall(std::vector<double> &sum, std::vector<int64_t> &count) const;

  /// Starts a decode step: each sequence grows by one token (pages are
  /// allocated as needed) and the step's metadata is copied to the device
  /// on the session's stream. With `rows` > seqs.size() (at most
  /// maxBatch) the step has that many rows, the last ones padding: no
  /// blocks, nothing read or written for them, their outputs unspecified.
  void beginStep(const std::vector<SeqId> &seqs, int rows = 0);
  /// One layer of the step, on `stream` (a cudaStream_t; null: the
  /// session's). Device bf16 arrays: q and out [batch, kvHeads*group, D],
  /// kNew and vNew [batch, kvHeads, D] (the new token's K/V).
  void decodeLayer(int layer, const void *q, const void *kNew, const void *vNew,
                   void *out, void *stream = nullptr);
  /// Ends the step (the `step` input counts it).
  void endStep();
  StepShape stepShape() const { return shape; }

  /// After decodeLayer(layer) (stream synchronized): the blocks it attended
  /// per row and KV head, logical ids ascending.
  std::vector<std::vector<std::vector<int64_t>>> attendedBlocks() const;
  /// With `profile`: each kernel of the last decodeLayer and its time in
  /// milliseconds (synchronizes the stream).
  std::vector<std::pair<std::string, float>> lastProfile() const;
  /// The selection budget of `seq` now, as the host evaluates it.
  int64_t budget(SeqId seq) const;
  void setParam(const std::string &name, double value);
  double param(const std::string &name) const;
  /// The session's stream (cudaStream_t).
  void *stream() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl;
  StepShape shape;
};

/// The GPU backend behind the one session API (Session.h): host f32 arrays
/// in and out, a step's new token held until decode(layer 0) runs it
/// through the fused append of decodeLayer. openSession(flow, cfg) with
/// Device::Cuda calls it.
std::unique_ptr<Session> openGpuSession(const FlowArtifact &flow,
                                        const SessionConfig &config);

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_GPUSESSION_H
