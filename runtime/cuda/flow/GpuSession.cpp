//===- GpuSession.cpp - A compiled flow serving decode steps on a GPU -----===//

#include "vflow/Runtime/cuda/GpuSession.h"

#include "DeviceMemory.h"
#include "SessionKernels.h"

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

namespace {

size_t kvBytes(const std::string &dtype) {
  if (dtype == "bf16" || dtype == "f16")
    return 2;
  if (dtype == "fp8_e4m3")
    return 1;
  throw Error("GPU session: unsupported KV dtype '" + dtype +
              "' (expected bf16, f16 or fp8_e4m3)");
}

KVType kvType(const std::string &dtype) {
  return dtype == "bf16"  ? KVType::BF16
         : dtype == "f16" ? KVType::F16
                          : KVType::FP8E4M3;
}

uint16_t toBF16(float value) { return floatToBF16(value); }

} // namespace

struct GpuSession::Impl {
  const FlowArtifact &flow;
  GpuSessionConfig cfg;
  FlowParams params;
  GpuFlowInfo gpu;
  Module module;
  std::vector<void *> functions;
  std::vector<int64_t> tiles;
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
  DeviceArray massRows, kScale, vScale, paramValues, consts, constPtrs;
  DeviceArray layerPtrs; // per layer: fields, statesOld, statesNew pointers
  DeviceArray seqLen, blockTable, slotOf, stepOf, indptr, count, tablePages,
      tableBlocks, workspace, attnWorkspace, fillPages;
  std::vector<DeviceArray> constArrays;
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

  // The current step.
  std::vector<SeqId> rows;
  std::vector<int> hostLen, hostTable, hostSlot, hostStep, hostIndptr;

  Impl(const FlowArtifact &flow, const GpuSessionConfig &config)
      : flow(flow), cfg(config),
        table(config.numPages, std::max<int64_t>(1, flow.blockSize)) {}

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
    a.params = paramValues.get<double>();
    a.consts = constPtrs.get<const float *const>();
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

  void launch(size_t kernel, unsigned gx, unsigned gy, VflowGpuArgs &a,
              cudaStream_t s) {
    if (gx == 0 || gy == 0)
      return;
    void *argv[] = {&a};
    launchKernel(functions[kernel], gx, gy, 1,
                 unsigned(gpu.kernels[kernel].threads), 1, 1, 0, s, argv);
  }

  /// The slot of `seq`, or an Error naming it.
  Slot &slotFor(SeqId seq) {
    auto it = seqs.find(seq);
    if (it == seqs.end())
      throw Error("GPU session: no sequence " + std::to_string(seq));
    return it->second;
  }

  /// Throws, changing nothing, when growing `seqList` by `n` tokens each
  /// would pass maxBlocksPerSeq or exhaust the pool.
  void checkGrowth(const std::vector<SeqId> &seqList, int64_t n) const {
    int64_t needed = 0;
    for (SeqId seq : seqList) {
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
  std::vector<std::pair<PageId, int64_t>> grow(SeqId seq, int64_t n) {
    return table.grow(seq, n, [&](PageId from, PageId to) {
      size_t bytes = size_t(cfg.numKVHeads * pageSize * cfg.headDim) *
                     kvBytes(cfg.kvDType);
      for (int l = 0; l < cfg.numLayers; ++l)
        for (DeviceArray *pool : {&kPool[l], &vPool[l]})
          checkCuda(cudaMemcpyAsync(pool->get<char>() + size_t(to) * bytes,
                                    pool->get<char>() + size_t(from) * bytes,
                                    bytes, cudaMemcpyDeviceToDevice, stream),
                    "copying a shared tail page");
    });
  }

  void resetSlot(int slot);

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

  size_t kernelOf(GpuGrid grid) const {
    for (size_t i = 0; i < gpu.kernels.size(); ++i)
      if (gpu.kernels[i].grid == grid)
        return i;
    return gpu.kernels.size();
  }
};

GpuSession::GpuSession(const FlowArtifact &flow, const GpuSessionConfig &config)
    : impl(std::make_unique<Impl>(flow, config)) {
  Impl &s = *impl;
  GpuSessionConfig &cfg = s.cfg;
  if (flow.gpu.source.empty())
    throw Error("GPU session: flow '" + flow.name +
                "' has no CUDA source (an artifact from an older vflowc?)");
  // The flow's code is compiled and run below: its metadata must be what
  // the compiler produced for it (Artifact.h).
  validateFlowArtifact(flow, "GPU session");
  if (cfg.numLayers < 1 || cfg.numKVHeads < 1 || cfg.group < 1 ||
      cfg.headDim < 1 || cfg.numPages < 1 || cfg.maxSequences < 1 ||
      cfg.maxBatch < 1 || cfg.maxBlocksPerSeq < 1)
    throw Error("GPU session: numLayers, numKVHeads, group, headDim, "
                "numPages, maxSequences, maxBatch and maxBlocksPerSeq must "
                "be positive");
  if (flow.headDim && flow.headDim != cfg.headDim)
    throw Error("GPU session: flow '" + flow.name +
                "' is specialized to "
                "head_dim " +
                std::to_string(flow.headDim) + ", not " +
                std::to_string(cfg.headDim));
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
  const size_t kvElem = kvBytes(cfg.kvDType);
  if (cfg.scale == 0)
    cfg.scale = 1.0f / std::sqrt(float(cfg.headDim));
  s.pageSize = flow.blockSize;
  s.readsMass = flow.readsInput("mass");
  s.gpu = flow.gpu;

  // Everything comes from the artifact: params and budgets (evaluated by
  // the runtime), the consts' values (computed by the compiler). No host
  // compiler is needed.
  s.params =
      FlowParams(flow.name, flow.params, flow.budgets, flow.selectionBudget);
  const FlowArtifact::ConstValues *constValues = nullptr;
  if (!flow.consts.empty()) {
    constValues = flow.findConstValues(cfg.headDim);
    if (!constValues)
      throw Error("GPU session: the artifact of flow '" + flow.name +
                  "' has no const values for head dim " +
                  std::to_string(cfg.headDim) +
                  " (an artifact from an older vflowc?); recompile it");
  }

  // Kernels, compiled for this device and shape.
  NvrtcOptions nvrtc;
  nvrtc.arch = cfg.arch.empty() ? archOfCurrentDevice() : cfg.arch;
  nvrtc.extra =
      gpuSpecializationMacros(s.gpu, cfg.group, cfg.headDim, cfg.kvDType);
  nvrtc.quiet = cfg.quiet;
  nvrtc.cacheDir = cfg.cacheDir;
  // PTX compiled ahead of time for this shape and an arch the device runs
  // (vflowc --arch) saves the NVRTC compile; the driver JITs it once.
  const GpuBinary *aot = nullptr;
  auto number = [](const std::string &t) {
    size_t i = t.find('_');
    return i == std::string::npos ? 0 : std::atoi(t.c_str() + i + 1);
  };
  for (const GpuBinary &b : s.gpu.binaries)
    if (b.group == cfg.group && b.headDim == cfg.headDim &&
        b.kvDType == cfg.kvDType && number(b.target) <= number(nvrtc.arch) &&
        (!aot || number(b.target) > number(aot->target)))
      aot = &b;
  CudaBinary binary;
  if (aot) {
    binary.ptx = aot->ptx;
    binary.target = aot->target;
  } else {
    binary = compileCuda(flow.name, s.gpu.source, nvrtc);
  }
  s.module = Module::load(binary);
  for (const GpuKernelInfo &k : s.gpu.kernels) {
    s.functions.push_back(s.module.function(k.symbol));
    s.tiles.push_back(
        k.grid == GpuGrid::Tile ? gpuTileBlocks(k, cfg.group, cfg.headDim) : 0);
  }
  checkCuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
            "creating a stream");

  // Pools.
  const int64_t H = cfg.numKVHeads, D = cfg.headDim, P = s.pageSize;
  const int64_t maxBlocks = cfg.maxBlocksPerSeq;
  for (int l = 0; l < cfg.numLayers; ++l) {
    s.kPool.emplace_back(size_t(cfg.numPages * H * P * D) * kvElem);
    s.vPool.emplace_back(size_t(cfg.numPages * H * P * D) * kvElem);
    s.fieldPools.emplace_back();
    for (const ArtifactTensor &f : flow.fields)
      s.fieldPools.back().emplace_back(
          size_t(cfg.numPages * H * f.elements(D, cfg.group)) *
          bytesPerElement(f.dtype));
    s.stateOld.emplace_back();
    s.stateNew.emplace_back();
    for (const ArtifactTensor &st : flow.states) {
      size_t n = size_t(cfg.maxSequences * H * st.elements(D, cfg.group) *
                        (st.perBlock ? maxBlocks : 1));
      s.stateOld.back().emplace_back(n * sizeof(float));
      s.stateNew.back().emplace_back(n * sizeof(float));
    }
    if (s.readsMass) {
      s.massSlots.emplace_back(size_t(cfg.maxSequences * H * maxBlocks) *
                               cfg.group * sizeof(float));
      checkCuda(cudaMemsetAsync(s.massSlots.back().get(), 0,
                                s.massSlots.back().bytes(), s.stream),
                "zeroing the attention mass");
    }
  }
  std::vector<void *> ptrs;
  for (int l = 0; l < cfg.numLayers; ++l) {
    for (auto &f : s.fieldPools[l])
      ptrs.push_back(f.get());
    for (auto &st : s.stateOld[l])
      ptrs.push_back(st.get());
    for (auto &st : s.stateNew[l])
      ptrs.push_back(st.get());
  }
  s.layerPtrs = DeviceArray(std::max<size_t>(1, ptrs.size()) * sizeof(void *));
  s.upload(s.layerPtrs, ptrs.data(), ptrs.size() * sizeof(void *));
  if (!cfg.kScale.empty()) {
    s.kScale = DeviceArray(cfg.kScale.size() * sizeof(float));
    s.upload(s.kScale, cfg.kScale.data(), cfg.kScale.size() * sizeof(float));
  }
  if (!cfg.vScale.empty()) {
    s.vScale = DeviceArray(cfg.vScale.size() * sizeof(float));
    s.upload(s.vScale, cfg.vScale.data(), cfg.vScale.size() * sizeof(float));
  }
  std::vector<const float *> constPtrs;
  static const std::vector<std::vector<float>> noConsts;
  for (const std::vector<float> &c :
       constValues ? constValues->values : noConsts) {
    s.constArrays.emplace_back(std::max<size_t>(1, c.size()) * sizeof(float));
    s.upload(s.constArrays.back(), c.data(), c.size() * sizeof(float));
    constPtrs.push_back(s.constArrays.back().get<float>());
  }
  s.constPtrs =
      DeviceArray(std::max<size_t>(1, constPtrs.size()) * sizeof(float *));
  s.upload(s.constPtrs, constPtrs.data(), constPtrs.size() * sizeof(float *));
  s.paramValues =
      DeviceArray(std::max<size_t>(1, flow.params.size()) * sizeof(double));
  s.upload(s.paramValues, s.params.values().data(),
           s.params.values().size() * sizeof(double));

  // Per-step metadata and buffers.
  const int64_t B = cfg.maxBatch, lists = B * H;
  s.seqLen = DeviceArray(B * sizeof(int));
  s.blockTable = DeviceArray(size_t(B * maxBlocks) * sizeof(int));
  s.slotOf = DeviceArray(B * sizeof(int));
  s.stepOf = DeviceArray(B * sizeof(int));
  s.indptr = DeviceArray((lists + 1) * sizeof(int));
  s.count = DeviceArray(lists * sizeof(int));
  s.tablePages = DeviceArray(size_t(lists * maxBlocks) * sizeof(int));
  s.tableBlocks = DeviceArray(size_t(lists * maxBlocks) * sizeof(int));
  int64_t perBlock = 0, fixed = 0;
  gpuWorkspaceShape(s.gpu, cfg.group, D, perBlock, fixed);
  s.wsStride = perBlock * maxBlocks + fixed;
  s.workspace = DeviceArray(std::max<size_t>(1, size_t(lists * s.wsStride)) *
                            sizeof(float));
  s.attnWorkspaceBytes = pagedDecodeWorkspaceBytes(
      int(B), cfg.numKVHeads, cfg.group, cfg.headDim, int(maxBlocks));
  s.attnWorkspace = DeviceArray(s.attnWorkspaceBytes);
  if (s.readsMass) {
    s.massRows =
        DeviceArray(size_t(lists * maxBlocks) * cfg.group * sizeof(float));
    checkCuda(
        cudaMemsetAsync(s.massRows.get(), 0, s.massRows.bytes(), s.stream),
        "zeroing the attention mass");
  }
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
  s.freeSlots.push_back(s.slotFor(seq).slot);
  s.table.release(seq);
  s.seqs.erase(seq);
}

SeqId GpuSession::fork(SeqId parent) {
  Impl &s = *impl;
  const int parentSlot = s.slotFor(parent).slot;
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

int64_t GpuSession::length(SeqId seq) const {
  impl->table.require(seq, "GPU session");
  return impl->table.length(seq);
}

std::vector<PageId> GpuSession::pageTable(SeqId seq) const {
  impl->table.require(seq, "GPU session");
  return impl->table.blocks(seq);
}

double GpuSession::param(const std::string &name) const {
  return impl->params.get(name);
}

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
    hk[e] = toBF16(k[e]);
    hv[e] = toBF16(v[e]);
  }
  DeviceArray dk(count * 2), dv(count * 2);
  s.upload(dk, hk.data(), count * 2);
  s.upload(dv, hv.data(), count * 2);
  appendTokensDevice(seq, n, dk.get(), dv.get());
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
  const int64_t before = s.table.length(seq);
  s.checkGrowth({seq}, n);
  auto at = s.grow(seq, n);
  const int64_t H = s.cfg.numKVHeads, D = s.cfg.headDim;
  const int L = s.cfg.numLayers;
  std::vector<int> pageOf(n), posOf(n);
  for (int64_t t = 0; t < n; ++t)
    pageOf[t] = int(at[t].first), posOf[t] = int(at[t].second);
  DeviceArray dPages(n * sizeof(int)), dPos(n * sizeof(int));
  s.upload(dPages, pageOf.data(), n * sizeof(int));
  s.upload(dPos, posOf.data(), n * sizeof(int));
  // The blocks this completes get their fields.
  std::vector<int> completed;
  const std::vector<PageId> &pages = s.table.blocks(seq);
  for (int64_t b = before / s.pageSize; b < (before + n) / s.pageSize; ++b)
    completed.push_back(int(pages[size_t(b)]));
  DeviceArray dCompleted(std::max<size_t>(1, completed.size()) * sizeof(int));
  s.upload(dCompleted, completed.data(), completed.size() * sizeof(int));
  size_t fields = s.kernelOf(GpuGrid::Fields);
  for (int l = 0; l < L; ++l) {
    WriteTokensArgs w;
    w.k = static_cast<const unsigned short *>(k);
    w.v = static_cast<const unsigned short *>(v);
    w.layer = l;
    w.numLayers = L;
    w.pages = dPages.get<int>();
    w.positions = dPos.get<int>();
    w.n = int(n);
    w.numKVHeads = int(H);
    w.pageSize = int(s.pageSize);
    w.headDim = int(D);
    w.kPool = s.kPool[l].get();
    w.vPool = s.vPool[l].get();
    w.kScale = s.cfg.kScale.empty() ? nullptr : s.kScale.get<float>();
    w.vScale = s.cfg.vScale.empty() ? nullptr : s.vScale.get<float>();
    w.kvDType = s.cfg.kvDType;
    writeTokens(w, s.stream);
    if (fields < s.gpu.kernels.size() && !completed.empty()) {
      VflowGpuArgs a = s.args(l, 0);
      a.pages = dCompleted.get<int>();
      a.numPages = int(completed.size());
      s.launch(fields, unsigned(completed.size()), unsigned(H), a, s.stream);
    }
  }
  // The index arrays must outlive the kernels.
  checkCuda(cudaStreamSynchronize(s.stream), "appending tokens");
}

void GpuSession::beginStep(const std::vector<SeqId> &seqList) {
  Impl &s = *impl;
  const int B = int(seqList.size());
  if (B < 1 || B > s.cfg.maxBatch)
    throw Error("GPU session: a step needs 1 to maxBatch (" +
                std::to_string(s.cfg.maxBatch) + ") sequences, not " +
                std::to_string(B));
  const int64_t maxBlocks = s.cfg.maxBlocksPerSeq, H = s.cfg.numKVHeads;
  s.rows = seqList;
  s.hostLen.assign(B, 0);
  s.hostSlot.assign(B, 0);
  s.hostStep.assign(B, 0);
  s.hostTable.assign(size_t(B * maxBlocks), 0);
  s.hostIndptr.assign(size_t(B * H + 1), 0);
  // Every check before any sequence grows: an error leaves them all as
  // they were.
  for (int b = 0; b < B; ++b) {
    s.table.require(seqList[b], "GPU session");
    for (int c = 0; c < b; ++c)
      if (seqList[c] == seqList[b])
        throw Error("GPU session: sequence " + std::to_string(seqList[b]) +
                    " appears twice in one step");
  }
  s.checkGrowth(seqList, 1);
  int64_t longest = 0, maxEntries = 0;
  for (int b = 0; b < B; ++b) {
    const SeqId seq = seqList[b];
    s.grow(seq, 1);
    const int64_t length = s.table.length(seq);
    const std::vector<PageId> &pages = s.table.blocks(seq);
    const Impl::Slot &slot = s.seqs.at(seq);
    s.hostLen[b] = int(length);
    s.hostSlot[b] = slot.slot;
    s.hostStep[b] = int(slot.steps);
    for (size_t j = 0; j < pages.size(); ++j)
      s.hostTable[b * maxBlocks + j] = int(pages[j]);
    int64_t numBlocks = int64_t(pages.size());
    int64_t complete = length / s.pageSize;
    longest = std::max(longest, numBlocks);
    int64_t entries = std::min<int64_t>(
        numBlocks, s.params.budget(complete, length) + s.params.keepFirst() +
                       s.params.keepLast() + 1);
    maxEntries = std::max(maxEntries, entries);
    for (int64_t h = 0; h < H; ++h)
      s.hostIndptr[b * H + h + 1] = int(numBlocks);
  }
  for (size_t i = 1; i < s.hostIndptr.size(); ++i)
    s.hostIndptr[i] += s.hostIndptr[i - 1];
  s.upload(s.seqLen, s.hostLen.data(), B * sizeof(int));
  s.upload(s.slotOf, s.hostSlot.data(), B * sizeof(int));
  s.upload(s.stepOf, s.hostStep.data(), B * sizeof(int));
  s.upload(s.blockTable, s.hostTable.data(), s.hostTable.size() * sizeof(int));
  s.upload(s.indptr, s.hostIndptr.data(), s.hostIndptr.size() * sizeof(int));
  shape.batch = B;
  shape.gridBlocks = s.cfg.graphSafe ? maxBlocks : longest;
  shape.maxEntries = maxEntries;
  // The host arrays must outlive the copies.
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
  cudaStream_t st = streamArg ? static_cast<cudaStream_t>(streamArg) : s.stream;
  const int B = shape.batch, H = s.cfg.numKVHeads;
  for (auto &m : s.marks)
    cudaEventDestroy(m.second);
  s.marks.clear();
  VflowGpuArgs a = s.args(layer, B);
  a.q = static_cast<const unsigned short *>(q);
  a.kNew = static_cast<const unsigned short *>(kNew);
  a.vNew = static_cast<const unsigned short *>(vNew);
  for (size_t k = 0; k < s.gpu.kernels.size(); ++k) {
    GpuGrid grid = s.gpu.kernels[k].grid;
    s.mark(s.gpu.kernels[k].symbol, st);
    if (grid == GpuGrid::Append)
      s.launch(k, B, H, a, st);
    else if (grid == GpuGrid::Tile)
      s.launch(k, unsigned((shape.gridBlocks + s.tiles[k] - 1) / s.tiles[k]),
               B * H, a, st);
    else if (grid == GpuGrid::Row || grid == GpuGrid::Commit)
      s.launch(k, B * H, 1, a, st);
  }
  PagedAttentionArgs p{};
  p.kPool = s.kPool[layer].get();
  p.vPool = s.vPool[layer].get();
  p.kScale = a.kScale;
  p.vScale = a.vScale;
  p.kvType = kvType(s.cfg.kvDType);
  p.batch = B;
  p.numKVHeads = H;
  p.group = s.cfg.group;
  p.headDim = s.cfg.headDim;
  p.pageSize = int(s.pageSize);
  p.q = q;
  p.out = out;
  p.scale = s.cfg.scale;
  p.indptr = s.indptr.get<int32_t>();
  p.count = s.count.get<int32_t>();
  p.pages = s.tablePages.get<int32_t>();
  p.blocks = s.tableBlocks.get<int32_t>();
  p.seqLen = s.seqLen.get<int32_t>();
  p.listsPerSequence = false;
  p.maxEntries = int(std::max<int64_t>(1, shape.maxEntries));
  p.mass = s.readsMass ? s.massRows.get<float>() : nullptr;
  p.massStride = int(s.cfg.maxBlocksPerSeq);
  p.workspace = s.attnWorkspace.get();
  p.workspaceBytes = s.attnWorkspaceBytes;
  s.mark("attention", st);
  pagedDecodeAttention(p, st);
  s.mark("carry mass", st);
  if (s.readsMass)
    carryMass(s.massRows.get<float>(), s.massSlots[layer].get<float>(),
              s.slotOf.get<int>(), s.seqLen.get<int>(), B, H,
              int(s.cfg.maxBlocksPerSeq), s.cfg.group, int(s.pageSize), st);
  s.mark("end", st);
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

int64_t GpuSession::budget(SeqId seq) const {
  int64_t len = length(seq);
  return impl->params.budget(len / impl->pageSize, len);
}

void GpuSession::setParam(const std::string &name, double value) {
  Impl &s = *impl;
  s.params.set(name, value);
  s.upload(s.paramValues, s.params.values().data(),
           s.params.values().size() * sizeof(double));
  checkCuda(cudaStreamSynchronize(s.stream), "setting a param");
}
