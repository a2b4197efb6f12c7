//===- Session.h - A compiled flow attached to a paged KV cache -*- C++ -*-===//
//
// The runtime's public API for serving on the host: load an artifact
// (Artifact.h), create a DecodeSession for one of its flows, add sequences,
// append their K/V (the flow's cache stage fills its fields as blocks
// complete), and run decode steps: the index stage selects blocks per
// (sequence, KV head), sparse attention runs over them (plus the kept first
// and last blocks and the partial last block), and the per-block attention
// mass is kept for the next step. Nothing here needs the compiler: the
// flow runs through its generated C++ (CPU backend, compiled once by the
// host compiler and cached on disk).
//
//   rt::Artifact a = rt::loadArtifact("quest.vfa");
//   rt::SessionConfig cfg;
//   cfg.numKVHeads = 8; cfg.group = 4; cfg.headDim = 128; cfg.numPages = 4096;
//   rt::DecodeSession s(*a.findFlow("quest"), cfg);
//   rt::SeqId seq = s.addSequence();
//   s.appendTokens(seq, promptLen, k, v);   // [n, layers, kvHeads, headDim]
//   s.append(seq, kNew, vNew);              // each decode step
//   s.decodeStep(0, {seq}, q, out);         // q, out: [1, kvHeads*group, D]
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_SESSION_H
#define VFLOW_RUNTIME_SESSION_H

#include "vflow/Runtime/Artifact.h"
#include "vflow/Runtime/Attention.h"
#include "vflow/Runtime/CpuFlow.h"
#include "vflow/Runtime/PagedKVCache.h"

#include <map>
#include <memory>
#include <vector>

namespace vflow::rt {

/// What the CPU backend needs to know about a flow, from its artifact.
CpuFlowInfo cpuFlowInfo(const FlowArtifact &flow);

struct SessionConfig {
  int numLayers = 1;
  int numKVHeads = 0;
  /// Query heads per KV head.
  int group = 0;
  int headDim = 0;
  /// Pages in the KV cache (each holds the flow's block_size tokens).
  int64_t numPages = 0;
  /// K/V storage: F32, BF16 or F16 on the host.
  DType kvDType = DType::BF16;
  /// The softmax scale; 0 means 1/sqrt(headDim).
  float scale = 0;
  HostJitOptions jit;
};

class DecodeSession {
public:
  /// Compiles (or finds in the JIT cache) the flow's CPU code and creates
  /// the cache. Throws Error when the flow cannot run with this config (a
  /// head_dim it is specialized to, a bad config, no CPU source).
  DecodeSession(const FlowArtifact &flow, const SessionConfig &config);
  ~DecodeSession();
  DecodeSession(const DecodeSession &) = delete;
  DecodeSession &operator=(const DecodeSession &) = delete;

  SeqId addSequence();
  /// A new sequence sharing `parent`'s tokens (prefix sharing, copy on
  /// write) and copying its states and attention mass.
  SeqId fork(SeqId parent);
  void freeSequence(SeqId seq);

  /// Appends one token (k, v: [numLayers, numKVHeads, headDim]).
  void append(SeqId seq, const float *k, const float *v);
  /// Appends n tokens ([n, numLayers, numKVHeads, headDim]).
  void appendTokens(SeqId seq, int64_t n, const float *k, const float *v);

  /// One decode step at `layer` for `seqs`: q and out are
  /// [seqs.size(), numKVHeads * group, headDim]. When `attended` is given,
  /// it receives, per sequence, the logical blocks attended per KV head;
  /// `pages` the same blocks translated to physical page ids (the sparse
  /// block table a kernel reads).
  void decodeStep(int layer, const std::vector<SeqId> &seqs, const float *q,
                  float *out, std::vector<BlockLists> *attended = nullptr,
                  std::vector<BlockLists> *pages = nullptr);

  /// Changes a run-time param (budget, alpha, ...) without recompiling.
  void setParam(const std::string &name, double value);
  /// The number of blocks the flow selects for `seq` now (kept and partial
  /// blocks excluded), as the host planner computes it.
  int64_t budget(SeqId seq) const;

  /// The attention mass of `seq`'s last step at `layer`
  /// ([numKVHeads, numBlocks then, group]); empty before the first step.
  std::vector<float> attentionMass(SeqId seq, int layer) const;
  /// Decode steps run for `seq` at `layer`.
  int64_t steps(SeqId seq, int layer) const;

  PagedKVCache &cache() { return *kv; }
  const CpuFlow &flow() const { return *cpu; }

private:
  void computeFields(int layer, PageId page, int kvHead);

  FlowArtifact artifact;
  SessionConfig cfg;
  std::unique_ptr<CpuFlow> cpu;
  std::unique_ptr<PagedKVCache> kv;
  /// Per sequence and layer: the attention mass of the last step
  /// ([numKVHeads, numBlocks, group]) and the number of steps run.
  struct LayerHistory {
    std::vector<std::vector<float>> mass;
    std::vector<int64_t> steps;
  };
  std::map<SeqId, LayerHistory> lastMass;
};

} // namespace vflow::rt

#endif // VFLOW_RUNTIME_SESSION_H
