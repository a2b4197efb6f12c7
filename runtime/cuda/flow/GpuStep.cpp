//===- GpuStep.cpp - The GPU session's appends and decode steps -----------===//
//
// Writing K/V into the device pools (prefill, layer by layer, held
// one-token appends), the step metadata, the launches of one decode layer
// and what a decode leaves behind (block lists, telemetry, profile).
//
//===----------------------------------------------------------------------===//

#include "GpuSessionImpl.h"
#include "vflow/Runtime/cuda/SessionKernels.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Session.h"

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

cudaStream_t streamOr(void *stream, cudaStream_t fallback) {
  return stream ? static_cast<cudaStream_t>(stream) : fallback;
}

} // namespace

//===----------------------------------------------------------------------===//
// Impl: metadata, writes, launches
//===----------------------------------------------------------------------===//

void GpuSession::Impl::checkRows(const std::vector<SeqId> &rowList,
                                 const char *what) const {
  const int B = int(rowList.size());
  if (B < 1 || B > cfg.maxBatch)
    throw Error(std::string("GPU session: ") + what + " needs 1 to maxBatch (" +
                std::to_string(cfg.maxBatch) + ") sequences, not " +
                std::to_string(B));
  checkStepArgs(what, rowList, nullptr);
  for (SeqId seq : rowList)
    table.require(seq, "GPU session");
}

StepShape GpuSession::Impl::prepare(const std::vector<SeqId> &rowList,
                                    cudaStream_t st, int rows) {
  const int B = std::max(int(rowList.size()), rows);
  const int64_t maxBlocks = cfg.maxBlocksPerSeq, H = cfg.numKVHeads;
  // The budgets at each row's length, before anything of the step runs.
  if (kernels)
    for (SeqId seq : rowList)
      kernels->params().checkBudgetsAt(table.length(seq));
  // One pinned block: lengths, slots, steps, indptr, block tables, the
  // rows' block counts (dense layers).
  const size_t ints = size_t(4 * B) + size_t(B * H + 1) + size_t(B * maxBlocks);
  int *host = static_cast<int *>(hostMeta.acquire(ints * sizeof(int)));
  int *len = host, *slot = len + B, *step = slot + B, *ip = step + B,
      *tab = ip + B * H + 1, *rowBlocks = tab + B * maxBlocks;
  std::fill(host, host + ints, 0);
  int64_t longest = 0, maxEntries = 0;
  bool everyBlock = kernels && !kernels->storesStates() && !rowList.empty();
  for (int b = int(rowList.size()); b < B; ++b)
    slot[b] = padSlot(); // padding: length 0, no blocks
  for (int b = 0; b < int(rowList.size()); ++b) {
    const SeqId seq = rowList[b];
    const int64_t length = table.length(seq);
    const std::vector<PageId> &pages = table.blocks(seq);
    const Slot &sl = seqs.at(seq);
    len[b] = int(length);
    slot[b] = sl.slot;
    step[b] = int(sl.steps);
    for (size_t j = 0; j < pages.size(); ++j)
      tab[b * maxBlocks + int64_t(j)] = int(pages[j]);
    int64_t numBlocks = int64_t(pages.size());
    rowBlocks[b] = int(numBlocks);
    longest = std::max(longest, numBlocks);
    // Only sparse layers read maxEntries: with no flow it stays 0, so a
    // dense step's shape (a CUDA graph's key) does not change as rows grow.
    if (kernels) {
      maxEntries = std::max(maxEntries, kernels->params().maxEntries(length));
      everyBlock = everyBlock && kernels->params().takesEveryBlock(length);
    }
    for (int64_t h = 0; h < H; ++h)
      ip[b * H + h + 1] = int(numBlocks);
  }
  for (int64_t i = 1; i <= B * H; ++i)
    ip[i] += ip[i - 1];
  hostIndptr.assign(ip, ip + B * H + 1);
  lastLayer = -1; // the live block lists no longer match the metadata
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
  if (cfg.denseLayers > 0 || cfg.massRecall)
    copy(denseCount, rowBlocks, size_t(B));
  hostMeta.release(st);
  this->rows = rowList;
  rowsValid = true;
  StepShape shape;
  shape.batch = B;
  shape.gridBlocks = cfg.graphSafe ? maxBlocks : longest;
  shape.maxEntries = maxEntries;
  shape.everyBlock = everyBlock;
  // Dense layers attend every block: a captured step plans for them all.
  shape.denseEntries = cfg.graphSafe ? maxBlocks : longest;
  return shape;
}

void GpuSession::Impl::writeRows(
    int firstLayer, int numLayers,
    const std::vector<std::pair<PageId, int64_t>> &at,
    const std::vector<int> &completed, const void *k, const void *v,
    cudaStream_t st) {
  const int64_t n = int64_t(at.size());
  if (n == 0)
    return;
  // Pages, then positions, then completed pages: one upload.
  std::vector<int> index(size_t(2 * n) + completed.size());
  for (int64_t t = 0; t < n; ++t) {
    index[size_t(t)] = int(at[size_t(t)].first);
    index[size_t(n + t)] = int(at[size_t(t)].second);
  }
  std::copy(completed.begin(), completed.end(), index.begin() + 2 * n);
  uploadAsync(hostIndex, devIndex, index.data(), index.size() * sizeof(int),
              st);
  const int *dev = devIndex.get<int>();

  for (int layer = firstLayer; layer < firstLayer + numLayers; ++layer) {
    WriteTokensArgs w;
    w.k = static_cast<const unsigned short *>(k);
    w.v = static_cast<const unsigned short *>(v);
    w.layer = layer - firstLayer;
    w.numLayers = numLayers;
    w.pages = dev;
    w.positions = dev + n;
    w.n = int(n);
    w.numKVHeads = cfg.numKVHeads;
    w.pageSize = int(pageSize);
    w.numPages = int(cfg.numPages);
    w.headDim = cfg.headDim;
    w.kPool = kPool[layer].get();
    w.vPool = vPool[layer].get();
    w.kScale = cfg.kScale.empty() ? nullptr : kScale.get<float>();
    w.vScale = cfg.vScale.empty() ? nullptr : vScale.get<float>();
    w.kvDType = cfg.kvDType;
    writeTokens(w, st);
    if (kernels && kernels->hasFields() && !completed.empty() &&
        !denseAt(layer)) {
      VflowGpuArgs a = args(layer, 0);
      a.pages = dev + 2 * n;
      a.numPages = int(completed.size());
      kernels->launchFields(a, int(completed.size()), cfg.numKVHeads, st);
    }
  }
}

void GpuSession::Impl::flushStage(int layer) {
  std::vector<SeqId> &held = staged[size_t(layer)];
  if (held.empty())
    return;
  cudaStream_t st = stageStream[size_t(layer)];
  std::vector<std::pair<PageId, int64_t>> at;
  std::vector<int> completed;
  for (SeqId seq : held) {
    int64_t position = table.written(seq, layer) - 1;
    PageId page = table.blocks(seq)[size_t(position / pageSize)];
    at.push_back({page, position % pageSize});
    if (position % pageSize == pageSize - 1)
      completed.push_back(int(page));
  }
  held.clear();
  writeRows(layer, 1, at, completed, kStage[size_t(layer)].get(),
            vStage[size_t(layer)].get(), st);
}

void GpuSession::Impl::flushStages() {
  for (int l = 0; l < cfg.numLayers; ++l)
    flushStage(l);
}

void GpuSession::Impl::launchLayer(int layer, const StepShape &shape,
                                   const void *q, const void *kNew,
                                   const void *vNew, void *out,
                                   cudaStream_t st) {
  const int B = shape.batch, H = cfg.numKVHeads;
  for (auto &m : marks)
    cudaEventDestroy(m.second);
  marks.clear();
  VflowGpuArgs a = args(layer, B);
  a.q = static_cast<const unsigned short *>(q);
  a.kNew = static_cast<const unsigned short *>(kNew);
  a.vNew = static_cast<const unsigned short *>(vNew);
  const bool dense = denseAt(layer);
  if (dense && kNew) {
    mark("append", st);
    AppendRowsArgs w;
    w.k = a.kNew;
    w.v = a.vNew;
    w.seqLen = seqLen.get<int>();
    w.blockTable = blockTable.get<int>();
    w.batch = B;
    w.maxBlocks = int(cfg.maxBlocksPerSeq);
    w.numKVHeads = H;
    w.pageSize = int(pageSize);
    w.headDim = cfg.headDim;
    w.kPool = kPool[layer].get();
    w.vPool = vPool[layer].get();
    w.kScale = a.kScale;
    w.vScale = a.vScale;
    w.kvDType = cfg.kvDType;
    appendRows(w, st);
  } else if (!dense && shape.everyBlock) {
    // The selection takes every block whatever the scores: its lists are
    // written without scoring (the same lists), the fields kept up.
    if (kNew) {
      mark("append", st);
      kernels->launchAppend(a, H, st);
    }
    mark("every block", st);
    EveryBlockArgs e;
    e.seqLen = a.seqLen;
    e.blockTable = a.blockTable;
    e.indptr = a.tableIndptr;
    e.count = a.tableCount;
    e.pages = a.tablePages;
    e.blocks = a.tableBlocks;
    e.batch = B;
    e.numKVHeads = H;
    e.maxBlocks = a.maxBlocks;
    e.pageSize = a.pageSize;
    writeEveryBlock(e, st);
  } else if (!dense) {
    kernels->launchIndex(a, H, shape.gridBlocks, kNew != nullptr, st,
                         [&](const std::string &symbol) { mark(symbol, st); });
  }
  PagedAttentionArgs p{};
  pagedKV(p, layer, B, q, out);
  p.indptr = indptr.get<int32_t>();
  p.count = count.get<int32_t>();
  p.pages = tablePages.get<int32_t>();
  p.blocks = tableBlocks.get<int32_t>();
  p.seqLen = seqLen.get<int32_t>();
  p.listsPerSequence = false;
  p.maxEntries = int(std::max<int64_t>(1, shape.maxEntries));
  p.mass = readsMass ? massRows.get<float>() : nullptr;
  p.massStride = int(cfg.maxBlocksPerSeq);
  if (dense) {
    denseLists(p, denseCount.get<int32_t>(), blockTable.get<int32_t>(),
               shape.denseEntries);
    p.mass = nullptr;
  }
  p.workspace = attnWorkspace.get();
  p.workspaceBytes = attnWorkspaceBytes;
  mark("attention", st);
  pagedDecodeAttention(p, st);
  if (cfg.massRecall && !dense) {
    // The same step densely, for its mass per block only; then each list's
    // share of it.
    mark("mass recall", st);
    PagedAttentionArgs d = p;
    denseLists(d, denseCount.get<int32_t>(), blockTable.get<int32_t>(),
               shape.denseEntries);
    d.mass = recallMass.get<float>();
    d.massStride = int(cfg.maxBlocksPerSeq);
    d.out = recallOut.get();
    pagedDecodeAttention(d, st);
    MassRecallArgs r;
    r.mass = recallMass.get<float>();
    r.indptr = indptr.get<int>();
    r.count = count.get<int>();
    r.blocks = tableBlocks.get<int>();
    r.seqLen = seqLen.get<int>();
    r.batch = B;
    r.numKVHeads = H;
    r.group = cfg.group;
    r.maxBlocks = int(cfg.maxBlocksPerSeq);
    r.sum = recallSum.get<double>() + size_t(layer) * H * cfg.group;
    r.samples = recallSamples.get<unsigned long long>() + layer;
    vflow::rt::cuda::massRecall(r, st);
  }
  mark("carry mass", st);
  if (readsMass && !dense)
    carryMass(massRows.get<float>(), massSlots[layer].get<float>(),
              slotOf.get<int>(), seqLen.get<int>(), B, H,
              int(cfg.maxBlocksPerSeq), cfg.group, int(pageSize), st);
  mark("end", st);
}

//===----------------------------------------------------------------------===//
// Appends
//===----------------------------------------------------------------------===//

void GpuSession::appendTokens(SeqId seq, int64_t n, const float *k,
                              const float *v) {
  Impl &s = *impl;
  if (n <= 0) {
    appendTokensDevice(seq, n, nullptr, nullptr);
    return;
  }
  size_t count = size_t(n) * s.cfg.numLayers * s.cfg.numKVHeads * s.cfg.headDim;
  std::vector<uint16_t> hk(count), hv(count);
  for (size_t e = 0; e < count; ++e) {
    hk[e] = floatToBF16(k[e]);
    hv[e] = floatToBF16(v[e]);
  }
  DeviceArray dk(count * 2), dv(count * 2);
  s.upload(dk, hk.data(), count * 2);
  s.upload(dv, hv.data(), count * 2);
  appendTokensDevice(seq, n, dk.get(), dv.get());
  // dk and dv must outlive the kernels.
  checkCuda(cudaStreamSynchronize(s.stream), "appending tokens");
}

void GpuSession::appendTokensDevice(SeqId seq, int64_t n, const void *k,
                                    const void *v) {
  Impl &s = *impl;
  s.table.require(seq, "GPU session");
  if (n < 0)
    throw Error("GPU session: appendTokens of a negative count");
  if (n == 0)
    return;
  if (!k || !v)
    throw Error("GPU session: appendTokens needs K and V");
  const int L = s.cfg.numLayers;
  const int64_t before = s.table.length(seq);
  s.flushStages();
  for (int l = 0; l < L; ++l) {
    if (s.table.written(seq, l) != before)
      throw Error("GPU session: appendTokens: layer " + std::to_string(l) +
                  " of sequence " + std::to_string(seq) +
                  " is not written up to its length");
  }
  s.checkGrowth({seq}, {n});
  auto at = s.grow(seq, n, s.stream);
  s.table.markWritten(seq, -1, n);
  // The blocks this completes get their fields.
  std::vector<int> completed;
  const std::vector<PageId> &pages = s.table.blocks(seq);
  for (int64_t b = before / s.pageSize; b < (before + n) / s.pageSize; ++b)
    completed.push_back(int(pages[size_t(b)]));
  s.writeRows(0, L, at, completed, k, v, s.stream);
}

void GpuSession::appendLayer(int layer, const std::vector<SeqId> &seqList,
                             const std::vector<int64_t> &counts, const void *k,
                             const void *v, void *streamArg) {
  Impl &s = *impl;
  if (layer < 0 || layer >= s.cfg.numLayers)
    throw Error("GPU session: append: layer " + std::to_string(layer) +
                " is out of range [0, " + std::to_string(s.cfg.numLayers) +
                ")");
  checkStepArgs("append", seqList, &counts);
  std::vector<int64_t> growth(seqList.size());
  int64_t total = 0;
  bool oneEach = !seqList.empty() && int(seqList.size()) <= s.cfg.maxBatch;
  for (size_t i = 0; i < seqList.size(); ++i) {
    s.table.require(seqList[i], "GPU session");
    growth[i] = s.table.growthFor(seqList[i], layer, counts[i]);
    total += counts[i];
    oneEach = oneEach && counts[i] == 1;
  }
  if (total == 0)
    return;
  if (!k || !v)
    throw Error("GPU session: append needs K and V");
  s.checkGrowth(seqList, growth);
  cudaStream_t st = streamOr(streamArg, s.stream);
  s.flushStage(layer);
  std::vector<std::pair<PageId, int64_t>> at;
  std::vector<int> completed;
  for (size_t i = 0; i < seqList.size(); ++i) {
    s.grow(seqList[i], growth[i], st);
    const int64_t first = s.table.markWritten(seqList[i], layer, counts[i]);
    const std::vector<PageId> &pages = s.table.blocks(seqList[i]);
    for (int64_t p = first; p < first + counts[i]; ++p) {
      PageId page = pages[size_t(p / s.pageSize)];
      at.push_back({page, p % s.pageSize});
      if (p % s.pageSize == s.pageSize - 1)
        completed.push_back(int(page));
    }
  }
  if (!oneEach) {
    s.writeRows(layer, 1, at, completed, k, v, st);
    return;
  }
  // A decode step's token: held for the fused append of the next decode.
  const size_t bytes = seqList.size() * size_t(s.cfg.numKVHeads) *
                       size_t(s.cfg.headDim) * sizeof(uint16_t);
  DeviceArray &ks = s.kStage[size_t(layer)], &vs = s.vStage[size_t(layer)];
  ks.resize(bytes);
  vs.resize(bytes);
  checkCuda(cudaMemcpyAsync(ks.get(), k, bytes, cudaMemcpyDeviceToDevice, st),
            "holding a step's K");
  checkCuda(cudaMemcpyAsync(vs.get(), v, bytes, cudaMemcpyDeviceToDevice, st),
            "holding a step's V");
  s.staged[size_t(layer)] = seqList;
  s.stageStream[size_t(layer)] = st;
  // The step's metadata now, so that the decode that follows (on the same
  // rows) uploads nothing and can be captured in a CUDA graph.
  if (!s.rowsValid || s.rows != seqList)
    shape = s.prepare(seqList, st);
}

int64_t GpuSession::written(SeqId seq, int layer) const {
  impl->table.require(seq, "GPU session");
  return impl->table.written(seq, layer);
}

//===----------------------------------------------------------------------===//
// Decode
//===----------------------------------------------------------------------===//

void GpuSession::decode(int layer, const std::vector<SeqId> &seqList,
                        const void *q, void *out, void *streamArg) {
  Impl &s = *impl;
  if (layer < 0 || layer >= s.cfg.numLayers)
    throw Error("GPU session: decode: layer " + std::to_string(layer) +
                " is out of range [0, " + std::to_string(s.cfg.numLayers) +
                ")");
  if (!q || !out)
    throw Error("GPU session: decode needs q and out");
  s.checkRows(seqList, "decode");
  for (SeqId seq : seqList) {
    int64_t length = s.table.length(seq), done = s.table.written(seq, layer);
    if (length == 0)
      throw Error("decode: sequence " + std::to_string(seq) + " has no tokens");
    if (done != length)
      throw Error("decode: sequence " + std::to_string(seq) + " has " +
                  std::to_string(length) + " tokens but layer " +
                  std::to_string(layer) + " holds the K/V of " +
                  std::to_string(done) + " (append them at this layer first)");
  }
  cudaStream_t st = streamOr(streamArg, s.stream);
  const bool fused = s.staged[size_t(layer)] == seqList;
  if (!fused)
    s.flushStage(layer);
  if (!s.rowsValid || s.rows != seqList)
    shape = s.prepare(seqList, st);
  s.launchLayer(layer, shape, q,
                fused ? s.kStage[size_t(layer)].get() : nullptr,
                fused ? s.vStage[size_t(layer)].get() : nullptr, out, st);
  if (fused)
    s.staged[size_t(layer)].clear();
  s.lastLayer = layer;
  if (s.cfg.telemetry && s.denseAt(layer)) {
    Impl::Snapshot &snap = s.snapshots[size_t(layer)];
    snap.rows = seqList;
    snap.denseBlocks.clear();
    for (SeqId seq : seqList) {
      int64_t blocks = int64_t(s.table.blocks(seq).size());
      snap.denseBlocks.push_back(blocks);
      s.denseAttended += blocks * s.cfg.numKVHeads;
    }
  } else if (s.cfg.telemetry) {
    Impl::Snapshot &snap = s.snapshots[size_t(layer)];
    snap.denseBlocks.clear();
    const size_t lists = seqList.size() * size_t(s.cfg.numKVHeads);
    const size_t entries = size_t(s.hostIndptr.back());
    snap.count.resize(std::max<size_t>(1, lists) * sizeof(int));
    snap.blocks.resize(std::max<size_t>(1, entries) * sizeof(int));
    checkCuda(cudaMemcpyAsync(snap.count.get(), s.count.get(),
                              lists * sizeof(int), cudaMemcpyDeviceToDevice,
                              st),
              "keeping the block lists");
    checkCuda(cudaMemcpyAsync(snap.blocks.get(), s.tableBlocks.get(),
                              entries * sizeof(int), cudaMemcpyDeviceToDevice,
                              st),
              "keeping the block lists");
    snap.indptr = s.hostIndptr;
    snap.rows = seqList;
    addCounts(s.count.get<int>(), int(lists),
              s.attendedTotal.get<unsigned long long>(), st);
  }
  if (layer == s.cfg.numLayers - 1) {
    for (SeqId seq : seqList)
      ++s.seqs.at(seq).steps;
    s.rowsValid = false; // the steps moved on
  }
}

void GpuSession::prefill(int layer, const std::vector<SeqId> &seqList,
                         const std::vector<int64_t> &counts, const void *q,
                         void *out, void *streamArg) {
  Impl &s = *impl;
  if (layer < 0 || layer >= s.cfg.numLayers)
    throw Error("GPU session: prefill: layer " + std::to_string(layer) +
                " is out of range [0, " + std::to_string(s.cfg.numLayers) +
                ")");
  checkStepArgs("prefill", seqList, &counts);
  int64_t total = 0, entries = 0;
  for (size_t i = 0; i < seqList.size(); ++i) {
    const SeqId seq = seqList[i];
    s.table.require(seq, "GPU session");
    const int64_t length = s.table.length(seq);
    if (counts[i] > length)
      throw Error("prefill: " + std::to_string(counts[i]) +
                  " query rows for sequence " + std::to_string(seq) + " of " +
                  std::to_string(length) + " tokens");
    if (s.table.written(seq, layer) != length)
      throw Error("prefill: sequence " + std::to_string(seq) + " has " +
                  std::to_string(length) + " tokens but layer " +
                  std::to_string(layer) + " holds the K/V of " +
                  std::to_string(s.table.written(seq, layer)) +
                  " (append them at this layer first)");
    total += counts[i];
    entries += int64_t(s.table.blocks(seq).size());
  }
  if (total == 0)
    return;
  if (!q || !out)
    throw Error("GPU session: prefill needs q and out");
  cudaStream_t st = streamOr(streamArg, s.stream);
  s.flushStage(layer); // held one-token appends are part of the context
  // qIndptr, seqLen, indptr, pages: one upload through pinned memory.
  const size_t B = seqList.size();
  std::vector<int> meta(3 * B + 2 + size_t(entries));
  int *qIndptr = meta.data(), *len = qIndptr + B + 1, *ip = len + B,
      *pages = ip + B + 1;
  for (size_t i = 0; i < B; ++i) {
    const std::vector<PageId> &table = s.table.blocks(seqList[i]);
    qIndptr[i + 1] = qIndptr[i] + int(counts[i]);
    len[i] = int(s.table.length(seqList[i]));
    ip[i + 1] = ip[i] + int(table.size());
    for (size_t j = 0; j < table.size(); ++j)
      pages[size_t(ip[i]) + j] = int(table[j]);
  }
  s.uploadAsync(s.hostPrefill, s.devPrefill, meta.data(),
                meta.size() * sizeof(int), st);
  const int *dev = s.devPrefill.get<int>();
  PrefillAttentionArgs p{};
  s.pagedKV(p, layer, int(B), q, out);
  p.totalTokens = int(total);
  p.qIndptr = dev;
  p.seqLen = dev + B + 1;
  p.indptr = dev + 2 * B + 1;
  p.pages = dev + 3 * B + 2;
  prefillAttention(p, st);
  if (s.cfg.observeTokens > 0 && s.readsMass && !s.denseAt(layer))
    s.observe(layer, seqList, counts, q, st);
}

void GpuSession::Impl::observe(int layer, const std::vector<SeqId> &seqs,
                               const std::vector<int64_t> &counts,
                               const void *q, cudaStream_t st) {
  // Each window row is a decode row of its own length (its position + 1)
  // over the sequence's pages: the paged decode kernel gives its softmax
  // mass per block, exactly causal; the rows' mean is the slot's mass.
  const int H = cfg.numKVHeads, G = cfg.group, D = cfg.headDim;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq;
  const size_t rowBytes = size_t(H) * G * D * 2; // bf16 q rows
  const long long slotElements = (long long)maxBlocks * G;
  int64_t end = 0; // the row after this sequence's last in q
  for (size_t i = 0; i < seqs.size(); ++i) {
    end += counts[i];
    const int64_t window = std::min<int64_t>(cfg.observeTokens, counts[i]);
    if (window == 0)
      continue;
    const std::vector<PageId> &pages = table.blocks(seqs[i]);
    const int64_t length = table.length(seqs[i]);
    float *slot = massSlots[layer].get<float>() +
                  size_t(slotFor(seqs[i]).slot) * H * slotElements;
    for (int64_t c0 = 0; c0 < window; c0 += cfg.maxBatch) {
      const int R = int(std::min<int64_t>(cfg.maxBatch, window - c0));
      // seqLen, count, then the block table of each row.
      std::vector<int> meta(size_t(2 * R) + size_t(R) * maxBlocks, 0);
      int longest = 1;
      for (int r = 0; r < R; ++r) {
        const int64_t visible = length - window + c0 + r + 1;
        const int blocks = int((visible + pageSize - 1) / pageSize);
        meta[size_t(r)] = int(visible);
        meta[size_t(R + r)] = blocks;
        longest = std::max(longest, blocks);
        for (int j = 0; j < blocks; ++j)
          meta[size_t(2 * R) + size_t(r) * maxBlocks + j] = int(pages[j]);
      }
      uploadAsync(hostObserve, devObserve, meta.data(),
                  meta.size() * sizeof(int), st);
      checkCuda(cudaMemsetAsync(observeMass.get(), 0,
                                size_t(R) * H * slotElements * sizeof(float),
                                st),
                "zeroing the observation window");
      const int *dev = devObserve.get<int>();
      PagedAttentionArgs d{};
      pagedKV(d, layer, R,
              static_cast<const char *>(q) +
                  size_t(end - window + c0) * rowBytes,
              observeOut.get());
      denseLists(d, dev + R, dev + 2 * R, longest);
      d.seqLen = dev;
      d.mass = observeMass.get<float>();
      d.massStride = int(maxBlocks);
      d.workspace = attnWorkspace.get();
      d.workspaceBytes = attnWorkspaceBytes;
      pagedDecodeAttention(d, st);
      sumMassRows(observeMass.get<float>(), R, H, slotElements, slot,
                  1.0f / float(window), c0 > 0, st);
    }
  }
}

std::vector<std::vector<std::vector<int64_t>>>
GpuSession::selection(int layer, std::vector<SeqId> *rowsOut) const {
  const Impl &s = *impl;
  if (layer < 0 || layer >= s.cfg.numLayers)
    throw Error("GPU session: selection: layer " + std::to_string(layer) +
                " is out of range");
  // Without telemetry only the last decode's lists can be read: they are
  // still in the step's buffers.
  Impl::Snapshot live;
  if (!s.cfg.telemetry && s.denseAt(layer))
    throw Error("GPU session: layer " + std::to_string(layer) +
                " is dense: it attends every block");
  if (!s.cfg.telemetry) {
    if (layer != s.lastLayer)
      throw Error("GPU session: without telemetry only the last decode's "
                  "selection (layer " +
                  std::to_string(s.lastLayer) + ") can be read");
    live.indptr = s.hostIndptr;
    live.rows = s.rows;
  }
  const Impl::Snapshot &snap =
      s.cfg.telemetry ? s.snapshots[size_t(layer)] : live;
  if (s.cfg.telemetry && !snap.denseBlocks.empty()) {
    if (rowsOut)
      *rowsOut = snap.rows;
    std::vector<std::vector<std::vector<int64_t>>> out;
    for (int64_t blocks : snap.denseBlocks) {
      std::vector<int64_t> all(static_cast<size_t>(blocks));
      for (int64_t b = 0; b < blocks; ++b)
        all[size_t(b)] = b;
      out.emplace_back(size_t(s.cfg.numKVHeads), all);
    }
    return out;
  }
  const void *countData = s.cfg.telemetry ? snap.count.get() : s.count.get();
  const void *blockData =
      s.cfg.telemetry ? snap.blocks.get() : s.tableBlocks.get();
  if (rowsOut)
    *rowsOut = snap.rows;
  const int B = int(snap.rows.size()), H = s.cfg.numKVHeads;
  std::vector<std::vector<std::vector<int64_t>>> out(
      B, std::vector<std::vector<int64_t>>(H));
  if (B == 0)
    return out;
  std::vector<int> count(size_t(B * H)), blocks(size_t(snap.indptr.back()));
  checkCuda(cudaDeviceSynchronize(), "waiting for a decode");
  checkCuda(cudaMemcpy(count.data(), countData, count.size() * sizeof(int),
                       cudaMemcpyDeviceToHost),
            "reading the block lists");
  checkCuda(cudaMemcpy(blocks.data(), blockData, blocks.size() * sizeof(int),
                       cudaMemcpyDeviceToHost),
            "reading the block lists");
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      int r = b * H + h;
      for (int i = 0; i < count[size_t(r)]; ++i)
        out[b][h].push_back(blocks[size_t(snap.indptr[size_t(r)] + i)]);
    }
  return out;
}

void GpuSession::massRecall(std::vector<double> &sum,
                            std::vector<int64_t> &count) const {
  sum.clear();
  count.clear();
  if (!impl->cfg.massRecall)
    return;
  const size_t L = size_t(impl->cfg.numLayers);
  sum.resize(L * impl->cfg.numKVHeads * impl->cfg.group);
  std::vector<unsigned long long> samples(L);
  checkCuda(cudaDeviceSynchronize(), "waiting for a decode");
  checkCuda(cudaMemcpy(sum.data(), impl->recallSum.get(),
                       sum.size() * sizeof(double), cudaMemcpyDeviceToHost),
            "reading the mass recall");
  checkCuda(cudaMemcpy(samples.data(), impl->recallSamples.get(),
                       L * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
            "reading the mass recall");
  count.assign(samples.begin(), samples.end());
}

int64_t GpuSession::blocksAttended() const {
  if (!impl->cfg.telemetry)
    return 0;
  unsigned long long total = 0;
  checkCuda(cudaDeviceSynchronize(), "waiting for a decode");
  checkCuda(cudaMemcpy(&total, impl->attendedTotal.get(), sizeof(total),
                       cudaMemcpyDeviceToHost),
            "reading the telemetry");
  return int64_t(total) + impl->denseAttended;
}

//===----------------------------------------------------------------------===//
// The explicit step: beginStep, decodeLayer, endStep
//===----------------------------------------------------------------------===//

void GpuSession::beginStep(const std::vector<SeqId> &seqList, int rows) {
  Impl &s = *impl;
  s.checkRows(seqList, "a step");
  if (rows > s.cfg.maxBatch)
    throw Error("GPU session: a step of " + std::to_string(rows) +
                " rows is over maxBatch (" + std::to_string(s.cfg.maxBatch) +
                ")");
  s.flushStages();
  // Every check before any sequence grows: an error leaves them all as
  // they were.
  for (SeqId seq : seqList)
    for (int l = 0; l < s.cfg.numLayers; ++l)
      if (s.table.written(seq, l) != s.table.length(seq))
        throw Error("GPU session: beginStep: sequence " + std::to_string(seq) +
                    " is not written up to its length at layer " +
                    std::to_string(l));
  s.checkGrowth(seqList, std::vector<int64_t>(seqList.size(), 1));
  // decodeLayer's fused append (or a replay of it) writes the token in
  // every layer.
  for (SeqId seq : seqList) {
    s.grow(seq, 1, s.stream);
    s.table.markWritten(seq, -1, 1);
  }
  shape = s.prepare(seqList, s.stream, rows);
  if (s.cfg.telemetry) {
    // Dense layers attend every block: counted here, for every step
    // (replayed or not).
    int dense = 0;
    for (int l = 0; l < s.cfg.numLayers; ++l)
      dense += s.denseAt(l) ? 1 : 0;
    for (SeqId seq : seqList)
      s.denseAttended +=
          int64_t(s.table.blocks(seq).size()) * s.cfg.numKVHeads * dense;
  }
  // decodeLayer may run on another stream.
  checkCuda(cudaStreamSynchronize(s.stream), "starting a step");
}

void GpuSession::decodeLayer(int layer, const void *q, const void *kNew,
                             const void *vNew, void *out, void *streamArg) {
  Impl &s = *impl;
  if (layer < 0 || layer >= s.cfg.numLayers)
    throw Error("GPU session: layer " + std::to_string(layer) +
                " is out of range [0, " + std::to_string(s.cfg.numLayers) +
                ")");
  if (shape.batch == 0)
    throw Error("GPU session: decodeLayer before beginStep");
  if (!q || !kNew || !vNew || !out)
    throw Error("GPU session: decodeLayer needs q, kNew, vNew and out");
  cudaStream_t st = streamOr(streamArg, s.stream);
  s.launchLayer(layer, shape, q, kNew, vNew, out, st);
  // Telemetry on the device, so that replays of a captured step count too
  // (dense layers are counted by beginStep, on the host).
  if (s.cfg.telemetry && !s.denseAt(layer))
    addCounts(s.count.get<int>(), shape.batch * s.cfg.numKVHeads,
              s.attendedTotal.get<unsigned long long>(), st);
}

std::vector<std::pair<std::string, float>> GpuSession::lastProfile() const {
  std::vector<std::pair<std::string, float>> out;
  const auto &marks = impl->marks;
  if (marks.empty())
    return out;
  checkCuda(cudaEventSynchronize(marks.back().second), "profiling");
  for (size_t i = 0; i + 1 < marks.size(); ++i) {
    float ms = 0;
    checkCuda(cudaEventElapsedTime(&ms, marks[i].second, marks[i + 1].second),
              "profiling");
    out.push_back({marks[i].first, ms});
  }
  return out;
}

void GpuSession::endStep() {
  Impl &s = *impl;
  for (SeqId id : s.rows)
    ++s.seqs.at(id).steps;
  s.rowsValid = false;
  shape = StepShape();
}

std::vector<std::vector<std::vector<int64_t>>>
GpuSession::attendedBlocks() const {
  Impl &s = *impl;
  const int B = int(s.rows.size()), H = s.cfg.numKVHeads;
  std::vector<int> count(B * H),
      blocks(s.hostIndptr.empty() ? 0 : s.hostIndptr.back());
  checkCuda(cudaMemcpy(count.data(), s.count.get(), count.size() * sizeof(int),
                       cudaMemcpyDeviceToHost),
            "reading the block table");
  checkCuda(cudaMemcpy(blocks.data(), s.tableBlocks.get(),
                       blocks.size() * sizeof(int), cudaMemcpyDeviceToHost),
            "reading the block table");
  std::vector<std::vector<std::vector<int64_t>>> out(
      B, std::vector<std::vector<int64_t>>(H));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      int r = b * H + h;
      for (int i = 0; i < count[r]; ++i)
        out[b][h].push_back(blocks[s.hostIndptr[r] + i]);
    }
  return out;
}
