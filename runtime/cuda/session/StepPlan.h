//===- StepPlan.h - A GPU decode step's rows on the device ------*- C++ -*-===//
//
// The plan of a decode step: its rows (sequences, then padding) and what
// the kernels read of them on the device (lengths, block tables, state
// slots, step counts, the lists' capacities), the buffers the step's
// kernels write (block lists, workspaces, attention mass rows), and its
// StepKey (Session.h), the one source of truth for CUDA graphs: every
// launch of a decode layer is sized from the key, so a step with an equal
// key replays a graph captured for another.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_SESSION_STEPPLAN_H
#define VFLOW_RUNTIME_CUDA_SESSION_STEPPLAN_H

#include "DeviceKVCache.h"

#include "vflow/Runtime/Params.h"

namespace vflow::rt::cuda {

class StepPlan {
public:
  /// Buffers for steps of up to cfg.maxBatch rows; `ops` (null: dense
  /// everywhere) sizes the flow's workspace; `denseLists`: some decode
  /// attends every block of its rows (dense layers, the mass recall, the
  /// observation window); `retainUnit`: the scores a retain block gives a
  /// block (1, or the block size for a [block, token] score; 0: no retain
  /// block), per list and folded per row.
  /// `readsFirstToken`: the flow reads `first_token` (each row's blocks'
  /// original first positions, uploaded with the block tables).
  StepPlan(const SessionConfig &cfg, const FlowOps *ops, bool readsMass,
           bool denseLists, int retainUnit, bool readsFirstToken,
           cudaStream_t stream);

  /// Plans a step of `rowList` padded to `rows` rows (0: no padding): its
  /// metadata uploaded on `st` (no host wait), its key returned. `params`
  /// (null: dense everywhere) gives each row's longest list; `mustIndex`:
  /// the index stage runs even where the selection takes every block (it
  /// stores states or scores a retain block); `graphSafe` sizes the key
  /// for every length a captured step may reach.
  const StepKey &prepare(const DeviceKVCache &cache, const FlowParams *params,
                         bool mustIndex, const std::vector<SeqId> &rowList,
                         int64_t rows, bool graphSafe, cudaStream_t st);
  /// Whether the plan still describes `rowList` as the cache holds them.
  bool holds(const std::vector<SeqId> &rowList) const {
    return valid && rowList == seqs;
  }
  /// The sequences changed (grew, moved on a step): plan again.
  void invalidate() { valid = false; }

  const StepKey &key() const { return stepKey; }
  const std::vector<SeqId> &rows() const { return seqs; }
  /// Each list's first entry in the lists (host copy of `indptr`).
  const std::vector<int> &listStarts() const { return hostIndptr; }

  /// The step's members of the flow's arguments.
  void stepArgs(VflowGpuArgs &a) const;
  /// Attention's lengths, workspace and mass rows for the step.
  void attentionArgs(PagedAttentionArgs &p) const;
  /// Lists of every block of each row (a dense layer's, the mass recall's):
  /// one list per row over its block table, `maxEntries` long at most.
  void everyBlockLists(PagedAttentionArgs &p, int64_t maxEntries) const;

  // The device buffers (read by telemetry and the mass recall too).
  DeviceArray seqLen, blockTable, slotOf, stepOf, indptr, count, tablePages,
      tableBlocks, workspace, attnWorkspace, massRows;
  DeviceArray denseIndptr, denseBlocks, denseCount;
  /// [maxBatch, maxBlocks] `first_token` of each row's blocks, when read.
  DeviceArray firstToken;
  /// A retain block's scores: per list of the layer being decoded
  /// ([lists, maxBlocks], the retain kernel's) and folded per row over the
  /// step's flow layers ([maxBatch, maxBlocks], foldRetain's).
  DeviceArray retainScores, retainFolded;
  size_t attnWorkspaceBytes = 0;

private:
  const SessionConfig &cfg;
  PinnedBuffer hostMeta;
  std::vector<SeqId> seqs;
  std::vector<int> hostIndptr;
  StepKey stepKey;
  bool valid = false;
};

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_SESSION_STEPPLAN_H
