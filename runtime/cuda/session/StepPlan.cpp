//===- StepPlan.cpp - A GPU decode step's rows on the device --------------===//

#include "StepPlan.h"

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/Attention.h"

#include <algorithm>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

int64_t nextPowerOfTwo(int64_t n) {
  int64_t p = 1;
  while (p < n)
    p *= 2;
  return p;
}

} // namespace

StepPlan::StepPlan(const SessionConfig &cfg, const FlowOps *ops, bool readsMass,
                   bool denseLists, int retainUnit, bool readsFirstToken,
                   cudaStream_t stream)
    : cfg(cfg) {
  const int64_t B = cfg.maxBatch, lists = B * cfg.numKVHeads;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq;
  seqLen = DeviceArray(size_t(B) * sizeof(int));
  blockTable = DeviceArray(size_t(B * maxBlocks) * sizeof(int));
  slotOf = DeviceArray(size_t(B) * sizeof(int));
  stepOf = DeviceArray(size_t(B) * sizeof(int));
  indptr = DeviceArray(size_t(lists + 1) * sizeof(int));
  count = DeviceArray(size_t(lists) * sizeof(int));
  tablePages = DeviceArray(size_t(lists * maxBlocks) * sizeof(int));
  tableBlocks = DeviceArray(size_t(lists * maxBlocks) * sizeof(int));
  const int64_t wsFloats = ops ? ops->workspaceFloats(maxBlocks) : 0;
  workspace = DeviceArray(std::max<size_t>(1, size_t(lists * wsFloats)) *
                          sizeof(float));
  // Lists of every block: one per row over its block table (a static
  // indptr and logical ids; the counts come with the step's metadata).
  if (denseLists) {
    std::vector<int> ip(size_t(B + 1)), ids(size_t(B * maxBlocks));
    for (int64_t b = 0; b <= B; ++b)
      ip[size_t(b)] = int(b * maxBlocks);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = int(int64_t(i) % maxBlocks);
    auto upload = [&](DeviceArray &dst, const std::vector<int> &src) {
      dst = DeviceArray(src.size() * sizeof(int));
      checkCuda(cudaMemcpyAsync(dst.get(), src.data(), dst.bytes(),
                                cudaMemcpyHostToDevice, stream),
                "copying to the device");
    };
    upload(denseIndptr, ip);
    upload(denseBlocks, ids);
    denseCount = DeviceArray(size_t(B) * sizeof(int));
  }
  // The attention's split plan depends on the step's rows: the workspace
  // holds the largest any batch up to maxBatch needs.
  for (int64_t rows = 1; rows <= B; ++rows)
    attnWorkspaceBytes =
        std::max(attnWorkspaceBytes,
                 pagedDecodeWorkspaceBytes(
                     int(rows), cfg.numKVHeads, cfg.group, cfg.headDim,
                     int(maxBlocks), cfg.valuesAreKeys ? cfg.headDim : 0));
  attnWorkspace = DeviceArray(attnWorkspaceBytes);
  if (readsFirstToken)
    firstToken = DeviceArray(size_t(B * maxBlocks) * sizeof(int));
  if (retainUnit > 0) {
    retainScores =
        DeviceArray(size_t(lists * maxBlocks * retainUnit) * sizeof(float));
    retainFolded =
        DeviceArray(size_t(B * maxBlocks * retainUnit) * sizeof(float));
  }
  if (readsMass) {
    massRows =
        DeviceArray(size_t(lists * maxBlocks) * cfg.group * sizeof(float));
    checkCuda(cudaMemsetAsync(massRows.get(), 0, massRows.bytes(), stream),
              "zeroing the attention mass");
  }
  checkCuda(cudaStreamSynchronize(stream), "setting up the step buffers");
}

const StepKey &StepPlan::prepare(const DeviceKVCache &cache,
                                 const FlowParams *params, bool mustIndex,
                                 const std::vector<SeqId> &rowList,
                                 int64_t rows, bool graphSafe,
                                 cudaStream_t st) {
  const int B = int(std::max<int64_t>(int64_t(rowList.size()), rows));
  const int64_t maxBlocks = cfg.maxBlocksPerSeq, H = cfg.numKVHeads;
  const int64_t pageSize = cache.table.pageSize();
  // The budgets at each row's length, before anything of the step runs.
  if (params)
    for (SeqId seq : rowList)
      params->checkBudgetsAt(cache.table.length(seq));
  // One pinned block: lengths, slots, steps, indptr, block tables, the
  // rows' block counts (lists of every block).
  const bool first = firstToken.get() != nullptr;
  const size_t ints = size_t(4 * B) + size_t(B * H + 1) +
                      size_t(B * maxBlocks) * (first ? 2 : 1);
  int *host = static_cast<int *>(hostMeta.acquire(ints * sizeof(int)));
  int *len = host, *slot = len + B, *step = slot + B, *ip = step + B,
      *tab = ip + B * H + 1, *rowBlocks = tab + B * maxBlocks,
      *firsts = rowBlocks + B;
  std::fill(host, host + ints, 0);
  int64_t longest = 0, maxEntries = 0;
  bool everyBlock = params && !mustIndex && !rowList.empty();
  for (int b = int(rowList.size()); b < B; ++b)
    slot[b] = cache.padSlot(); // padding: length 0, no blocks
  for (int b = 0; b < int(rowList.size()); ++b) {
    const SeqId seq = rowList[b];
    const int64_t length = cache.table.length(seq);
    const std::vector<PageId> &pages = cache.table.blocks(seq);
    const DeviceKVCache::Slot &sl = cache.slotOf(seq);
    len[b] = int(length);
    slot[b] = sl.slot;
    step[b] = int(sl.steps);
    for (size_t j = 0; j < pages.size(); ++j)
      tab[b * maxBlocks + int64_t(j)] = int(pages[j]);
    if (first) // where each block's first token was before any eviction
      for (size_t j = 0; j < pages.size(); ++j)
        firsts[b * maxBlocks + int64_t(j)] =
            int(cache.table.originalPosition(seq, int64_t(j) * pageSize));
    const int64_t numBlocks = int64_t(pages.size());
    rowBlocks[b] = int(numBlocks);
    longest = std::max(longest, numBlocks);
    // Only sparse layers read maxEntries: with no flow it stays 0.
    if (params) {
      maxEntries = std::max(maxEntries, params->maxEntries(length));
      everyBlock = everyBlock && params->takesEveryBlock(length);
    }
    for (int64_t h = 0; h < H; ++h)
      ip[b * H + h + 1] = int(numBlocks);
  }
  for (int64_t i = 1; i <= B * H; ++i)
    ip[i] += ip[i - 1];
  hostIndptr.assign(ip, ip + B * H + 1);
  auto copy = [&](DeviceArray &dst, const int *src, size_t n) {
    checkCuda(cudaMemcpyAsync(dst.get(), src, n * sizeof(int),
                              cudaMemcpyHostToDevice, st),
              "copying the step's metadata");
  };
  copy(seqLen, len, size_t(B));
  copy(slotOf, slot, size_t(B));
  copy(stepOf, step, size_t(B));
  copy(indptr, ip, size_t(B * H + 1));
  copy(blockTable, tab, size_t(B * maxBlocks));
  if (denseCount.get())
    copy(denseCount, rowBlocks, size_t(B));
  if (first)
    copy(firstToken, firsts, size_t(B * maxBlocks));
  hostMeta.release(st);
  seqs = rowList;
  valid = true;
  stepKey = StepKey();
  stepKey.rows = B;
  stepKey.everyBlock = everyBlock;
  if (graphSafe) {
    // Grids over every block a sequence may reach; attention planned for
    // lists rounded up to a power of two (at most the longest a row can
    // hold): a key changes a few times as contexts grow, not every block.
    stepKey.gridBlocks = stepKey.denseEntries = maxBlocks;
    if (params && maxEntries > 0)
      maxEntries = std::max(
          maxEntries, std::min({nextPowerOfTwo(maxEntries), maxBlocks,
                                params->maxEntries(maxBlocks * pageSize)}));
  } else {
    stepKey.gridBlocks = stepKey.denseEntries = longest;
  }
  stepKey.maxEntries = maxEntries;
  return stepKey;
}

void StepPlan::stepArgs(VflowGpuArgs &a) const {
  a.batch = int(stepKey.rows);
  a.seqLen = seqLen.get<int>();
  a.blockTable = blockTable.get<int>();
  a.slot = slotOf.get<int>();
  a.step = stepOf.get<int>();
  a.workspace = workspace.get<float>();
  a.tableIndptr = indptr.get<int>();
  a.tableCount = count.get<int>();
  a.tablePages = tablePages.get<int>();
  a.tableBlocks = tableBlocks.get<int>();
  a.firstToken = firstToken.get<int>();
}

void StepPlan::attentionArgs(PagedAttentionArgs &p) const {
  p.batch = int(stepKey.rows);
  p.seqLen = seqLen.get<int32_t>();
  p.maxEntries = int(std::max<int64_t>(1, stepKey.maxEntries));
  p.mass = massRows.get<float>();
  p.massStride = int(cfg.maxBlocksPerSeq);
  p.workspace = attnWorkspace.get();
  p.workspaceBytes = attnWorkspaceBytes;
}

void StepPlan::everyBlockLists(PagedAttentionArgs &p,
                               int64_t maxEntries) const {
  p.indptr = denseIndptr.get<int32_t>();
  p.count = denseCount.get<int32_t>();
  p.pages = blockTable.get<int32_t>();
  p.blocks = denseBlocks.get<int32_t>();
  p.listsPerSequence = true;
  p.maxEntries = int(std::max<int64_t>(1, maxEntries));
}
