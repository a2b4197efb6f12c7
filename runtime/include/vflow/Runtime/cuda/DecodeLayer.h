//===- DecodeLayer.h - One sparse decode layer on the GPU -------*- C++ -*-===//
//
// The one routine of a decode layer, as the GPU session runs it (eager or
// captured in a CUDA graph) and the torch ops expose it
// (vflow::flow_decode_layer):
//
//   1. this step's token appended (when kNew: each row's K/V into its tail
//      page, the flow's cache stage on a block it completes);
//   2. the selection: the flow's index stage writes each (row, KV head)'s
//      block list; or, when the selection takes every block and keeps no
//      states, the lists are written without scoring; or, on a dense layer
//      (no flow), each row's block table is its list;
//   3. sparse paged decode attention over the lists (Attention.h), with the
//      per-block attention mass for a flow that reads it;
//   4. that mass carried to the rows' state slots for the next step.
//
// Device work only, on one stream, no host wait: capturable.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_DECODELAYER_H
#define VFLOW_RUNTIME_CUDA_DECODELAYER_H

#include "vflow/Runtime/cuda/Attention.h"
#include "vflow/Runtime/cuda/FlowOpsAbi.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace vflow::rt::cuda {

struct DecodeLayerArgs {
  /// The flow's kernels, or null: a dense layer.
  const VflowFlowOps *flow = nullptr;
  /// With a flow: its arguments (this layer's pools, fields, states and mass
  /// slots; the step's lengths, tables and slots; the lists the index stage
  /// writes, which attention then reads). q (attention's), kNew and vNew
  /// are set from below.
  VflowGpuArgs *index = nullptr;
  /// Blocks the index stage's tile kernels cover (the step's longest row,
  /// or every block a captured step may reach).
  int64_t gridBlocks = 0;
  /// The selection takes every block of every row and the flow stores no
  /// states: lists written without scoring.
  bool everyBlock = false;
  /// This step's token, bf16 [batch, numKVHeads, headDim]; null: its K/V
  /// are in the pools already.
  const void *kNew = nullptr, *vNew = nullptr;
  /// Attention: pools, q, out, lengths, workspace, maxEntries, and the
  /// mass rows ([batch * numKVHeads, maxBlocks, group]; null when the flow
  /// does not read mass). With a flow, the lists are the index stage's
  /// (set from `index`); on a dense layer the caller sets every block of
  /// each row (listsPerSequence, pages = the block table).
  PagedAttentionArgs attention;
  /// Dense layers with kNew: the rows' block tables [batch, maxBlocks].
  const int *blockTable = nullptr;
  int maxBlocks = 0;
  /// Runs before each launch when not null (profiling marks).
  void (*before)(void *ctx, const char *what) = nullptr;
  void *ctx = nullptr;
};

/// Launches the layer on `stream`; throws Error naming what failed.
void decodeLayer(DecodeLayerArgs &args, cudaStream_t stream);

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_DECODELAYER_H
