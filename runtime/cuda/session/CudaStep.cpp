//===- CudaStep.cpp - The GPU session's appends and decodes ---------------===//
//
// Appends write K/V at once (with the fields of the blocks they complete);
// a decode step's token is written inside its first index kernel (or the
// append kernel) by runLayer. Device bf16 tensors run on the caller's
// stream with no host wait; host f32 arrays are converted and copied
// through the session's buffers, and those calls wait.
//
//===----------------------------------------------------------------------===//

#include "CudaSessionImpl.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/DecodeLayer.h"
#include "vflow/Runtime/cuda/SessionKernels.h"

#include <chrono>
#include <limits>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

cudaStream_t streamOr(void *stream, cudaStream_t fallback) {
  return stream ? static_cast<cudaStream_t>(stream) : fallback;
}

/// Whether `t` is a device tensor the GPU session reads as it is (bf16);
/// else it must be host f32. Throws for anything else.
bool onDevice(const Tensor &t, const char *what) {
  if (!t.data)
    throw Error(std::string(what) + " must not be null");
  if (t.device == Device::Cuda) {
    if (t.dtype != DType::BF16)
      throw Error(std::string(what) + " is a " + dtypeName(t.dtype) +
                  " device tensor; the CUDA backend takes bf16 on the device "
                  "(or f32 on the host)");
    return true;
  }
  if (t.dtype != DType::F32)
    throw Error(std::string(what) + " is a " + dtypeName(t.dtype) +
                " host tensor; the CUDA backend takes host f32 (or device "
                "bf16)");
  return false;
}

/// Whether a pair of tensors is on the device (both) or the host (both).
bool pairOnDevice(const Tensor &a, const Tensor &b, const char *aName,
                  const char *bName, const char *both) {
  const bool device = onDevice(a, aName);
  if (onDevice(b, bName) != device)
    throw Error(std::string(both) + " must be on the same device");
  return device;
}

/// `n` host floats as device bf16 in `buf`, on `st` (the host array is
/// converted first; the copy is synchronous).
void *toDevice(DeviceArray &buf, const float *src, size_t n, cudaStream_t st) {
  std::vector<uint16_t> staging(n);
  for (size_t i = 0; i < n; ++i)
    staging[i] = floatToBF16(src[i]);
  buf.resize(n * 2);
  checkCuda(cudaMemcpyAsync(buf.get(), staging.data(), n * 2,
                            cudaMemcpyHostToDevice, st),
            "copying to the device");
  checkCuda(cudaStreamSynchronize(st), "copying to the device");
  return buf.get();
}

} // namespace

//===----------------------------------------------------------------------===//
// Checks and the plan
//===----------------------------------------------------------------------===//

void CudaSession::checkLayer(int layer, const char *what) const {
  rt::checkLayer(what, layer, cfg.numLayers);
}

void CudaSession::checkRows(const std::vector<SeqId> &rows,
                            const char *what) const {
  const int B = int(rows.size());
  if (B < 1 || B > cfg.maxBatch)
    throw Error(std::string("GPU session: ") + what + " needs 1 to maxBatch (" +
                std::to_string(cfg.maxBatch) + ") sequences, not " +
                std::to_string(B));
  checkStepArgs(what, rows, nullptr);
  for (SeqId seq : rows)
    cache->table.require(seq, "GPU session");
}

void CudaSession::plan(const std::vector<SeqId> &rows, int64_t padded,
                       cudaStream_t st) {
  if (padded == 0 && steps->holds(rows))
    return;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  checkCuda(cudaStreamIsCapturing(st, &capturing), "planning a step");
  if (capturing != cudaStreamCaptureStatusNone)
    throw Error("GPU session: this decode plans its step (its rows are new "
                "or grew), which uploads from the host and cannot be captured "
                "in a CUDA graph: capture stepLayer after beginStep, or a "
                "later layer of the same step");
  steps->prepare(*cache, ops ? &ops->kernels().params() : nullptr,
                 ops && (ops->kernels().storesStates() || retains()), rows,
                 padded, cfg.graphSafe, st);
  lastLayer = -1; // the lists in the plan's buffers are no longer a decode's
}

//===----------------------------------------------------------------------===//
// Appends
//===----------------------------------------------------------------------===//

void CudaSession::appendAll(const std::vector<SeqId> &seqList,
                            const std::vector<int64_t> &counts, const void *k,
                            const void *v, cudaStream_t st) {
  const int64_t total = checkStepArgs("append", seqList, &counts);
  checkRowsWritten("append", cache->table, -1, cfg.numLayers, seqList, nullptr,
                   false);
  if (total == 0)
    return;
  if (!k || !v)
    throw Error("GPU session: append needs K and V");
  cache->checkGrowth(seqList, counts);
  const size_t token = size_t(cfg.numLayers) * size_t(cfg.numKVHeads) *
                       size_t(cfg.headDim) * sizeof(uint16_t);
  size_t at = 0;
  for (size_t i = 0; i < seqList.size(); ++i) {
    const SeqId seq = seqList[i];
    const int64_t before = cache->table.length(seq), n = counts[i];
    auto positions = cache->grow(seq, n, st);
    cache->table.markWritten(seq, -1, n);
    // The blocks this completes get their fields.
    std::vector<int> completed;
    const std::vector<PageId> &pages = cache->table.blocks(seq);
    const int64_t P = artifact.blockSize;
    for (int64_t b = before / P; b < (before + n) / P; ++b)
      completed.push_back(int(pages[size_t(b)]));
    cache->write(0, cfg.numLayers, positions, completed,
                 static_cast<const char *>(k) + at * token,
                 static_cast<const char *>(v) + at * token, st);
    at += size_t(n);
  }
  steps->invalidate();
}

void CudaSession::append(SeqId seq, int64_t n, const float *k, const float *v) {
  append(std::vector<SeqId>{seq}, std::vector<int64_t>{n}, k, v);
}

void CudaSession::append(const std::vector<SeqId> &seqList,
                         const std::vector<int64_t> &counts, const float *k,
                         const float *v) {
  const int64_t total = checkStepArgs("append", seqList, &counts);
  if (total == 0)
    return;
  if (!k || !v)
    throw Error("append: k and v must not be null");
  const size_t n = size_t(total) * size_t(cfg.numLayers) *
                   size_t(cfg.numKVHeads) * size_t(cfg.headDim);
  const void *dk = toDevice(kBuf, k, n, stream);
  const void *dv = toDevice(vBuf, v, n, stream);
  appendAll(seqList, counts, dk, dv, stream);
  checkCuda(cudaStreamSynchronize(stream), "appending"); // kBuf, vBuf reused
}

void CudaSession::appendLayer(int layer, const std::vector<SeqId> &seqList,
                              const std::vector<int64_t> &counts, const void *k,
                              const void *v, cudaStream_t st) {
  checkLayer(layer, "append");
  std::vector<int64_t> growth(seqList.size());
  int64_t total = 0;
  bool grows = false;
  for (size_t i = 0; i < seqList.size(); ++i) {
    cache->table.require(seqList[i], "GPU session");
    growth[i] = cache->table.growthFor(seqList[i], layer, counts[i]);
    total += counts[i];
    grows = grows || growth[i] > 0;
  }
  if (total == 0)
    return;
  if (!k || !v)
    throw Error("GPU session: append needs K and V");
  cache->checkGrowth(seqList, growth);
  std::vector<std::pair<PageId, int64_t>> at;
  std::vector<int> completed;
  const int64_t P = artifact.blockSize;
  for (size_t i = 0; i < seqList.size(); ++i) {
    cache->grow(seqList[i], growth[i], st);
    const int64_t first =
        cache->table.markWritten(seqList[i], layer, counts[i]);
    const std::vector<PageId> &pages = cache->table.blocks(seqList[i]);
    for (int64_t p = first; p < first + counts[i]; ++p) {
      const PageId page = pages[size_t(p / P)];
      at.push_back({page, p % P});
      if (p % P == P - 1)
        completed.push_back(int(page));
    }
  }
  if (grows)
    steps->invalidate(); // lengths and block tables changed
  cache->write(layer, 1, at, completed, k, v, st);
}

void CudaSession::append(int layer, const std::vector<SeqId> &seqList,
                         const std::vector<int64_t> &counts, const Tensor &k,
                         const Tensor &v, void *streamArg) {
  const int64_t total = checkStepArgs("append", seqList, &counts);
  if (total == 0)
    return;
  if (pairOnDevice(k, v, "append: k", "append: v", "append: k and v")) {
    appendLayer(layer, seqList, counts, k.data, v.data,
                streamOr(streamArg, stream));
    return;
  }
  const size_t n = size_t(total) * size_t(cfg.numKVHeads) * size_t(cfg.headDim);
  const void *dk =
      toDevice(kBuf, static_cast<const float *>(k.data), n, stream);
  const void *dv =
      toDevice(vBuf, static_cast<const float *>(v.data), n, stream);
  appendLayer(layer, seqList, counts, dk, dv, stream);
  checkCuda(cudaStreamSynchronize(stream), "appending"); // kBuf, vBuf reused
}

//===----------------------------------------------------------------------===//
// Decodes
//===----------------------------------------------------------------------===//

void CudaSession::runLayer(int layer, const void *q, const void *kNew,
                           const void *vNew, void *out, cudaStream_t st) {
  const StepKey &key = steps->key();
  for (auto &m : marks)
    cudaEventDestroy(m.second);
  marks.clear();
  markStream = st;
  const bool dense = cache->denseAt(layer);
  VflowGpuArgs a{};
  DecodeLayerArgs l;
  l.kNew = kNew;
  // A latent row is its own value (valuesAreKeys): V's pool is K's, so
  // its V write is the same row to the same slot.
  l.vNew = cfg.valuesAreKeys ? kNew : vNew;
  PagedAttentionArgs &p = l.attention;
  cache->view(p, layer);
  steps->attentionArgs(p);
  p.q = q;
  p.out = out;
  if (dense) {
    steps->everyBlockLists(p, key.denseEntries);
    p.mass = nullptr;
    l.blockTable = steps->blockTable.get<int>();
    l.maxBlocks = int(cfg.maxBlocksPerSeq);
  } else {
    cache->flowArgs(a, layer);
    steps->stepArgs(a);
    if (retains())
      a.retainScore = steps->retainScores.get<float>();
    l.flow = &ops->table();
    l.index = &a;
    l.gridBlocks = key.gridBlocks;
    l.everyBlock = key.everyBlock;
    if (!cache->readsMass())
      p.mass = nullptr;
  }
  if (cfg.profile) {
    l.before = [](void *self, const char *what) {
      static_cast<CudaSession *>(self)->mark(what);
    };
    l.ctx = this;
  }
  decodeLayer(l, st);
  if (retains() && !dense)
    foldRetainScores(layer, st);
  if (cfg.massRecall && !dense)
    recallMass(layer, p, st);
  mark("end");
  // Telemetry on the device, so that replays of a captured step count too
  // (dense layers are counted on the host).
  if (cfg.telemetry && !dense) {
    addCounts(steps->count.get<int>(), int(key.rows) * cfg.numKVHeads,
              attendedTotal.get<unsigned long long>(), st);
    addSlotCounts(steps->count.get<int>(), int(key.rows), cfg.numKVHeads,
                  steps->slotOf.get<int>(),
                  slotAttended.get<unsigned long long>(), st);
  }
  lastLayer = layer;
}

void CudaSession::throughHost(
    const Tensor &q, const Tensor &out, size_t rows,
    const std::function<void(const void *, void *)> &run) {
  const size_t n =
      rows * size_t(cfg.numKVHeads) * size_t(cfg.group) * size_t(cfg.headDim);
  const void *dq =
      toDevice(qBuf, static_cast<const float *>(q.data), n, stream);
  outBuf.resize(n * 2);
  run(dq, outBuf.get());
  std::vector<uint16_t> host(n);
  checkCuda(cudaMemcpyAsync(host.data(), outBuf.get(), n * 2,
                            cudaMemcpyDeviceToHost, stream),
            "copying the output");
  checkCuda(cudaStreamSynchronize(stream), "reading the output");
  float *o = static_cast<float *>(out.data);
  for (size_t i = 0; i < n; ++i)
    o[i] = bf16ToFloat(host[i]);
}

void CudaSession::decode(int layer, const std::vector<SeqId> &seqList,
                         const Tensor &q, const Tensor &out, void *streamArg) {
  const bool device =
      pairOnDevice(q, out, "decode: q", "decode: out", "decode: q and out");
  checkLayer(layer, "decode");
  if (stepOpen)
    throw Error("GPU session: decode inside a step (beginStep): use "
                "stepLayer, or endStep first");
  checkRows(seqList, "decode");
  checkRowsWritten("decode", cache->table, layer, cfg.numLayers, seqList,
                   nullptr, true);
  auto run = [&](const void *dq, void *dout, cudaStream_t st) {
    plan(seqList, 0, st);
    runLayer(layer, dq, nullptr, nullptr, dout, st);
    keepSelection(layer, seqList, st);
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (device) {
    run(q.data, out.data, streamOr(streamArg, stream));
  } else {
    throughHost(q, out, seqList.size(),
                [&](const void *dq, void *dout) { run(dq, dout, stream); });
    counters.attendMs += std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
  }
  countDecode(seqList, 1);
  ++counters.decodes;
  if (layer == cfg.numLayers - 1) {
    for (SeqId seq : seqList)
      ++cache->slotOf(seq).steps;
    steps->invalidate(); // the steps moved on
    applyRetain(seqList, device ? streamOr(streamArg, stream) : stream);
  }
}

void CudaSession::prefill(int layer, const std::vector<SeqId> &seqList,
                          const std::vector<int64_t> &counts, const Tensor &q,
                          const Tensor &out, void *streamArg) {
  const bool device =
      pairOnDevice(q, out, "prefill: q", "prefill: out", "prefill: q and out");
  checkLayer(layer, "prefill");
  const int64_t total = checkRowsWritten(
      "prefill", cache->table, layer, cfg.numLayers, seqList, &counts, false);
  int64_t entries = 0;
  for (SeqId seq : seqList)
    entries += int64_t(cache->table.blocks(seq).size());
  if (total == 0)
    return;
  auto run = [&](const void *dq, void *dout, cudaStream_t st) {
    // qIndptr, seqLen, indptr, pages: one upload through pinned memory.
    const size_t B = seqList.size();
    const size_t ints = 3 * B + 2 + size_t(entries);
    int *meta = prefillMeta.host(ints);
    int *qIndptr = meta, *len = qIndptr + B + 1, *ip = len + B,
        *pages = ip + B + 1;
    qIndptr[0] = ip[0] = 0;
    for (size_t i = 0; i < B; ++i) {
      const std::vector<PageId> &table = cache->table.blocks(seqList[i]);
      qIndptr[i + 1] = qIndptr[i] + int(counts[i]);
      len[i] = int(cache->table.length(seqList[i]));
      ip[i + 1] = ip[i] + int(table.size());
      for (size_t j = 0; j < table.size(); ++j)
        pages[size_t(ip[i]) + j] = int(table[j]);
    }
    const int *dev = prefillMeta.upload(st, "copying the prefill's metadata");
    PrefillAttentionArgs p{};
    cache->view(p, layer);
    p.batch = int(B);
    p.q = dq;
    p.out = dout;
    p.totalTokens = int(total);
    p.qIndptr = dev;
    p.seqLen = dev + B + 1;
    p.indptr = dev + 2 * B + 1;
    p.pages = dev + 3 * B + 2;
    prefillAttention(p, st);
    if (cfg.observeTokens > 0 && cache->readsMass() && !cache->denseAt(layer))
      observe(layer, seqList, counts, dq, st);
  };
  if (device)
    run(q.data, out.data, streamOr(streamArg, stream));
  else
    throughHost(q, out, size_t(total),
                [&](const void *dq, void *dout) { run(dq, dout, stream); });
}

//===----------------------------------------------------------------------===//
// The step: beginStep, stepLayer, endStep
//===----------------------------------------------------------------------===//

StepKey CudaSession::beginStep(const std::vector<SeqId> &seqList, int64_t rows,
                               void *streamArg) {
  if (stepOpen)
    throw Error("GPU session: beginStep: a step is open (endStep first)");
  checkRows(seqList, "a step");
  if (rows < 0 || rows > cfg.maxBatch)
    throw Error("GPU session: a step of " + std::to_string(rows) +
                " rows: rows must be 0 to maxBatch (" +
                std::to_string(cfg.maxBatch) + ")");
  // Every check before any sequence grows: an error leaves them all as
  // they were.
  checkRowsWritten("beginStep", cache->table, -1, cfg.numLayers, seqList,
                   nullptr, false);
  cache->checkGrowth(seqList, std::vector<int64_t>(seqList.size(), 1));
  if (ops) // the budgets at the lengths the step reaches
    for (SeqId seq : seqList)
      ops->kernels().params().checkBudgetsAt(cache->table.length(seq) + 1);
  const cudaStream_t st = streamOr(streamArg, stream);
  // stepLayer (or a replay of it) writes the token in every layer.
  for (SeqId seq : seqList) {
    cache->grow(seq, 1, st);
    cache->table.markWritten(seq, -1, 1);
  }
  steps->invalidate();
  plan(seqList, rows, st);
  stepRows = seqList;
  stepStream = st;
  stepOpen = true;
  // What the host knows of every layer of the step (stepLayer may not run:
  // a model replays the step from a graph); dense layers attend every
  // block, counted here.
  countDecode(seqList, cfg.numLayers);
  if (cfg.telemetry) {
    int dense = 0;
    for (int l = 0; l < cfg.numLayers; ++l)
      dense += cache->denseAt(l) ? 1 : 0;
    for (SeqId seq : seqList) {
      const int64_t blocks =
          int64_t(cache->table.blocks(seq).size()) * cfg.numKVHeads * dense;
      denseAttended += blocks;
      perSequence[seq].blocksAttended += blocks;
    }
  }
  return steps->key();
}

void CudaSession::stepLayer(int layer, const Tensor &q, const Tensor &k,
                            const Tensor &v, const Tensor &out,
                            void *streamArg) {
  checkLayer(layer, "stepLayer");
  if (!stepOpen)
    throw Error("GPU session: stepLayer before beginStep");
  for (const Tensor *t : {&q, &k, &v, &out})
    if (!t->data || t->device != Device::Cuda || t->dtype != DType::BF16)
      throw Error("GPU session: stepLayer takes device bf16 q, k, v and out");
  runLayer(layer, q.data, k.data, v.data, out.data,
           streamOr(streamArg, stream));
}

void CudaSession::endStep() {
  if (!stepOpen)
    return;
  for (SeqId seq : stepRows)
    ++cache->slotOf(seq).steps;
  const std::vector<SeqId> rows = std::move(stepRows);
  stepRows.clear();
  stepOpen = false;
  steps->invalidate();
  ++counters.decodes;
  // Every layer of a step ran over its rows (eagerly or replayed from a
  // graph, where nothing of the host runs): the folded scores are the
  // step's.
  foldRows = rows;
  applyRetain(rows, stepStream);
}

//===----------------------------------------------------------------------===//
// The retain block
//===----------------------------------------------------------------------===//

void CudaSession::foldRetainScores(int layer, cudaStream_t st) {
  // Decodes layer by layer (decode()): the fold's rows are the plan's, and
  // a layer over other rows leaves nothing to apply at the last.
  const bool first = layer == cfg.denseLayers;
  if (first)
    foldRows = steps->rows();
  else if (foldRows != steps->rows())
    foldRows.clear();
  foldRetain(steps->retainScores.get<float>(), steps->retainFolded.get<float>(),
             steps->seqLen.get<int>(), int(steps->key().rows), cfg.numKVHeads,
             int(cfg.maxBlocksPerSeq), int(artifact.blockSize), retainUnit(),
             retainRule().max, first, st);
}

void CudaSession::applyRetain(const std::vector<SeqId> &rows, cudaStream_t st) {
  const bool folded = foldRows == rows;
  foldRows.clear();
  if (!retains() || rows.empty() || !folded)
    return;
  const RetainRule rule = retainRule();
  const int64_t P = artifact.blockSize;
  // Scores per row: maxBlocks blocks of `unit` each.
  const size_t unit = size_t(retainUnit());
  const size_t stride = size_t(cfg.maxBlocksPerSeq) * unit;
  std::vector<size_t> over;
  for (size_t b = 0; b < rows.size(); ++b)
    if (rule.over(cache->table.length(rows[b]) / P))
      over.push_back(b);
  if (over.empty())
    return;
  // The rows past what the rule keeps: their folded scores, one wait.
  retainHost.resize(over.size() * stride);
  for (size_t i = 0; i < over.size(); ++i)
    checkCuda(
        cudaMemcpyAsync(retainHost.data() + i * stride,
                        steps->retainFolded.get<float>() + over[i] * stride,
                        size_t(cache->table.length(rows[over[i]]) / P) * unit *
                            sizeof(float),
                        cudaMemcpyDeviceToHost, st),
        "reading the retain scores");
  checkCuda(cudaStreamSynchronize(st), "reading the retain scores");
  for (size_t i = 0; i < over.size(); ++i) {
    const SeqId seq = rows[over[i]];
    const std::vector<int64_t> out = rule.evictions(
        retainHost.data() + i * stride, cache->table.length(seq) / P);
    if (out.empty())
      continue;
    if (rule.tokens) {
      compact(seq, out, st);
      continue;
    }
    const int64_t freeBefore = freePages();
    cache->evict(seq, out, st);
    counters.blocksEvicted += int64_t(out.size());
    counters.tokensEvicted += int64_t(out.size()) * P;
    perSequence[seq].tokensEvicted += int64_t(out.size()) * P;
    counters.pagesReclaimed += freePages() - freeBefore;
    perSequence[seq].blocksEvicted += int64_t(out.size());
  }
  steps->invalidate();
}
