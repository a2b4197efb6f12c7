//===- Measurements.cpp - What the GPU session reports --------------------===//
//
// Telemetry (the lists each layer's last decode attended, the blocks all
// decodes attended), the mass recall (SessionConfig::massRecall), the
// observation window (observeTokens), the per-kernel profile and the
// stats. Everything kept on the device is read when asked for.
//
//===----------------------------------------------------------------------===//

#include "CudaSessionImpl.h"

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/SessionKernels.h"

#include <algorithm>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

void CudaSession::mark(const char *what) {
  if (!cfg.profile)
    return;
  cudaEvent_t e;
  checkCuda(cudaEventCreate(&e), "creating an event");
  checkCuda(cudaEventRecord(e, markStream), "recording an event");
  marks.push_back({what, e});
}

std::vector<std::pair<std::string, float>> CudaSession::lastProfile() const {
  std::vector<std::pair<std::string, float>> out;
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

void CudaSession::countDecode(const std::vector<SeqId> &seqs, int layers) {
  const int64_t P = artifact.blockSize, H = cfg.numKVHeads;
  for (SeqId seq : seqs) {
    const int64_t len = cache->table.length(seq), blocks = (len + P - 1) / P;
    counters.listsAttended += H * layers;
    counters.blocksAvailable += H * layers * blocks;
    if (cfg.telemetry) {
      SequenceStats &mine = perSequence[seq];
      mine.listsAttended += H * layers;
      mine.blocksAvailable += H * layers * blocks;
    }
    counters.bytesRead += double(H * layers) * double(len / P) * fieldBytes;
  }
}

void CudaSession::keepSelection(int layer, const std::vector<SeqId> &rows,
                                cudaStream_t st) {
  if (!cfg.telemetry)
    return;
  Snapshot &snap = snapshots[size_t(layer)];
  snap.rows = rows;
  snap.denseBlocks.clear();
  if (cache->denseAt(layer)) {
    for (SeqId seq : rows) {
      const int64_t blocks = int64_t(cache->table.blocks(seq).size());
      snap.denseBlocks.push_back(blocks);
      denseAttended += blocks * cfg.numKVHeads;
      perSequence[seq].blocksAttended += blocks * cfg.numKVHeads;
    }
    return;
  }
  const size_t lists = rows.size() * size_t(cfg.numKVHeads);
  const size_t entries = size_t(steps->listStarts()[lists]);
  snap.count.resize(std::max<size_t>(1, lists) * sizeof(int));
  snap.blocks.resize(std::max<size_t>(1, entries) * sizeof(int));
  checkCuda(cudaMemcpyAsync(snap.count.get(), steps->count.get(),
                            lists * sizeof(int), cudaMemcpyDeviceToDevice, st),
            "keeping the block lists");
  checkCuda(cudaMemcpyAsync(snap.blocks.get(), steps->tableBlocks.get(),
                            entries * sizeof(int), cudaMemcpyDeviceToDevice,
                            st),
            "keeping the block lists");
  snap.starts = steps->listStarts();
}

SequenceStats CudaSession::sequenceStats(SeqId seq) const {
  cache->table.require(seq, "GPU session");
  auto it = perSequence.find(seq);
  SequenceStats s = it == perSequence.end() ? SequenceStats() : it->second;
  if (!cfg.telemetry) {
    SequenceStats evictions;
    evictions.blocksEvicted = s.blocksEvicted;
    evictions.tokensEvicted = s.tokensEvicted;
    return evictions;
  }
  unsigned long long sparse = 0;
  checkCuda(cudaDeviceSynchronize(), "waiting for a decode");
  checkCuda(cudaMemcpy(&sparse,
                       slotAttended.get<unsigned long long>() +
                           cache->slotOf(seq).slot,
                       sizeof(sparse), cudaMemcpyDeviceToHost),
            "reading a sequence's counts");
  s.blocksAttended += int64_t(sparse);
  return s;
}

std::vector<BlockLists> CudaSession::selection(int layer) const {
  checkLayer(layer, "selection");
  // Without telemetry only the last decode's lists can be read: they are
  // still in the step's buffers.
  const bool live = !cfg.telemetry;
  if (live && cache->denseAt(layer))
    throw Error("GPU session: layer " + std::to_string(layer) +
                " is dense: it attends every block");
  if (live && layer != lastLayer)
    throw Error("GPU session: without telemetry only the last decode's "
                "selection (layer " +
                std::to_string(lastLayer) + ") can be read");
  const Snapshot &snap = snapshots[size_t(layer)];
  if (!live && !snap.denseBlocks.empty()) {
    std::vector<BlockLists> out;
    for (int64_t blocks : snap.denseBlocks) {
      std::vector<int64_t> all(static_cast<size_t>(blocks));
      for (int64_t b = 0; b < blocks; ++b)
        all[size_t(b)] = b;
      out.emplace_back(size_t(cfg.numKVHeads), all);
    }
    return out;
  }
  const std::vector<SeqId> &rows = live ? steps->rows() : snap.rows;
  const std::vector<int> &starts = live ? steps->listStarts() : snap.starts;
  const void *countData = live ? steps->count.get() : snap.count.get();
  const void *blockData = live ? steps->tableBlocks.get() : snap.blocks.get();
  const int B = int(rows.size()), H = cfg.numKVHeads;
  std::vector<BlockLists> out(size_t(B), BlockLists{size_t(H)});
  if (B == 0)
    return out;
  std::vector<int> count(size_t(B * H)), blocks(size_t(starts[size_t(B * H)]));
  checkCuda(cudaDeviceSynchronize(), "waiting for a decode");
  checkCuda(cudaMemcpy(count.data(), countData, count.size() * sizeof(int),
                       cudaMemcpyDeviceToHost),
            "reading the block lists");
  checkCuda(cudaMemcpy(blocks.data(), blockData, blocks.size() * sizeof(int),
                       cudaMemcpyDeviceToHost),
            "reading the block lists");
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int r = b * H + h;
      for (int i = 0; i < count[size_t(r)]; ++i)
        out[size_t(b)][size_t(h)].push_back(
            blocks[size_t(starts[size_t(r)] + i)]);
    }
  return out;
}

std::vector<BlockLists> CudaSession::selectedPages(int layer) const {
  std::vector<BlockLists> blocks = selection(layer);
  const std::vector<SeqId> &rows =
      cfg.telemetry ? snapshots[size_t(layer)].rows : steps->rows();
  for (size_t b = 0; b < blocks.size(); ++b) {
    const std::vector<PageId> &table = cache->table.blocks(rows.at(b));
    for (std::vector<int64_t> &list : blocks[b])
      for (int64_t &blk : list)
        blk = table.at(size_t(blk));
  }
  return blocks;
}

void CudaSession::recallMass(int layer, const PagedAttentionArgs &sparse,
                             cudaStream_t st) {
  // The same step densely, for its mass per block only; then each list's
  // share of it.
  mark("mass recall");
  PagedAttentionArgs d = sparse;
  steps->everyBlockLists(d, steps->key().denseEntries);
  d.mass = recallMassRows.get<float>();
  d.massStride = int(cfg.maxBlocksPerSeq);
  d.out = recallOut.get();
  pagedDecodeAttention(d, st);
  const int H = cfg.numKVHeads;
  MassRecallArgs r;
  r.mass = recallMassRows.get<float>();
  r.indptr = steps->indptr.get<int>();
  r.count = steps->count.get<int>();
  r.blocks = steps->tableBlocks.get<int>();
  r.seqLen = steps->seqLen.get<int>();
  r.batch = sparse.batch;
  r.numKVHeads = H;
  r.group = cfg.group;
  r.maxBlocks = int(cfg.maxBlocksPerSeq);
  r.sum = recallSum.get<double>() + size_t(layer) * size_t(H * cfg.group);
  r.samples = recallSamples.get<unsigned long long>() + layer;
  massRecall(r, st);
}

void CudaSession::observe(int layer, const std::vector<SeqId> &seqs,
                          const std::vector<int64_t> &counts, const void *q,
                          cudaStream_t st) {
  // Each window row is a decode row of its own length (its position + 1)
  // over the sequence's pages: the paged decode kernel gives its softmax
  // mass per block, exactly causal; the rows' mean is the slot's mass.
  const int H = cfg.numKVHeads, G = cfg.group, D = cfg.headDim;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq, P = artifact.blockSize;
  const size_t rowBytes = size_t(H) * G * D * 2; // bf16 q rows
  const long long slotElements = (long long)maxBlocks * G;
  int64_t end = 0; // the row after this sequence's last in q
  for (size_t i = 0; i < seqs.size(); ++i) {
    end += counts[i];
    const int64_t window = std::min<int64_t>(cfg.observeTokens, counts[i]);
    if (window == 0)
      continue;
    const std::vector<PageId> &pages = cache->table.blocks(seqs[i]);
    const int64_t length = cache->table.length(seqs[i]);
    float *slot = cache->massSlots(layer) +
                  size_t(cache->slotOf(seqs[i]).slot) * H * slotElements;
    for (int64_t c0 = 0; c0 < window; c0 += cfg.maxBatch) {
      const int R = int(std::min<int64_t>(cfg.maxBatch, window - c0));
      // seqLen, count, then the block table of each row.
      const size_t ints = size_t(2 * R) + size_t(R) * size_t(maxBlocks);
      int *meta = observeMeta.host(ints);
      std::fill(meta, meta + ints, 0);
      int longest = 1;
      for (int r = 0; r < R; ++r) {
        const int64_t visible = length - window + c0 + r + 1;
        const int blocks = int((visible + P - 1) / P);
        meta[r] = int(visible);
        meta[R + r] = blocks;
        longest = std::max(longest, blocks);
        for (int j = 0; j < blocks; ++j)
          meta[size_t(2 * R) + size_t(r) * size_t(maxBlocks) + size_t(j)] =
              int(pages[size_t(j)]);
      }
      const int *dev = observeMeta.upload(st, "copying the observation window");
      checkCuda(cudaMemsetAsync(observeMass.get(), 0,
                                size_t(R) * H * slotElements * sizeof(float),
                                st),
                "zeroing the observation window");
      PagedAttentionArgs d{};
      cache->view(d, layer);
      d.batch = R;
      d.q = static_cast<const char *>(q) + size_t(end - window + c0) * rowBytes;
      d.out = observeOut.get();
      d.indptr = steps->denseIndptr.get<int32_t>();
      d.count = dev + R;
      d.pages = dev + 2 * R;
      d.blocks = steps->denseBlocks.get<int32_t>();
      d.listsPerSequence = true;
      d.maxEntries = longest;
      d.seqLen = dev;
      d.mass = observeMass.get<float>();
      d.massStride = int(maxBlocks);
      d.workspace = steps->attnWorkspace.get();
      d.workspaceBytes = steps->attnWorkspaceBytes;
      pagedDecodeAttention(d, st);
      sumMassRows(observeMass.get<float>(), R, H, slotElements, slot,
                  1.0f / float(window), c0 > 0, st);
    }
  }
}

int64_t CudaSession::blocksAttended() const {
  if (!cfg.telemetry)
    return 0;
  unsigned long long total = 0;
  checkCuda(cudaDeviceSynchronize(), "waiting for a decode");
  checkCuda(cudaMemcpy(&total, attendedTotal.get(), sizeof(total),
                       cudaMemcpyDeviceToHost),
            "reading the telemetry");
  return int64_t(total) + denseAttended;
}

SessionStats CudaSession::stats() const {
  SessionStats s = counters;
  s.blocksAttended = blocksAttended();
  if (cfg.massRecall) {
    const size_t L = size_t(cfg.numLayers);
    s.massRecallSum.resize(L * size_t(cfg.numKVHeads) * size_t(cfg.group));
    std::vector<unsigned long long> samples(L);
    checkCuda(cudaDeviceSynchronize(), "waiting for a decode");
    checkCuda(cudaMemcpy(s.massRecallSum.data(), recallSum.get(),
                         s.massRecallSum.size() * sizeof(double),
                         cudaMemcpyDeviceToHost),
              "reading the mass recall");
    checkCuda(cudaMemcpy(samples.data(), recallSamples.get(),
                         L * sizeof(unsigned long long),
                         cudaMemcpyDeviceToHost),
              "reading the mass recall");
    s.massRecallCount.assign(samples.begin(), samples.end());
  }
  s.bytesRead += double(s.blocksAttended) * 2 * double(artifact.blockSize) *
                 cfg.headDim * double(kvTypeBytes(kvTypeOf(cfg.kvDType, "")));
  return s;
}
