//===- GpuSession.cpp - A compiled flow serving decode steps on a GPU -----===//

#include "GpuSessionImpl.h"
#include "vflow/Runtime/cuda/SessionKernels.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/PageTable.h"
#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Session.h"
#include "vflow/Runtime/cuda/Attention.h"
#include "vflow/Runtime/cuda/Driver.h"
#include "vflow/Runtime/cuda/FlowDevice.cuh"
#include "vflow/Runtime/cuda/Jit.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

size_t vflow::rt::cuda::kvBytes(const std::string &dtype) {
  if (dtype == "bf16" || dtype == "f16")
    return 2;
  if (dtype == "fp8_e4m3")
    return 1;
  throw Error("GPU session: unsupported KV dtype '" + dtype +
              "' (expected bf16, f16 or fp8_e4m3)");
}

KVType vflow::rt::cuda::kvType(const std::string &dtype) {
  return dtype == "bf16"  ? KVType::BF16
         : dtype == "f16" ? KVType::F16
                          : KVType::FP8E4M3;
}

void GpuSession::Impl::checkConfig(bool runsFlow) {
  if (cfg.denseLayers < 0)
    throw Error("GPU session: denseLayers must not be negative");
  if (runsFlow && flow.gpu.source.empty())
    throw Error("GPU session: flow '" + flow.name +
                "' has no CUDA source (an artifact from an older vflowc?)");
  // The flow's code is compiled and run: its metadata must be what the
  // compiler produced for it (Artifact.h).
  if (runsFlow)
    validateFlowArtifact(flow, "GPU session");
  if (cfg.numLayers < 1 || cfg.numKVHeads < 1 || cfg.group < 1 ||
      cfg.headDim < 1 || cfg.numPages < 1 || cfg.maxSequences < 1 ||
      cfg.maxBatch < 1 || cfg.maxBlocksPerSeq < 1)
    throw Error("GPU session: numLayers, numKVHeads, group, headDim, "
                "numPages, maxSequences, maxBatch and maxBlocksPerSeq must "
                "be positive");
  if (flow.headDim && flow.headDim != cfg.headDim)
    throw Error("GPU session: flow '" + flow.name +
                "' is specialized to head_dim " + std::to_string(flow.headDim) +
                ", not " + std::to_string(cfg.headDim));
  // What the attention kernels support, said before anything is allocated.
  if (cfg.headDim != 64 && cfg.headDim != 128 && cfg.headDim != 256)
    throw Error("GPU session: head dim " + std::to_string(cfg.headDim) +
                " is not supported by the GPU attention kernels (64, 128 or "
                "256)");
  if (cfg.group > 16)
    throw Error("GPU session: group " + std::to_string(cfg.group) +
                " (query heads per KV head) is not supported by the GPU "
                "attention kernels (at most 16)");
  if (flow.blockSize % 16 != 0 || flow.blockSize < 16 || flow.blockSize > 256)
    throw Error("GPU session: flow '" + flow.name + "' has block_size " +
                std::to_string(flow.blockSize) +
                "; the GPU attention kernels need a multiple of 16 in "
                "[16, 256] (the CPU backend runs any block size)");
  for (auto *scales : {&cfg.kScale, &cfg.vScale}) {
    if (scales->empty())
      continue;
    if (cfg.kvDType != "fp8_e4m3")
      throw Error("GPU session: K/V scales are for fp8_e4m3 caches only");
    if (scales->size() != size_t(cfg.numKVHeads))
      throw Error("GPU session: a scale per KV head is needed (" +
                  std::to_string(cfg.numKVHeads) + ")");
    for (float x : *scales)
      if (!(x > 0) || !std::isfinite(x))
        throw Error("GPU session: K/V scales must be positive and finite");
  }
}

void GpuSession::Impl::allocatePools() {
  const size_t kvElem = kvBytes(cfg.kvDType);
  const int64_t H = cfg.numKVHeads, D = cfg.headDim, P = pageSize;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq;
  for (int l = 0; l < cfg.numLayers; ++l) {
    kPool.emplace_back(size_t(cfg.numPages * H * P * D) * kvElem);
    vPool.emplace_back(size_t(cfg.numPages * H * P * D) * kvElem);
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
    if (readsMass) {
      massSlots.emplace_back(size_t((cfg.maxSequences + 1) * H * maxBlocks) *
                             cfg.group * sizeof(float));
      checkCuda(cudaMemsetAsync(massSlots.back().get(), 0,
                                massSlots.back().bytes(), stream),
                "zeroing the attention mass");
    }
  }
  // The padding rows' slot holds initial states (its values are never read).
  resetSlot(padSlot());
  std::vector<void *> ptrs;
  for (int l = 0; l < cfg.numLayers; ++l) {
    for (auto &f : fieldPools[l])
      ptrs.push_back(f.get());
    for (auto &st : stateOld[l])
      ptrs.push_back(st.get());
    for (auto &st : stateNew[l])
      ptrs.push_back(st.get());
  }
  layerPtrs = DeviceArray(std::max<size_t>(1, ptrs.size()) * sizeof(void *));
  upload(layerPtrs, ptrs.data(), ptrs.size() * sizeof(void *));
  if (!cfg.kScale.empty()) {
    kScale = DeviceArray(cfg.kScale.size() * sizeof(float));
    upload(kScale, cfg.kScale.data(), cfg.kScale.size() * sizeof(float));
  }
  if (!cfg.vScale.empty()) {
    vScale = DeviceArray(cfg.vScale.size() * sizeof(float));
    upload(vScale, cfg.vScale.data(), cfg.vScale.size() * sizeof(float));
  }
}

void GpuSession::Impl::allocateStepBuffers(bool observes) {
  const int64_t B = cfg.maxBatch, lists = B * cfg.numKVHeads;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq;
  seqLen = DeviceArray(B * sizeof(int));
  blockTable = DeviceArray(size_t(B * maxBlocks) * sizeof(int));
  slotOf = DeviceArray(B * sizeof(int));
  stepOf = DeviceArray(B * sizeof(int));
  indptr = DeviceArray((lists + 1) * sizeof(int));
  count = DeviceArray(lists * sizeof(int));
  tablePages = DeviceArray(size_t(lists * maxBlocks) * sizeof(int));
  tableBlocks = DeviceArray(size_t(lists * maxBlocks) * sizeof(int));
  int64_t perBlock = 0, fixed = 0;
  if (kernels)
    gpuWorkspaceShape(kernels->info(), cfg.group, cfg.headDim, perBlock, fixed);
  // Dense layers: one list per row over its block table (static indptr
  // and logical block ids; the counts come with the step's metadata).
  if (cfg.denseLayers > 0 || cfg.massRecall || observes) {
    std::vector<int> ip(size_t(B + 1)), ids(size_t(B * maxBlocks));
    for (int64_t b = 0; b <= B; ++b)
      ip[size_t(b)] = int(b * maxBlocks);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = int(int64_t(i) % maxBlocks);
    denseIndptr = DeviceArray(ip.size() * sizeof(int));
    upload(denseIndptr, ip.data(), ip.size() * sizeof(int));
    denseBlocks = DeviceArray(ids.size() * sizeof(int));
    upload(denseBlocks, ids.data(), ids.size() * sizeof(int));
    denseCount = DeviceArray(B * sizeof(int));
  }
  wsStride = perBlock * maxBlocks + fixed;
  workspace = DeviceArray(std::max<size_t>(1, size_t(lists * wsStride)) *
                          sizeof(float));
  // The attention's split plan depends on the step's rows: the workspace
  // holds the largest any batch up to maxBatch needs.
  attnWorkspaceBytes = 0;
  for (int64_t rows = 1; rows <= B; ++rows)
    attnWorkspaceBytes =
        std::max(attnWorkspaceBytes,
                 pagedDecodeWorkspaceBytes(int(rows), cfg.numKVHeads, cfg.group,
                                           cfg.headDim, int(maxBlocks)));
  attnWorkspace = DeviceArray(attnWorkspaceBytes);
  if (readsMass) {
    massRows =
        DeviceArray(size_t(lists * maxBlocks) * cfg.group * sizeof(float));
    checkCuda(cudaMemsetAsync(massRows.get(), 0, massRows.bytes(), stream),
              "zeroing the attention mass");
  }
  const size_t L = size_t(cfg.numLayers);
  kStage.resize(L);
  vStage.resize(L);
  staged.resize(L);
  stageStream.resize(L, stream);
  snapshots.resize(L);
}

void GpuSession::Impl::allocateMeasurements(bool observes) {
  const int64_t lists = int64_t(cfg.maxBatch) * cfg.numKVHeads;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq, D = cfg.headDim;
  const size_t L = size_t(cfg.numLayers);
  if (observes) {
    observeMass =
        DeviceArray(size_t(lists * maxBlocks) * cfg.group * sizeof(float));
    observeOut = DeviceArray(size_t(lists) * cfg.group * D * 2);
  }
  if (cfg.massRecall) {
    recallMass =
        DeviceArray(size_t(lists * maxBlocks) * cfg.group * sizeof(float));
    recallOut = DeviceArray(size_t(lists) * cfg.group * D * 2);
    recallSum = DeviceArray(L * cfg.numKVHeads * cfg.group * sizeof(double));
    recallSamples = DeviceArray(L * sizeof(unsigned long long));
    checkCuda(cudaMemsetAsync(recallSum.get(), 0, recallSum.bytes(), stream),
              "zeroing the mass recall");
    checkCuda(
        cudaMemsetAsync(recallSamples.get(), 0, recallSamples.bytes(), stream),
        "zeroing the mass recall");
  }
  attendedTotal = DeviceArray(sizeof(unsigned long long));
  checkCuda(cudaMemsetAsync(attendedTotal.get(), 0, sizeof(unsigned long long),
                            stream),
            "zeroing the telemetry");
}

GpuSession::GpuSession(const FlowArtifact &flow, const GpuSessionConfig &config)
    : impl(std::make_unique<Impl>(
          sessionFlow(flow, config.denseLayers, config.numLayers), config)) {
  Impl &s = *impl;
  GpuSessionConfig &cfg = s.cfg;
  // A session dense at every layer never runs the flow: nothing compiled.
  const bool runsFlow = cfg.denseLayers < cfg.numLayers;
  s.checkConfig(runsFlow);
  if (cfg.scale == 0)
    cfg.scale = 1.0f / std::sqrt(float(cfg.headDim));
  s.pageSize = flow.blockSize;
  s.readsMass = runsFlow && flow.readsInput("mass");
  checkCuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
            "creating a stream");
  // The flow's kernels, compiled for this device and shape, with its consts
  // and params on the device.
  if (runsFlow)
    s.kernels = std::make_unique<FlowKernels>(
        flow, cfg.group, cfg.headDim, cfg.kvDType, cfg.arch, cfg.quiet,
        cfg.cacheDir, s.stream, cfg.launch);
  const bool observes = cfg.observeTokens > 0 && s.readsMass;
  s.allocatePools();
  s.allocateStepBuffers(observes);
  s.allocateMeasurements(observes);
  checkCuda(cudaStreamSynchronize(s.stream), "setting up the session");
}

GpuSession::~GpuSession() {
  if (impl && impl->stream) {
    cudaStreamSynchronize(impl->stream);
    cudaStreamDestroy(impl->stream);
  }
}

void *GpuSession::stream() const { return impl->stream; }

SeqId GpuSession::addSequence() {
  Impl &s = *impl;
  int slot = s.takeSlot();
  s.resetSlot(slot);
  SeqId id = s.table.add();
  s.seqs[id].slot = slot;
  return id;
}

SeqId GpuSession::sharePrefix(SeqId parent, int64_t tokens) {
  Impl &s = *impl;
  s.slotFor(parent);
  s.flushStages();
  int slot = s.takeSlot();
  SeqId id;
  try {
    id = s.table.forkPrefix(parent, tokens, "GPU session: sharePrefix");
  } catch (...) {
    s.freeSlots.push_back(slot);
    throw;
  }
  s.resetSlot(slot);
  s.seqs[id].slot = slot;
  return id;
}

/// A fresh slot: states at their initial value, no attention mass yet.
void GpuSession::Impl::resetSlot(int slot) {
  Impl &s = *this;
  const int64_t H = s.cfg.numKVHeads;
  for (int l = 0; l < s.cfg.numLayers; ++l) {
    for (size_t i = 0; i < s.flow.states.size(); ++i) {
      const ArtifactTensor &st = s.flow.states[i];
      int64_t n = H * st.elements(s.cfg.headDim, s.cfg.group) *
                  (st.perBlock ? s.cfg.maxBlocksPerSeq : 1);
      std::vector<float> init(n, roundToDType(st.dtype, st.init));
      size_t offset = size_t(slot) * n * sizeof(float);
      for (auto *buffers : {&s.stateOld, &s.stateNew})
        checkCuda(cudaMemcpyAsync((*buffers)[l][i].get<char>() + offset,
                                  init.data(), n * sizeof(float),
                                  cudaMemcpyHostToDevice, s.stream),
                  "initializing states");
    }
    if (s.readsMass) {
      size_t n = size_t(H * s.cfg.maxBlocksPerSeq) * s.cfg.group;
      checkCuda(cudaMemsetAsync(s.massSlots[l].get<float>() + slot * n, 0,
                                n * sizeof(float), s.stream),
                "zeroing the attention mass");
    }
  }
  checkCuda(cudaStreamSynchronize(s.stream), "adding a sequence");
}

void GpuSession::freeSequence(SeqId seq) {
  Impl &s = *impl;
  s.flushStages();
  s.freeSlots.push_back(s.slotFor(seq).slot);
  s.table.release(seq);
  s.seqs.erase(seq);
}

SeqId GpuSession::fork(SeqId parent) {
  Impl &s = *impl;
  const int parentSlot = s.slotFor(parent).slot;
  s.flushStages(); // the pages shared must hold every token
  int slot = s.takeSlot();
  // States and the attention mass: a copy of the parent's slot.
  for (int l = 0; l < s.cfg.numLayers; ++l) {
    for (size_t i = 0; i < s.flow.states.size(); ++i) {
      size_t bytes = size_t(s.stateSlotElements(i)) * sizeof(float);
      for (auto *buffers : {&s.stateOld, &s.stateNew})
        checkCuda(
            cudaMemcpyAsync((*buffers)[l][i].get<char>() + slot * bytes,
                            (*buffers)[l][i].get<char>() + parentSlot * bytes,
                            bytes, cudaMemcpyDeviceToDevice, s.stream),
            "copying states");
    }
    if (s.readsMass) {
      size_t bytes = size_t(s.massSlotElements()) * sizeof(float);
      checkCuda(cudaMemcpyAsync(s.massSlots[l].get<char>() + slot * bytes,
                                s.massSlots[l].get<char>() + parentSlot * bytes,
                                bytes, cudaMemcpyDeviceToDevice, s.stream),
                "copying the attention mass");
    }
  }
  checkCuda(cudaStreamSynchronize(s.stream), "forking a sequence");
  // Pages (and their cache fields) are shared; a partial tail is copied
  // on the first write (grow).
  SeqId id = s.table.fork(parent);
  s.seqs[id] = Impl::Slot{slot, s.seqs.at(parent).steps};
  return id;
}

void GpuSession::setAttentionMass(SeqId seq, int layer,
                                  const std::vector<float> &mass) {
  Impl &s = *impl;
  const int slot = s.slotFor(seq).slot;
  if (layer < 0 || layer >= s.cfg.numLayers)
    throw Error("GPU session: layer " + std::to_string(layer) +
                " is out of range");
  if (!s.readsMass)
    return; // the flow never reads it
  const int64_t H = s.cfg.numKVHeads, G = s.cfg.group;
  const int64_t maxBlocks = s.cfg.maxBlocksPerSeq;
  int64_t blocks = int64_t(mass.size()) / (H * G);
  if (blocks * H * G != int64_t(mass.size()) || blocks > maxBlocks)
    throw Error("GPU session: the attention mass is not [numKVHeads, "
                "numBlocks, group] with at most maxBlocksPerSeq blocks");
  std::vector<float> slotMass(size_t(s.massSlotElements()), 0.0f);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t g = 0; g < G; ++g)
        slotMass[size_t((h * maxBlocks + b) * G + g)] =
            mass[size_t((h * blocks + b) * G + g)];
  size_t bytes = slotMass.size() * sizeof(float);
  checkCuda(
      cudaMemcpyAsync(s.massSlots[layer].get<char>() + size_t(slot) * bytes,
                      slotMass.data(), bytes, cudaMemcpyHostToDevice, s.stream),
      "setting the attention mass");
  checkCuda(cudaStreamSynchronize(s.stream), "setting the attention mass");
}

int64_t GpuSession::freePages() const {
  return impl->table.blockManager().numFree();
}

int64_t GpuSession::pagesNeeded(SeqId seq, int64_t tokens) const {
  impl->table.require(seq, "GPU session");
  return impl->table.pagesNeeded(seq, tokens);
}

int64_t GpuSession::length(SeqId seq) const {
  impl->table.require(seq, "GPU session");
  return impl->table.length(seq);
}

std::vector<PageId> GpuSession::pageTable(SeqId seq) const {
  impl->table.require(seq, "GPU session");
  return impl->table.blocks(seq);
}

namespace {

Error noParams(const std::string &name) {
  return Error("GPU session: param '" + name +
               "': the session is dense at every layer (no flow, no params)");
}

} // namespace

double GpuSession::param(const std::string &name) const {
  if (!impl->kernels)
    throw noParams(name);
  return impl->kernels->params().get(name);
}

int64_t GpuSession::budget(SeqId seq) const {
  int64_t len = length(seq);
  if (!impl->kernels)
    return len / impl->pageSize;
  return impl->kernels->params().budget(len / impl->pageSize, len);
}

void GpuSession::setParam(const std::string &name, double value) {
  Impl &s = *impl;
  if (!s.kernels)
    throw noParams(name);
  s.kernels->setParam(name, value);
}
