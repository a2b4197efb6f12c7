//===- GpuSessionImpl.h - The GPU session's state ---------------*- C++ -*-===//
//
// GpuSession::Impl: the device pools and buffers, the page table, the
// sequences' slots, the step metadata and the held one-token appends.
// GpuSession.cpp sets it up and manages sequences; GpuStep.cpp appends and
// decodes.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_FLOW_GPUSESSIONIMPL_H
#define VFLOW_RUNTIME_CUDA_FLOW_GPUSESSIONIMPL_H

#include "vflow/Runtime/cuda/GpuSession.h"

#include "DeviceMemory.h"
#include "FlowKernels.h"

#include "vflow/Runtime/PageTable.h"
#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/cuda/Attention.h"
#include "vflow/Runtime/cuda/Driver.h"
#include "vflow/Runtime/cuda/FlowDevice.cuh"
#include "vflow/Runtime/cuda/GpuFlowInfo.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace vflow::rt::cuda {

/// Bytes of one K/V element of the GPU's KV dtype.
size_t kvBytes(const std::string &dtype);
KVType kvType(const std::string &dtype);

struct GpuSession::Impl {
  /// What the session keeps of the flow (rt::sessionFlow), its own copy:
  /// the caller's artifact may be gone once the session is open.
  FlowArtifact flow;
  GpuSessionConfig cfg;
  /// The flow's kernels, consts and params on the device.
  std::unique_ptr<FlowKernels> kernels;
  cudaStream_t stream = nullptr;
  int64_t pageSize = 0;
  bool readsMass = false;

  /// Pages, block tables and lengths: the logic the host cache shares.
  PageTable table;
  /// What the GPU keeps per sequence beside its pages: its state/mass slot
  /// and how many steps it has decoded.
  struct Slot {
    int slot = 0;
    int64_t steps = 0;
  };
  std::map<SeqId, Slot> seqs;
  std::vector<int> freeSlots;

  // Device memory.
  std::vector<DeviceArray> kPool, vPool;
  std::vector<std::vector<DeviceArray>> fieldPools; // [layer][field]
  std::vector<std::vector<DeviceArray>> stateOld, stateNew;
  std::vector<DeviceArray> massSlots; // per layer, if readsMass
  DeviceArray massRows, kScale, vScale;
  DeviceArray layerPtrs; // per layer: fields, statesOld, statesNew pointers
  DeviceArray seqLen, blockTable, slotOf, stepOf, indptr, count, tablePages,
      tableBlocks, workspace, attnWorkspace, fillPages;
  // Dense layers' lists: per row, its block table (denseLayers > 0).
  DeviceArray denseIndptr, denseBlocks, denseCount;
  // Prefill's metadata (qIndptr, seqLen, indptr, pages).
  PinnedBuffer hostPrefill;
  DeviceArray devPrefill;
  /// Blocks attended by dense-layer decodes (telemetry; the sparse ones are
  /// counted on the device).
  int64_t denseAttended = 0;
  size_t attnWorkspaceBytes = 0;
  int64_t wsStride = 0;

  // Profiling: an event before each launch of the last decodeLayer.
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  void mark(const std::string &name, cudaStream_t st) {
    if (!cfg.profile)
      return;
    cudaEvent_t e;
    checkCuda(cudaEventCreate(&e), "creating an event");
    checkCuda(cudaEventRecord(e, st), "recording an event");
    marks.push_back({name, e});
  }

  // The step the device metadata (seqLen, blockTable, slotOf, stepOf,
  // indptr) describes: its rows, valid until a sequence changes.
  std::vector<SeqId> rows;
  bool rowsValid = false;
  std::vector<int> hostIndptr;
  PinnedBuffer hostMeta, hostIndex;
  DeviceArray devIndex;

  // One-token appends held for the fused append of the next decode at
  // their layer: per layer, device bf16 [rows, kvHeads, headDim] and the
  // sequences of the rows (empty: none held).
  std::vector<DeviceArray> kStage, vStage;
  std::vector<std::vector<SeqId>> staged;
  std::vector<cudaStream_t> stageStream;

  // Telemetry (SessionConfig::telemetry): per layer, a copy of the last
  // decode's block lists ([rows * kvHeads] counts, entries at hostIndptr)
  // and its rows; a device total of the blocks attended.
  struct Snapshot {
    DeviceArray count, blocks;
    std::vector<int> indptr;
    std::vector<SeqId> rows;
    /// A dense layer's decode: each row's block count (every block).
    std::vector<int64_t> denseBlocks;
  };
  std::vector<Snapshot> snapshots;
  DeviceArray attendedTotal;
  // Mass recall (massRecall): the dense pass's mass rows and output, and
  // per layer the sums ([layer][kvHeads * group] doubles) and samples.
  DeviceArray recallMass, recallOut, recallSum, recallSamples;
  // The observation window (observeTokens, flows that read mass): the
  // window rows' mass and output, and their metadata.
  DeviceArray observeMass, observeOut, devObserve;
  PinnedBuffer hostObserve;
  /// The pool, dtype and shape members of an attention launch at `layer`.
  void pagedKV(PagedKVArgs &a, int layer, int batch, const void *q,
               void *out) const {
    a.kPool = kPool[layer].get();
    a.vPool = vPool[layer].get();
    a.kScale = cfg.kScale.empty() ? nullptr : kScale.get<float>();
    a.vScale = cfg.vScale.empty() ? nullptr : vScale.get<float>();
    a.kvType = kvType(cfg.kvDType);
    a.batch = batch;
    a.numKVHeads = cfg.numKVHeads;
    a.group = cfg.group;
    a.headDim = cfg.headDim;
    a.pageSize = int(pageSize);
    a.numPages = int(cfg.numPages);
    a.q = q;
    a.out = out;
    a.scale = cfg.scale;
  }
  /// Decode lists of every block of each row: one list per row over
  /// `pages` (the rows' block tables), with `count` blocks each.
  void denseLists(PagedAttentionArgs &p, const int32_t *count,
                  const int32_t *pages, int64_t maxEntries) const {
    p.indptr = denseIndptr.get<int32_t>();
    p.count = count;
    p.pages = pages;
    p.blocks = denseBlocks.get<int32_t>();
    p.listsPerSequence = true;
    p.maxEntries = int(std::max<int64_t>(1, maxEntries));
  }
  /// After a prefill at `layer`: each sequence's mass slot from its last
  /// observeTokens rows of q (the prefill's rows, qIndptr order).
  void observe(int layer, const std::vector<SeqId> &seqs,
               const std::vector<int64_t> &counts, const void *q,
               cudaStream_t st);
  /// The layer of the last decode (-1: none yet).
  int lastLayer = -1;

  /// The constructor's parts: the config's checks (before anything is
  /// allocated; `runsFlow`: some layer is sparse), the pools of every
  /// layer, the step's buffers, the measurements' buffers (observation
  /// window, mass recall, telemetry).
  void checkConfig(bool runsFlow);
  void allocatePools();
  void allocateStepBuffers(bool observes);
  void allocateMeasurements(bool observes);

  Impl(const FlowArtifact &flow, const GpuSessionConfig &config)
      : flow(flow), cfg(config),
        table(config.numPages, std::max<int64_t>(1, flow.blockSize),
              std::max(1, config.numLayers)) {}

  /// Copies `bytes` of `src` into `dst` on `st` through pinned memory `via`
  /// (no host wait for the copy).
  void uploadAsync(PinnedBuffer &via, DeviceArray &dst, const void *src,
                   size_t bytes, cudaStream_t st) {
    if (bytes == 0)
      return;
    dst.resize(bytes);
    void *host = via.acquire(bytes);
    std::memcpy(host, src, bytes);
    checkCuda(
        cudaMemcpyAsync(dst.get(), host, bytes, cudaMemcpyHostToDevice, st),
        "copying to the device");
    via.release(st);
  }

  void upload(DeviceArray &dst, const void *src, size_t bytes) {
    if (bytes > dst.bytes())
      throw Error("GPU session: internal: upload of " + std::to_string(bytes) +
                  " bytes into " + std::to_string(dst.bytes()));
    checkCuda(
        cudaMemcpyAsync(dst.get(), src, bytes, cudaMemcpyHostToDevice, stream),
        "copying to the device");
  }

  VflowGpuArgs args(int layer, int batch) {
    VflowGpuArgs a{};
    a.batch = batch;
    a.numKVHeads = cfg.numKVHeads;
    a.maxBlocks = static_cast<int>(cfg.maxBlocksPerSeq);
    a.pageSize = static_cast<int>(pageSize);
    a.seqLen = seqLen.get<int>();
    a.blockTable = blockTable.get<int>();
    a.slot = slotOf.get<int>();
    a.step = stepOf.get<int>();
    if (kernels)
      kernels->bind(a);
    a.kPool = kPool[layer].get();
    a.vPool = vPool[layer].get();
    a.kScale = cfg.kScale.empty() ? nullptr : kScale.get<float>();
    a.vScale = cfg.vScale.empty() ? nullptr : vScale.get<float>();
    void **ptrs = layerPtrs.get<void *>() +
                  size_t(layer) * (flow.fields.size() + 2 * flow.states.size());
    a.fields = ptrs;
    a.statesOld = reinterpret_cast<float *const *>(ptrs + flow.fields.size());
    a.statesNew = reinterpret_cast<float *const *>(ptrs + flow.fields.size() +
                                                   flow.states.size());
    a.mass = readsMass ? massSlots[layer].get<float>() : nullptr;
    a.workspace = workspace.get<float>();
    a.tableIndptr = indptr.get<int>();
    a.tableCount = count.get<int>();
    a.tablePages = tablePages.get<int>();
    a.tableBlocks = tableBlocks.get<int>();
    return a;
  }

  /// The slot of `seq`, or an Error naming it.
  Slot &slotFor(SeqId seq) {
    auto it = seqs.find(seq);
    if (it == seqs.end())
      throw Error("GPU session: no sequence " + std::to_string(seq));
    return it->second;
  }

  /// Throws, changing nothing, when growing seqList[i] by growth[i] tokens
  /// would pass maxBlocksPerSeq or exhaust the pool.
  void checkGrowth(const std::vector<SeqId> &seqList,
                   const std::vector<int64_t> &growth) const {
    int64_t needed = 0;
    for (size_t i = 0; i < seqList.size(); ++i) {
      SeqId seq = seqList[i];
      int64_t n = growth[i];
      int64_t length = table.length(seq) + n;
      if ((length + pageSize - 1) / pageSize > cfg.maxBlocksPerSeq)
        throw Error("GPU session: a sequence would reach " +
                    std::to_string(length) + " tokens, over maxBlocksPerSeq " +
                    std::to_string(cfg.maxBlocksPerSeq) + " blocks of " +
                    std::to_string(pageSize));
      needed += table.pagesNeeded(seq, n);
    }
    int64_t free = table.blockManager().numFree();
    if (needed > free)
      throw Error("GPU session: the KV cache is out of pages: " +
                  std::to_string(needed) + " more are needed, " +
                  std::to_string(free) + " of " + std::to_string(cfg.numPages) +
                  " are free (no sequence was changed)");
  }

  /// Grows `seq` by `n` tokens (checkGrowth first); returns each new
  /// token's (page, position). A partial tail page shared with a fork is
  /// copied first (K and V of every layer), so the other sequence keeps its
  /// tokens.
  std::vector<std::pair<PageId, int64_t>> grow(SeqId seq, int64_t n,
                                               cudaStream_t st) {
    if (n > 0)
      rowsValid = false;
    return table.grow(seq, n, [&](PageId from, PageId to) {
      size_t bytes = size_t(cfg.numKVHeads * pageSize * cfg.headDim) *
                     kvBytes(cfg.kvDType);
      for (int l = 0; l < cfg.numLayers; ++l)
        for (DeviceArray *pool : {&kPool[l], &vPool[l]})
          checkCuda(cudaMemcpyAsync(pool->get<char>() + size_t(to) * bytes,
                                    pool->get<char>() + size_t(from) * bytes,
                                    bytes, cudaMemcpyDeviceToDevice, st),
                    "copying a shared tail page");
    });
  }

  void resetSlot(int slot);
  /// The state/mass slot of a step's padding rows (past every sequence's).
  int padSlot() const { return cfg.maxSequences; }

  /// A free state/mass slot, or an Error.
  int takeSlot() {
    if (!freeSlots.empty()) {
      int slot = freeSlots.back();
      freeSlots.pop_back();
      return slot;
    }
    if (int(seqs.size()) < cfg.maxSequences)
      return int(seqs.size());
    throw Error("GPU session: all " + std::to_string(cfg.maxSequences) +
                " sequence slots are in use");
  }

  /// Elements of one slot of state `i` (per layer buffer).
  int64_t stateSlotElements(size_t i) const {
    const ArtifactTensor &st = flow.states[i];
    return cfg.numKVHeads * st.elements(cfg.headDim, cfg.group) *
           (st.perBlock ? cfg.maxBlocksPerSeq : 1);
  }
  int64_t massSlotElements() const {
    return cfg.numKVHeads * cfg.maxBlocksPerSeq * cfg.group;
  }

  /// Step metadata for `rowList` (no growth) on `st`; the step's shape.
  /// The step's metadata for `rowList`, then `rows - rowList.size()`
  /// padding rows (length 0, no blocks, the padding slot).
  StepShape prepare(const std::vector<SeqId> &rowList, cudaStream_t st,
                    int rows = 0);
  /// Writes K/V of layers [firstLayer, firstLayer + numLayers) for tokens
  /// at (page, slot) `at` from device bf16 `k`, `v` laid out [tokens,
  /// numLayers, kvHeads, headDim], then the fields of the pages in
  /// `completed` in those layers. On `st`, no host wait.
  void writeRows(int firstLayer, int numLayers,
                 const std::vector<std::pair<PageId, int64_t>> &at,
                 const std::vector<int> &completed, const void *k,
                 const void *v, cudaStream_t st);
  /// Writes the one-token appends held at `layer` (on the stream that held
  /// them), if any; flushStages() does every layer.
  void flushStage(int layer);
  void flushStages();
  /// The kernels of one decode layer over the prepared rows (`kNew`,
  /// `vNew`: the fused append's tokens, or null when written already).
  void launchLayer(int layer, const StepShape &shape, const void *q,
                   const void *kNew, const void *vNew, void *out,
                   cudaStream_t st);
  /// Whether decode at `layer` attends every block (no index stage).
  bool denseAt(int layer) const { return !kernels || layer < cfg.denseLayers; }
  /// Validates a step's rows: live, distinct, 1..maxBatch.
  void checkRows(const std::vector<SeqId> &rowList, const char *what) const;
};

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_FLOW_GPUSESSIONIMPL_H
