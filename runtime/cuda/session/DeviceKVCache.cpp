//===- DeviceKVCache.cpp - The GPU session's paged KV cache ---------------===//

#include "DeviceKVCache.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/GpuFlowInfo.h"
#include "vflow/Runtime/cuda/SessionKernels.h"

#include <algorithm>
#include <cstring>
#include <utility>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

KVType vflow::rt::cuda::kvTypeOf(DType dtype, const char *what) {
  // kvTypeName spells each KV type as its dtype: the one mapping.
  for (KVType t : {KVType::BF16, KVType::F16, KVType::FP8E4M3, KVType::INT8})
    if (std::strcmp(kvTypeName(t), dtypeName(dtype)) == 0)
      return t;
  throw Error(std::string(what) + ": the GPU stores K/V as " +
              gpuKVDTypeList() + ", not " + dtypeName(dtype));
}

DeviceKVCache::DeviceKVCache(const FlowArtifact &flow, const SessionConfig &cfg,
                             const FlowOps *ops, cudaStream_t stream)
    : table(cfg.numPages, std::max<int64_t>(1, flow.blockSize),
            std::max(1, cfg.numLayers)),
      flow(flow), cfg(cfg), ops(ops), stream(stream),
      kvType(kvTypeOf(cfg.kvDType, "GPU session")),
      massReader(ops && flow.readsInput("mass")) {
  allocate();
}

void DeviceKVCache::allocate() {
  const size_t kvElem = kvTypeBytes(kvType);
  const int64_t H = cfg.numKVHeads, D = cfg.headDim, P = flow.blockSize;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq;
  for (int l = 0; l < cfg.numLayers; ++l) {
    kPool.emplace_back(size_t(cfg.numPages * H * P * D) * kvElem);
    // A latent cache's values are its keys' rows: no pool of their own.
    vPool.emplace_back(
        cfg.valuesAreKeys ? 0 : size_t(cfg.numPages * H * P * D) * kvElem);
    if (kvElem == 1) { // 8-bit: a scale per stored row
      kTokenScale.emplace_back(size_t(cfg.numPages * H * P) * sizeof(float));
      vTokenScale.emplace_back(size_t(cfg.numPages * H * P) * sizeof(float));
    }
    fieldPools.emplace_back();
    for (const ArtifactTensor &f : flow.fields)
      fieldPools.back().emplace_back(
          size_t(cfg.numPages * H * f.elements(D, cfg.group)) *
          bytesPerElement(f.dtype));
    stateOld.emplace_back();
    stateNew.emplace_back();
    for (const ArtifactTensor &st : flow.states) {
      // One slot past the sequences' for the padding rows of a step.
      size_t n = size_t((cfg.maxSequences + 1) * H * st.elements(D, cfg.group) *
                        (st.perBlock ? maxBlocks : 1));
      stateOld.back().emplace_back(n * sizeof(float));
      stateNew.back().emplace_back(n * sizeof(float));
    }
    if (massReader) {
      mass.emplace_back(size_t((cfg.maxSequences + 1) * H * maxBlocks) *
                        cfg.group * sizeof(float));
      checkCuda(
          cudaMemsetAsync(mass.back().get(), 0, mass.back().bytes(), stream),
          "zeroing the attention mass");
    }
  }
  // The padding rows' slot holds initial states (its values are never read).
  resetSlot(padSlot());
  std::vector<void *> ptrs;
  for (int l = 0; l < cfg.numLayers; ++l) {
    for (auto *list : {&fieldPools[l], &stateOld[l], &stateNew[l]})
      for (DeviceArray &a : *list)
        ptrs.push_back(a.get());
  }
  auto upload = [&](DeviceArray &dst, const void *src, size_t bytes) {
    dst = DeviceArray(std::max<size_t>(1, bytes));
    if (bytes)
      checkCuda(cudaMemcpyAsync(dst.get(), src, bytes, cudaMemcpyHostToDevice,
                                stream),
                "copying to the device");
  };
  upload(layerPtrs, ptrs.data(), ptrs.size() * sizeof(void *));
  checkCuda(cudaStreamSynchronize(stream), "setting up the KV cache");
}

int64_t DeviceKVCache::stateSlotElements(size_t i) const {
  const ArtifactTensor &st = flow.states[i];
  return cfg.numKVHeads * st.elements(cfg.headDim, cfg.group) *
         (st.perBlock ? cfg.maxBlocksPerSeq : 1);
}

int64_t DeviceKVCache::massSlotElements() const {
  return cfg.numKVHeads * cfg.maxBlocksPerSeq * cfg.group;
}

void DeviceKVCache::resetSlot(int slot) {
  for (int l = 0; l < cfg.numLayers; ++l) {
    for (size_t i = 0; i < flow.states.size(); ++i) {
      const ArtifactTensor &st = flow.states[i];
      const int64_t n = stateSlotElements(i);
      std::vector<float> init(size_t(n), roundToDType(st.dtype, st.init));
      const size_t offset = size_t(slot) * size_t(n) * sizeof(float);
      for (auto *buffers : {&stateOld, &stateNew})
        checkCuda(cudaMemcpyAsync((*buffers)[l][i].get<char>() + offset,
                                  init.data(), size_t(n) * sizeof(float),
                                  cudaMemcpyHostToDevice, stream),
                  "initializing states");
    }
    if (massReader) {
      const size_t n = size_t(massSlotElements());
      checkCuda(cudaMemsetAsync(mass[l].get<float>() + size_t(slot) * n, 0,
                                n * sizeof(float), stream),
                "zeroing the attention mass");
    }
  }
  checkCuda(cudaStreamSynchronize(stream), "adding a sequence");
}

int DeviceKVCache::takeSlot() {
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

const DeviceKVCache::Slot &DeviceKVCache::slotOf(SeqId seq) const {
  table.require(seq, "GPU session"); // every sequence of the table has one
  return seqs.at(seq);
}

DeviceKVCache::Slot &DeviceKVCache::slotOf(SeqId seq) {
  return const_cast<Slot &>(std::as_const(*this).slotOf(seq));
}

SeqId DeviceKVCache::add() {
  const int slot = takeSlot();
  try {
    resetSlot(slot);
  } catch (...) {
    freeSlots.push_back(slot);
    throw;
  }
  const SeqId id = table.add();
  seqs[id].slot = slot;
  return id;
}

SeqId DeviceKVCache::sharePrefix(SeqId parent, int64_t tokens) {
  slotOf(parent);
  const int slot = takeSlot();
  SeqId id;
  try {
    id = table.forkPrefix(parent, tokens, "GPU session: sharePrefix");
    resetSlot(slot);
  } catch (...) {
    freeSlots.push_back(slot);
    throw;
  }
  seqs[id].slot = slot;
  return id;
}

SeqId DeviceKVCache::fork(SeqId parent) {
  const Slot from = slotOf(parent);
  const int slot = takeSlot();
  // States and the attention mass: a copy of the parent's slot.
  auto copy = [&](DeviceArray &buffer, size_t bytes, const char *what) {
    checkCuda(cudaMemcpyAsync(buffer.get<char>() + size_t(slot) * bytes,
                              buffer.get<char>() + size_t(from.slot) * bytes,
                              bytes, cudaMemcpyDeviceToDevice, stream),
              what);
  };
  for (int l = 0; l < cfg.numLayers; ++l) {
    for (size_t i = 0; i < flow.states.size(); ++i)
      for (auto *buffers : {&stateOld, &stateNew})
        copy((*buffers)[l][i], size_t(stateSlotElements(i)) * sizeof(float),
             "copying states");
    if (massReader)
      copy(mass[l], size_t(massSlotElements()) * sizeof(float),
           "copying the attention mass");
  }
  checkCuda(cudaStreamSynchronize(stream), "forking a sequence");
  // Pages (and their cache fields) are shared; a partial tail is copied on
  // the first write (grow).
  const SeqId id = table.fork(parent);
  seqs[id] = Slot{slot, from.steps};
  return id;
}

void DeviceKVCache::evict(SeqId seq, const std::vector<int64_t> &blocks,
                          cudaStream_t st) {
  const int slot = slotOf(seq).slot;
  const int64_t before = int64_t(table.blocks(seq).size());
  table.evict(seq, blocks, "evict"); // checks them, changing nothing if bad
  if (blocks.empty())
    return;
  // Row j of every per-block array becomes the j-th kept block's; the rows
  // the kept blocks leave become a state's initial value or no mass.
  std::vector<int> from;
  size_t next = 0;
  for (int64_t b = 0; b < before; ++b) {
    if (next < blocks.size() && blocks[next] == b)
      ++next;
    else
      from.push_back(int(b));
  }
  from.resize(size_t(before), -1);
  moveSlotRows(slot, from, st);
}

void DeviceKVCache::moveSlotRows(int slot, const std::vector<int> &from,
                                 cudaStream_t st) {
  const int64_t H = cfg.numKVHeads, maxBlocks = cfg.maxBlocksPerSeq;
  std::vector<RowArray> arrays;
  for (int l = 0; l < cfg.numLayers; ++l) {
    for (size_t i = 0; i < flow.states.size(); ++i) {
      const ArtifactTensor &spec = flow.states[i];
      if (!spec.perBlock)
        continue;
      const int64_t row = spec.elements(cfg.headDim, cfg.group);
      for (auto *buffers : {&stateOld, &stateNew})
        arrays.push_back({(*buffers)[l][i].get<float>() +
                              size_t(slot) * size_t(stateSlotElements(i)),
                          (long long)(maxBlocks * row), int(row),
                          roundToDType(spec.dtype, spec.init)});
    }
    if (massReader)
      arrays.push_back(
          {mass[l].get<float>() + size_t(slot) * size_t(massSlotElements()),
           (long long)(maxBlocks * cfg.group), cfg.group, 0.0f});
  }
  if (arrays.empty() || from.empty())
    return;
  const size_t arrayBytes = arrays.size() * sizeof(RowArray);
  evictUpload.resize(arrayBytes + from.size() * sizeof(int));
  char *dev = evictUpload.get<char>();
  checkCuda(cudaMemcpyAsync(dev, arrays.data(), arrayBytes,
                            cudaMemcpyHostToDevice, st),
            "moving per-block rows");
  checkCuda(cudaMemcpyAsync(dev + arrayBytes, from.data(),
                            from.size() * sizeof(int), cudaMemcpyHostToDevice,
                            st),
            "moving per-block rows");
  compactRows(reinterpret_cast<const RowArray *>(dev), int(arrays.size()),
              int(H), reinterpret_cast<const int *>(dev + arrayBytes),
              int(from.size()), st);
  // The host arrays go when this returns.
  checkCuda(cudaStreamSynchronize(st), "moving per-block rows");
}

int64_t DeviceKVCache::evictTokens(SeqId seq,
                                   const std::vector<int64_t> &tokens,
                                   cudaStream_t st) {
  const int slot = slotOf(seq).slot;
  const int64_t P = flow.blockSize;
  const int64_t before = (table.length(seq) + P - 1) / P;
  // Pointers to every layer's pools, then the moves: one upload.
  std::vector<void *> ptrs;
  for (auto *pools : {&kPool, &vPool, &kTokenScale, &vTokenScale})
    for (DeviceArray &pool : *pools)
      ptrs.push_back(pool.get());
  for (int l = 0; l < cfg.numLayers; ++l) // (retain is refused on them)
    ptrs[size_t(cfg.numLayers + l)] = vPoolAt(l);
  const int64_t first = table.evictTokens(
      seq, tokens, "evict_tokens",
      [&](const std::vector<PageTable::TokenMove> &moves) {
        std::vector<int> m;
        m.reserve(moves.size() * 4);
        for (const PageTable::TokenMove &t : moves)
          for (int64_t x :
               {int64_t(t.fromPage), t.fromSlot, int64_t(t.toPage), t.toSlot})
            m.push_back(int(x));
        const size_t ptrBytes = ptrs.size() * sizeof(void *);
        moveUpload.resize(ptrBytes + m.size() * sizeof(int) + 1);
        char *dev = moveUpload.get<char>();
        checkCuda(cudaMemcpyAsync(dev, ptrs.data(), ptrBytes,
                                  cudaMemcpyHostToDevice, st),
                  "evicting tokens");
        checkCuda(cudaMemcpyAsync(dev + ptrBytes, m.data(),
                                  m.size() * sizeof(int),
                                  cudaMemcpyHostToDevice, st),
                  "evicting tokens");
        const size_t L = size_t(cfg.numLayers);
        void *const *p = reinterpret_cast<void *const *>(dev);
        MoveTokensArgs a;
        a.moves = reinterpret_cast<const int *>(dev + ptrBytes);
        a.n = int(moves.size());
        a.kPools = p;
        a.vPools = p + L;
        if (!kTokenScale.empty()) {
          a.kScales = reinterpret_cast<float *const *>(p + 2 * L);
          a.vScales = reinterpret_cast<float *const *>(p + 3 * L);
        }
        a.numLayers = cfg.numLayers;
        a.numKVHeads = cfg.numKVHeads;
        a.pageSize = int(P);
        a.rowBytes = int(cfg.headDim * kvTypeBytes(kvType));
        // Staging for 64 MiB of moves at a time.
        moveStaging.resize(size_t(64) << 20);
        a.staging = moveStaging.get<unsigned char>();
        a.stagingBytes = moveStaging.bytes();
        moveTokens(a, st);
        // Every read is done before PageTable releases a page (and the
        // host vectors go).
        checkCuda(cudaStreamSynchronize(st), "evicting tokens");
      });
  const int64_t complete = table.length(seq) / P;
  // Per-block rows: the blocks before `first` keep theirs, the rewritten
  // ones start over.
  std::vector<int> from(size_t(before), -1);
  for (int64_t b = 0; b < std::min(first, before); ++b)
    from[size_t(b)] = int(b);
  moveSlotRows(slot, from, st);
  std::vector<int> pages;
  for (int64_t b = first; b < complete; ++b)
    pages.push_back(int(table.blocks(seq)[size_t(b)]));
  computeFields(pages, st);
  return first;
}

void DeviceKVCache::computeFields(const std::vector<int> &pages,
                                  cudaStream_t st) {
  if (pages.empty() || !ops || !ops->table().hasFields)
    return;
  int *index = indexUpload.host(pages.size());
  std::copy(pages.begin(), pages.end(), index);
  const int *dev = indexUpload.upload(st, "copying the pages to recompute");
  for (int layer = 0; layer < cfg.numLayers; ++layer) {
    if (denseAt(layer))
      continue;
    VflowGpuArgs a{};
    flowArgs(a, layer);
    a.pages = dev;
    a.numPages = int(pages.size());
    ops->kernels().bind(a);
    ops->kernels().launchFields(a, int(pages.size()), cfg.numKVHeads, st);
  }
  checkCuda(cudaStreamSynchronize(st), "recomputing the fields");
}

void DeviceKVCache::release(SeqId seq) {
  const int slot = slotOf(seq).slot;
  table.release(seq);
  freeSlots.push_back(slot);
  seqs.erase(seq);
}

void DeviceKVCache::checkGrowth(const std::vector<SeqId> &list,
                                const std::vector<int64_t> &growth) const {
  const int64_t P = flow.blockSize;
  int64_t needed = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const int64_t length = table.length(list[i]) + growth[i];
    if ((length + P - 1) / P > cfg.maxBlocksPerSeq)
      throw Error("GPU session: a sequence would reach " +
                  std::to_string(length) + " tokens, over maxBlocksPerSeq " +
                  std::to_string(cfg.maxBlocksPerSeq) + " blocks of " +
                  std::to_string(P));
    needed += table.pagesNeeded(list[i], growth[i]);
  }
  checkPool("growing", list.size(), needed, table.blockManager().numFree());
}

std::vector<std::pair<PageId, int64_t>>
DeviceKVCache::grow(SeqId seq, int64_t n, cudaStream_t st) {
  const size_t rows = size_t(cfg.numKVHeads) * size_t(flow.blockSize);
  const size_t bytes = rows * size_t(cfg.headDim) * kvTypeBytes(kvType);
  auto copyPage = [&](DeviceArray &pool, size_t pageBytes, PageId from,
                      PageId to) {
    checkCuda(cudaMemcpyAsync(pool.get<char>() + size_t(to) * pageBytes,
                              pool.get<char>() + size_t(from) * pageBytes,
                              pageBytes, cudaMemcpyDeviceToDevice, st),
              "copying a shared tail page");
  };
  return table.grow(seq, n, [&](PageId from, PageId to) {
    for (int l = 0; l < cfg.numLayers; ++l) {
      copyPage(kPool[l], bytes, from, to);
      if (!cfg.valuesAreKeys)
        copyPage(vPool[l], bytes, from, to);
      if (!kTokenScale.empty()) {
        copyPage(kTokenScale[l], rows * sizeof(float), from, to);
        copyPage(vTokenScale[l], rows * sizeof(float), from, to);
      }
    }
  });
}

void DeviceKVCache::write(int firstLayer, int numLayers,
                          const std::vector<std::pair<PageId, int64_t>> &at,
                          const std::vector<int> &completed, const void *k,
                          const void *v, cudaStream_t st) {
  const int64_t n = int64_t(at.size());
  if (n == 0)
    return;
  // Pages, then positions, then completed pages: one upload.
  const size_t ints = size_t(2 * n) + completed.size();
  int *index = indexUpload.host(ints);
  for (int64_t t = 0; t < n; ++t) {
    index[t] = int(at[size_t(t)].first);
    index[n + t] = int(at[size_t(t)].second);
  }
  std::copy(completed.begin(), completed.end(), index + 2 * n);
  const int *dev = indexUpload.upload(st, "copying the token positions");
  for (int layer = firstLayer; layer < firstLayer + numLayers; ++layer) {
    WriteTokensArgs w;
    w.k = static_cast<const unsigned short *>(k);
    // A latent row's value is the row itself: V's pool is K's, and its V
    // write the same bytes to the same slot.
    w.v = static_cast<const unsigned short *>(cfg.valuesAreKeys ? k : v);
    w.layer = layer - firstLayer;
    w.numLayers = numLayers;
    w.pages = dev;
    w.positions = dev + n;
    w.n = int(n);
    w.numKVHeads = cfg.numKVHeads;
    w.pageSize = int(flow.blockSize);
    w.numPages = int(cfg.numPages);
    w.headDim = cfg.headDim;
    w.kPool = kPool[layer].get();
    w.vPool = vPoolAt(layer);
    w.kTokenScale = tokenScales(kTokenScale, layer);
    w.vTokenScale = tokenScales(vTokenScale, layer);
    w.kvType = kvType;
    writeTokens(w, st);
    if (!completed.empty() && !denseAt(layer) && ops->table().hasFields) {
      VflowGpuArgs a{};
      flowArgs(a, layer);
      a.pages = dev + 2 * n;
      a.numPages = int(completed.size());
      ops->kernels().bind(a);
      ops->kernels().launchFields(a, int(completed.size()), cfg.numKVHeads, st);
    }
  }
}

void DeviceKVCache::setMass(SeqId seq, int layer,
                            const std::vector<float> &values) {
  const int slot = slotOf(seq).slot;
  checkLayer("setAttentionMass", layer, cfg.numLayers);
  if (!massReader)
    return; // the flow never reads it
  const int64_t H = cfg.numKVHeads, G = cfg.group;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq;
  const int64_t blocks = int64_t(values.size()) / (H * G);
  if (blocks * H * G != int64_t(values.size()) || blocks > maxBlocks)
    throw Error("GPU session: the attention mass is not [numKVHeads, "
                "numBlocks, group] with at most maxBlocksPerSeq blocks");
  std::vector<float> slotMass(size_t(massSlotElements()), 0.0f);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t b = 0; b < blocks; ++b)
      std::memcpy(&slotMass[size_t((h * maxBlocks + b) * G)],
                  &values[size_t((h * blocks + b) * G)], size_t(G) * 4);
  const size_t bytes = slotMass.size() * sizeof(float);
  checkCuda(cudaMemcpyAsync(mass[layer].get<char>() + size_t(slot) * bytes,
                            slotMass.data(), bytes, cudaMemcpyHostToDevice,
                            stream),
            "setting the attention mass");
  checkCuda(cudaStreamSynchronize(stream), "setting the attention mass");
}

void *DeviceKVCache::vPoolAt(int layer) const {
  return cfg.valuesAreKeys ? kPool[layer].get() : vPool[layer].get();
}

void DeviceKVCache::view(PagedKVArgs &a, int layer) const {
  a.kPool = kPool[layer].get();
  a.vPool = vPoolAt(layer);
  a.kTokenScale = tokenScales(kTokenScale, layer);
  a.vTokenScale = tokenScales(vTokenScale, layer);
  a.kvType = kvType;
  // A latent cache: the latent kernels, the whole row as the value.
  a.valueDim = cfg.valuesAreKeys ? cfg.headDim : 0;
  a.numKVHeads = cfg.numKVHeads;
  a.group = cfg.group;
  a.headDim = cfg.headDim;
  a.pageSize = int(flow.blockSize);
  a.numPages = int(cfg.numPages);
  a.scale = cfg.scale;
  a.window = windowAt(layer);
}

void DeviceKVCache::flowArgs(VflowGpuArgs &a, int layer) const {
  a.numKVHeads = cfg.numKVHeads;
  a.layer = layer;
  a.kvHeadBase = cfg.firstKVHead;
  a.maxBlocks = int(cfg.maxBlocksPerSeq);
  a.pageSize = int(flow.blockSize);
  a.kPool = kPool[layer].get();
  a.vPool = vPoolAt(layer);
  a.kTokenScale = tokenScales(kTokenScale, layer);
  a.vTokenScale = tokenScales(vTokenScale, layer);
  void **ptrs = layerPtrs.get<void *>() +
                size_t(layer) * (flow.fields.size() + 2 * flow.states.size());
  a.fields = ptrs;
  a.statesOld = reinterpret_cast<float *const *>(ptrs + flow.fields.size());
  a.statesNew = reinterpret_cast<float *const *>(ptrs + flow.fields.size() +
                                                 flow.states.size());
  a.mass = massReader ? mass[layer].get<float>() : nullptr;
}
