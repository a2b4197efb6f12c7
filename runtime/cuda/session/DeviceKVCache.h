//===- DeviceKVCache.h - The GPU session's paged KV cache -------*- C++ -*-===//
//
// Device memory a GPU session keeps for its sequences: K/V pools per layer
// in the session's KV dtype (bf16, f16, or fp8e4m3 and int8 with a scale per
// stored row, NumericRules' scaled 8-bit KV, as the CPU cache keeps them),
// the flow's fields in pools indexed by the same page ids (at the layers
// that run the flow), the flow's states and attention mass per sequence
// slot, the page table (PageTable.h: blocks, lengths, copy on write of a
// shared tail, shared prefixes) and the slots. Everything a kernel reads of
// the cache comes from view() and flowArgs().
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_SESSION_DEVICEKVCACHE_H
#define VFLOW_RUNTIME_CUDA_SESSION_DEVICEKVCACHE_H

#include "../flow/DeviceMemory.h"
#include "../flow/FlowOps.h"

#include "vflow/Runtime/PageTable.h"
#include "vflow/Runtime/Session.h"
#include "vflow/Runtime/cuda/Attention.h"
#include "vflow/Runtime/cuda/FlowDevice.cuh"

#include <map>
#include <utility>
#include <vector>

namespace vflow::rt::cuda {

/// A GPU KV dtype (isGpuKVDType), or an Error naming `what`.
KVType kvTypeOf(DType dtype, const char *what);

class DeviceKVCache {
public:
  /// `cfg`: the session's, defaults resolved; `flow` (null: dense at every
  /// layer) runs its cache stage at the layers >= cfg.denseLayers.
  DeviceKVCache(const FlowArtifact &flow, const SessionConfig &cfg,
                const FlowOps *ops, cudaStream_t stream);
  DeviceKVCache(const DeviceKVCache &) = delete;
  DeviceKVCache &operator=(const DeviceKVCache &) = delete;

  /// What the GPU keeps per sequence beside its pages: its state/mass slot
  /// and the decode steps it has taken.
  struct Slot {
    int slot = 0;
    int64_t steps = 0;
  };

  SeqId add();
  /// Shares `parent`'s pages, copies its states and mass (Session::fork).
  SeqId fork(SeqId parent);
  /// Shares `parent`'s first `tokens` tokens, fresh states
  /// (Session::sharePrefix).
  SeqId sharePrefix(SeqId parent, int64_t tokens);
  void release(SeqId seq);
  /// Evicts complete blocks of `seq` (PageTable::evict: logical ids,
  /// strictly increasing; Error, changing nothing, for any other): their
  /// pages return to the pool unless shared, and the per-block states and
  /// attention mass of its slot follow the kept blocks (on `st`; waits).
  void evict(SeqId seq, const std::vector<int64_t> &blocks, cudaStream_t st);
  /// Evicts single tokens of `seq` (PageTable::evictTokens: logical token
  /// indices, strictly increasing, in complete blocks) and repacks the kept
  /// ones into the fewest pages on the device (moveTokens: K, V and their
  /// token scales of every layer; a shared page is copied, never
  /// rewritten); the rewritten complete blocks get their fields again, and
  /// their per-block state rows and attention mass start over. Returns the
  /// first rewritten block (on `st`; waits). Error, changing nothing, for
  /// bad input.
  int64_t evictTokens(SeqId seq, const std::vector<int64_t> &tokens,
                      cudaStream_t st);
  /// The slot of a live `seq`, or an Error naming it.
  const Slot &slotOf(SeqId seq) const;
  Slot &slotOf(SeqId seq);
  /// The slot of a step's padding rows (past every sequence's).
  int padSlot() const { return cfg.maxSequences; }

  /// Throws, changing nothing, when growing seqs[i] by growth[i] tokens
  /// would pass maxBlocksPerSeq or exhaust the pool.
  void checkGrowth(const std::vector<SeqId> &seqs,
                   const std::vector<int64_t> &growth) const;
  /// Grows `seq` by `n` tokens (checkGrowth first): each new token's (page,
  /// position). A partial tail shared with a fork is copied first (K and V
  /// of every layer, on `st`).
  std::vector<std::pair<PageId, int64_t>> grow(SeqId seq, int64_t n,
                                               cudaStream_t st);
  /// Writes K/V (device bf16 [tokens, numLayers, kvHeads, headDim]) of
  /// layers [firstLayer, firstLayer + numLayers) at `at`, then the flow's
  /// cache stage on the pages in `completed` at the layers that run it. On
  /// `st`, no host wait.
  void write(int firstLayer, int numLayers,
             const std::vector<std::pair<PageId, int64_t>> &at,
             const std::vector<int> &completed, const void *k, const void *v,
             cudaStream_t st);
  /// The attention mass `seq`'s index stage reads at its next step at
  /// `layer` (host f32 [numKVHeads, numBlocks, group]); waits.
  void setMass(SeqId seq, int layer, const std::vector<float> &mass);

  /// Whether `layer` attends every block (no flow there: no fields, no
  /// index stage).
  /// Dense layers attend every block (a sliding-window layer its window's
  /// tokens): no flow runs there.
  bool denseAt(int layer) const {
    return !ops || layer < cfg.denseLayers || windowAt(layer) > 0;
  }
  /// The layer's sliding window (SessionConfig::slidingWindow; 0: none).
  int windowAt(int layer) const {
    return layer < int(cfg.slidingWindow.size())
               ? int(cfg.slidingWindow[size_t(layer)])
               : 0;
  }
  bool readsMass() const { return massReader; }
  /// `layer`'s pools as attention reads them.
  void view(PagedKVArgs &a, int layer) const;
  /// `layer`'s V pool: its K pool on a latent cache (valuesAreKeys).
  void *vPoolAt(int layer) const;
  /// `layer`'s pools, fields, states and mass slots as the flow's kernels
  /// read them (the step's members are the plan's).
  void flowArgs(VflowGpuArgs &a, int layer) const;
  /// The mass slots of `layer` ([slots, kvHeads, maxBlocks, group]).
  float *massSlots(int layer) const { return mass[size_t(layer)].get<float>(); }

  PageTable table;

private:
  void allocate();
  /// Rows j < rows of every per-block array of `slot` (states, old and
  /// new, and the mass) become row from[j] (-1: the state's initial value,
  /// no mass); waits.
  void moveSlotRows(int slot, const std::vector<int> &from, cudaStream_t st);
  /// The flow's fields of `pages` at every flow layer (the cache stage).
  void computeFields(const std::vector<int> &pages, cudaStream_t st);
  /// A fresh slot: states at their initial values, no attention mass.
  void resetSlot(int slot);
  int takeSlot();
  int64_t stateSlotElements(size_t state) const;
  int64_t massSlotElements() const;

  const FlowArtifact &flow;
  const SessionConfig &cfg;
  const FlowOps *ops;
  cudaStream_t stream;
  KVType kvType;
  bool massReader = false;
  std::map<SeqId, Slot> seqs;
  std::vector<int> freeSlots;
  std::vector<DeviceArray> kPool, vPool;
  std::vector<std::vector<DeviceArray>> fieldPools; // [layer][field]
  std::vector<std::vector<DeviceArray>> stateOld, stateNew;
  std::vector<DeviceArray> mass; // per layer, if massReader
  /// Per layer, 8-bit pools only: each stored row's scale ([pages,
  /// kvHeads, pageSize] f32).
  std::vector<DeviceArray> kTokenScale, vTokenScale;
  static float *tokenScales(const std::vector<DeviceArray> &pools, int layer) {
    return pools.empty() ? nullptr : pools[size_t(layer)].get<float>();
  }
  /// Per layer: its fields', old states' and new states' pointers.
  DeviceArray layerPtrs;
  /// write()'s pages, positions and completed pages.
  IntUpload indexUpload;
  /// evict()'s arrays and row map.
  DeviceArray evictUpload;
  /// evictTokens(): the moves and pool pointers, and the staging buffer.
  DeviceArray moveUpload, moveStaging;
};

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_SESSION_DEVICEKVCACHE_H
