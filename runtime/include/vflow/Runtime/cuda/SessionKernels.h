//===- SessionKernels.h - The GPU session's own small kernels ---*- C++ -*-===//

#ifndef VFLOW_RUNTIME_CUDA_SESSIONKERNELS_H
#define VFLOW_RUNTIME_CUDA_SESSIONKERNELS_H

#include "vflow/Runtime/cuda/Attention.h"

namespace vflow::rt::cuda {

struct WriteTokensArgs {
  /// bf16 [n, numLayers, kvHeads, D]; `layer` is the one written.
  const unsigned short *k = nullptr, *v = nullptr;
  int layer = 0, numLayers = 1;
  const int *pages = nullptr, *positions = nullptr; ///< per token (device)
  int n = 0, numKVHeads = 0, pageSize = 0, headDim = 0;
  /// Pages in each pool: pages[t] must be in [0, numPages) and
  /// positions[t] in [0, pageSize) (checked on the device, IndexCheck.cuh).
  int numPages = 0;
  void *kPool = nullptr, *vPool = nullptr;
  /// 8-bit pools: each stored row's scale ([numPages, kvHeads, pageSize]).
  float *kTokenScale = nullptr, *vTokenScale = nullptr;
  KVType kvType = KVType::BF16;
};

/// Stores n tokens into the pools (KV dtype; 8-bit rows with their scales,
/// FlowDevice.cuh's storeKVRow).
void writeTokens(const WriteTokensArgs &args, void *stream);

/// Stores each row's new token (k, v bf16 [batch, kvHeads, D]) at its
/// position seqLen[b] - 1, in the page blockTable[b * maxBlocks + block]:
/// the append of a decode step at a layer without a flow (no host
/// metadata, so a CUDA graph replays it at any length).
struct AppendRowsArgs {
  const unsigned short *k = nullptr, *v = nullptr;
  const int *seqLen = nullptr, *blockTable = nullptr;
  int batch = 0, maxBlocks = 0, numKVHeads = 0, pageSize = 0, headDim = 0;
  void *kPool = nullptr, *vPool = nullptr;
  float *kTokenScale = nullptr, *vTokenScale = nullptr; ///< as WriteTokensArgs
  KVType kvType = KVType::BF16;
};
void appendRows(const AppendRowsArgs &args, void *stream);

/// The sparse block table of a step whose selection takes every block:
/// list r (row b = r / numKVHeads) holds blocks 0 .. ceil(seqLen[b] /
/// pageSize) - 1, ascending, as logical ids and pages, and its count: what
/// the index stage writes when it selects every block. Launched as a
/// programmatic dependent (Launch.h).
struct EveryBlockArgs {
  const int *seqLen = nullptr, *blockTable = nullptr, *indptr = nullptr;
  int *count = nullptr, *pages = nullptr, *blocks = nullptr;
  int batch = 0, numKVHeads = 0, maxBlocks = 0, pageSize = 0;
};
void writeEveryBlock(const EveryBlockArgs &args, void *stream);

/// Moves each row's per-block attention mass ([rows, maxBlocks, group]) to
/// its sequence's slot ([slots, kvHeads, maxBlocks, group]) and zeroes the
/// row for the next step.
void carryMass(float *rows, float *slots, const int *slotOf, const int *seqLen,
               int batch, int numKVHeads, int maxBlocks, int group,
               int pageSize, void *stream);

/// The most device pointers storePointers() takes.
constexpr int kMaxStoredPointers = 32;

/// Writes the host pointers `src[0, n)` (n <= kMaxStoredPointers) into the
/// device array `dst`, in stream order: they travel as a kernel argument,
/// so a CUDA graph that captures the call replays the same values with no
/// host memory behind them.
void storePointers(void **dst, void *const *src, int n, void *stream);

/// Mass recall (SessionConfig::massRecall): for each list (row b, KV head
/// h) of a sparse decode and each query head j of the group, adds the dense
/// mass of the list's blocks (mass: [rows * kvHeads, maxBlocks, group], as
/// the attention kernel writes it) to sum[h * group + j], and the real rows
/// (seqLen > 0) to *samples.
struct MassRecallArgs {
  const float *mass = nullptr;
  const int *indptr = nullptr, *count = nullptr, *blocks = nullptr,
            *seqLen = nullptr;
  int batch = 0, numKVHeads = 0, group = 0, maxBlocks = 0;
  double *sum = nullptr;
  unsigned long long *samples = nullptr;
};
void massRecall(const MassRecallArgs &args, void *stream);

/// The observation window: dst[h][e] = scale * sum over r < numRows of
/// rows[r * numKVHeads + h][e] (+= with `accumulate`), e < elements.
void sumMassRows(const float *rows, int numRows, int numKVHeads,
                 long long elements, float *dst, float scale, bool accumulate,
                 void *stream);

/// The retain block at a flow layer: folds each row's KV heads' scores
/// (scores: [batch * numKVHeads, maxBlocks], as the retain kernel writes
/// them) into folded ([batch, maxBlocks]) over the row's complete blocks
/// (seqLen[b] / pageSize), starting from NumericRules' retainInit when
/// `first` (the step's first flow layer). Sum or `max`, as the CPU folds.
void foldRetain(const float *scores, float *folded, const int *seqLen,
                int batch, int numKVHeads, int maxBlocks, int pageSize,
                int unit, bool max, bool first, void *stream);

/// One per-block array of a sequence's slot for compactRows: row j of KV
/// head h is base[h * headStride + j * rowElements, + rowElements).
struct RowArray {
  float *base;
  long long headStride;
  int rowElements;
  float fill; ///< what a row with no source becomes (a state's init, 0)
};
/// After an eviction: row j of every array (each of numKVHeads heads)
/// becomes its row from[j] (from[j] >= j, increasing; -1: `fill`), for
/// j < rows. arrays and from are device memory.
void compactRows(const RowArray *arrays, int numArrays, int numKVHeads,
                 const int *from, int rows, void *stream);

/// A token-grain eviction's repack (PageTable::evictTokens' moves) in the
/// pools of every layer: kept token i moves from (moves[4i], moves[4i+1])
/// (page, slot) to (moves[4i+2], moves[4i+3]), K and V rows of every KV
/// head as stored, with their token scales (8-bit pools). Moves come in
/// the order of their logical positions, each to a position at or before
/// its own, so the moves of a chunk can only overwrite the sources of
/// earlier moves: each chunk is gathered into `staging`, then scattered.
struct MoveTokensArgs {
  const int *moves = nullptr; ///< device, [n, 4]
  int n = 0;
  /// Device arrays of numLayers pointers: each layer's K and V pools and
  /// (8-bit) their token scales (null arrays: none).
  void *const *kPools = nullptr, *const *vPools = nullptr;
  float *const *kScales = nullptr, *const *vScales = nullptr;
  int numLayers = 0, numKVHeads = 0, pageSize = 0;
  int rowBytes = 0; ///< one stored K (or V) row: headDim x the dtype's bytes
  unsigned char *staging = nullptr;
  size_t stagingBytes = 0;
};
void moveTokens(const MoveTokensArgs &args, void *stream);

/// Adds each row's counts (numKVHeads lists each) to perSlot[slotOf[row]]
/// (telemetry: the blocks each sequence attended).
void addSlotCounts(const int *counts, int rows, int numKVHeads,
                   const int *slotOf, unsigned long long *perSlot,
                   void *stream);
/// Adds the `n` counts to `*total` (telemetry: the blocks a step attended).
void addCounts(const int *counts, int n, unsigned long long *total,
               void *stream);

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_SESSIONKERNELS_H
