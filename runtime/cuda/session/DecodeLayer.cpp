//===- DecodeLayer.cpp - One sparse decode layer on the GPU ---------------===//

#include "vflow/Runtime/cuda/DecodeLayer.h"

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/SessionKernels.h"

#include <algorithm>
#include <string>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

void mark(const DecodeLayerArgs &l, const char *what) {
  if (l.before)
    l.before(l.ctx, what);
}

void throwIf(const char *error) {
  if (error)
    throw Error(error);
}

/// Each row's new token into its tail page, with no flow to do it.
void appendDenseRows(const DecodeLayerArgs &l, cudaStream_t st) {
  const PagedAttentionArgs &p = l.attention;
  AppendRowsArgs w;
  w.k = static_cast<const unsigned short *>(l.kNew);
  w.v = static_cast<const unsigned short *>(l.vNew);
  w.seqLen = p.seqLen;
  w.blockTable = l.blockTable;
  w.batch = p.batch;
  w.maxBlocks = l.maxBlocks;
  w.numKVHeads = p.numKVHeads;
  w.pageSize = p.pageSize;
  w.headDim = p.headDim;
  w.kPool = const_cast<void *>(p.kPool);
  w.vPool = const_cast<void *>(p.vPool);
  w.kTokenScale = const_cast<float *>(p.kTokenScale);
  w.vTokenScale = const_cast<float *>(p.vTokenScale);
  w.kvType = p.kvType;
  appendRows(w, st);
}

/// The lists of a selection that takes every block: each row's blocks in
/// order, written without scoring (the append still runs).
void selectEveryBlock(const DecodeLayerArgs &l, cudaStream_t st) {
  VflowGpuArgs &a = *l.index;
  if (l.kNew) {
    mark(l, "append");
    throwIf(l.flow->launchAppend(l.flow->self, &a, st));
  }
  mark(l, "every block");
  EveryBlockArgs e;
  e.seqLen = a.seqLen;
  e.blockTable = a.blockTable;
  e.indptr = a.tableIndptr;
  e.count = a.tableCount;
  e.pages = a.tablePages;
  e.blocks = a.tableBlocks;
  e.batch = a.batch;
  e.numKVHeads = a.numKVHeads;
  e.maxBlocks = a.maxBlocks;
  e.pageSize = a.pageSize;
  writeEveryBlock(e, st);
}

} // namespace

void vflow::rt::cuda::decodeLayer(DecodeLayerArgs &l, cudaStream_t st) {
  PagedAttentionArgs &p = l.attention;
  if (!l.flow) {
    if (l.kNew) {
      mark(l, "append");
      appendDenseRows(l, st);
    }
  } else {
    VflowGpuArgs &a = *l.index;
    a.q = static_cast<const unsigned short *>(p.q);
    a.kNew = static_cast<const unsigned short *>(l.kNew);
    a.vNew = static_cast<const unsigned short *>(l.vNew);
    if (l.everyBlock && !l.flow->storesStates)
      selectEveryBlock(l, st);
    else
      throwIf(l.flow->launchIndex(l.flow->self, &a, l.gridBlocks,
                                  l.kNew != nullptr, st, l.before, l.ctx));
    p.indptr = a.tableIndptr;
    p.count = a.tableCount;
    p.pages = a.tablePages;
    p.blocks = a.tableBlocks;
    p.listsPerSequence = false;
  }
  p.maxEntries = std::max(1, p.maxEntries);
  mark(l, "attention");
  pagedDecodeAttention(p, st);
  if (l.flow && l.flow->readsMass && p.mass) {
    const VflowGpuArgs &a = *l.index;
    mark(l, "carry mass");
    carryMass(p.mass, const_cast<float *>(a.mass), a.slot, a.seqLen, a.batch,
              a.numKVHeads, a.maxBlocks, p.group, a.pageSize, st);
  }
  mark(l, "end");
}
