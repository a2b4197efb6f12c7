//===- CudaSession.cpp - The GPU backend behind the session API -----------===//
//
// rt::Session over rt::cuda::GpuSession. Device bf16 tensors go straight
// to the GPU session on the caller's stream (no host wait); host f32 arrays
// are converted and copied through the session's own buffers, and those
// calls wait for the device. Telemetry is kept on the device and read when
// asked for (stats(), selection()).
//
//===----------------------------------------------------------------------===//

#include "DeviceMemory.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/GpuSession.h"

#include <cuda_runtime_api.h>
#include <limits>

#include <chrono>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

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

class CudaSession : public Session {
public:
  CudaSession(const FlowArtifact &flow, const SessionConfig &config)
      : artifact(sessionFlow(flow, config.denseLayers, config.numLayers)),
        cfg(config) {
    GpuSessionConfig g;
    g.numLayers = cfg.numLayers;
    g.numKVHeads = cfg.numKVHeads;
    g.group = cfg.group;
    g.headDim = cfg.headDim;
    g.numPages = cfg.numPages;
    g.maxSequences = cfg.maxSequences > 0 ? cfg.maxSequences : 64;
    g.maxBatch = cfg.maxBatch > 0 ? cfg.maxBatch : 64;
    g.maxBlocksPerSeq =
        cfg.maxBlocksPerSeq > 0 ? cfg.maxBlocksPerSeq : cfg.numPages;
    g.kvDType = cfg.kvDType;
    g.scale = cfg.scale;
    g.cacheDir = cfg.cacheDir;
    g.quiet = cfg.quiet;
    g.telemetry = cfg.telemetry;
    g.massRecall = cfg.massRecall;
    g.observeTokens = cfg.observeTokens;
    g.graphSafe = cfg.graphSafe;
    g.profile = cfg.profile;
    checkDenseLayers(cfg);
    g.denseLayers = cfg.denseLayers;
    g.launch = cfg.launch;
    gpu = std::make_unique<GpuSession>(artifact, g);
    fieldBytes = 0;
    for (const ArtifactTensor &f : artifact.fields)
      fieldBytes +=
          double(f.elements(cfg.headDim, cfg.group)) * bytesPerElement(f.dtype);
    kvBytes = cfg.kvDType == "fp8_e4m3" ? 1 : 2;
  }

  const FlowArtifact &flow() const override { return artifact; }
  const SessionConfig &config() const override { return cfg; }
  SeqId addSequence() override { return gpu->addSequence(); }
  SeqId fork(SeqId parent) override { return gpu->fork(parent); }
  SeqId sharePrefix(SeqId parent, int64_t tokens) override {
    return gpu->sharePrefix(parent, tokens);
  }
  void release(SeqId seq) override { gpu->freeSequence(seq); }
  int64_t length(SeqId seq) const override { return gpu->length(seq); }
  int64_t freePages() const override { return gpu->freePages(); }
  int64_t pagesNeeded(SeqId seq, int64_t tokens) const override {
    return gpu->pagesNeeded(seq, tokens);
  }

  void append(SeqId seq, int64_t n, const float *k, const float *v) override {
    append(std::vector<SeqId>{seq}, std::vector<int64_t>{n}, k, v);
  }

  void append(const std::vector<SeqId> &seqs,
              const std::vector<int64_t> &counts, const float *k,
              const float *v) override {
    checkStepArgs("append", seqs, &counts);
    bool oneEach = true;
    for (int64_t n : counts)
      oneEach = oneEach && n == 1;
    if (!oneEach ||
        seqs.size() > size_t(cfg.maxBatch > 0 ? cfg.maxBatch : 64)) {
      // Prefill: every layer of each sequence's tokens at once.
      if (!k || !v)
        throw Error("append: k and v must not be null");
      size_t at = 0;
      for (size_t i = 0; i < seqs.size(); ++i) {
        gpu->appendTokens(seqs[i], counts[i], k + at * tokenElements(),
                          v + at * tokenElements());
        at += size_t(counts[i]);
      }
      return;
    }
    // A decode step's tokens: layer by layer, so that each decode's fused
    // append writes them. [B, layers, H, D] -> per layer [B, H, D].
    const size_t B = seqs.size(), row = rowElements();
    std::vector<float> kl(B * row), vl(B * row);
    for (int l = 0; l < cfg.numLayers; ++l) {
      for (size_t b = 0; b < B; ++b)
        for (size_t e = 0; e < row; ++e) {
          kl[b * row + e] = k[b * tokenElements() + size_t(l) * row + e];
          vl[b * row + e] = v[b * tokenElements() + size_t(l) * row + e];
        }
      append(l, seqs, counts, Tensor::host(kl.data()), Tensor::host(vl.data()));
    }
  }

  void append(int layer, const std::vector<SeqId> &seqs,
              const std::vector<int64_t> &counts, const Tensor &k,
              const Tensor &v, void *stream = nullptr) override {
    checkStepArgs("append", seqs, &counts);
    int64_t total = 0;
    for (int64_t n : counts)
      total += n;
    if (total == 0)
      return;
    bool device = onDevice(k, "append: k");
    if (onDevice(v, "append: v") != device)
      throw Error("append: k and v must be on the same device");
    if (device) {
      gpu->appendLayer(layer, seqs, counts, k.data, v.data, stream);
      return;
    }
    const size_t n = size_t(total) * rowElements();
    void *dk = toDevice(kBuf, static_cast<const float *>(k.data), n);
    void *dv = toDevice(vBuf, static_cast<const float *>(v.data), n);
    gpu->appendLayer(layer, seqs, counts, dk, dv, gpu->stream());
    sync("appending"); // kBuf and vBuf are reused
  }

  void decode(int layer, const std::vector<SeqId> &seqs, const Tensor &q,
              const Tensor &out, void *stream = nullptr) override {
    bool device = onDevice(q, "decode: q");
    if (onDevice(out, "decode: out") != device)
      throw Error("decode: q and out must be on the same device");
    auto t0 = std::chrono::steady_clock::now();
    const size_t n = seqs.size() * queryElements();
    if (device) {
      gpu->decode(layer, seqs, q.data, out.data, stream);
    } else {
      void *dq = toDevice(qBuf, static_cast<const float *>(q.data), n);
      outBuf.resize(n * 2);
      gpu->decode(layer, seqs, dq, outBuf.get(), gpu->stream());
      std::vector<uint16_t> host(n);
      checkCuda(cudaMemcpyAsync(host.data(), outBuf.get(), n * 2,
                                cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(gpu->stream())),
                "copying the output");
      sync("a decode step");
      float *o = static_cast<float *>(out.data);
      for (size_t i = 0; i < n; ++i)
        o[i] = bf16ToFloat(host[i]);
      counters.attendMs += std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - t0)
                               .count();
    }
    // What the host knows without waiting: lists, blocks available, fields
    // read. The blocks attended are counted on the device.
    ++counters.decodes;
    for (SeqId seq : seqs) {
      int64_t len = gpu->length(seq);
      int64_t blocks = (len + artifact.blockSize - 1) / artifact.blockSize;
      counters.listsAttended += cfg.numKVHeads;
      counters.blocksAvailable += cfg.numKVHeads * blocks;
      counters.bytesRead += double(cfg.numKVHeads) *
                            double(len / artifact.blockSize) * fieldBytes;
    }
  }

  void prefill(int layer, const std::vector<SeqId> &seqs,
               const std::vector<int64_t> &counts, const Tensor &q,
               const Tensor &out, void *stream = nullptr) override {
    bool device = onDevice(q, "prefill: q");
    if (onDevice(out, "prefill: out") != device)
      throw Error("prefill: q and out must be on the same device");
    checkStepArgs("prefill", seqs, &counts);
    size_t rows = 0;
    for (int64_t c : counts)
      rows += size_t(c);
    const size_t n = rows * queryElements();
    if (device) {
      gpu->prefill(layer, seqs, counts, q.data, out.data, stream);
      return;
    }
    void *dq = toDevice(qBuf, static_cast<const float *>(q.data), n);
    outBuf.resize(n * 2);
    gpu->prefill(layer, seqs, counts, dq, outBuf.get(), gpu->stream());
    std::vector<uint16_t> host(n);
    checkCuda(cudaMemcpyAsync(host.data(), outBuf.get(), n * 2,
                              cudaMemcpyDeviceToHost,
                              static_cast<cudaStream_t>(gpu->stream())),
              "copying the output");
    sync("a prefill");
    float *o = static_cast<float *>(out.data);
    for (size_t i = 0; i < n; ++i)
      o[i] = bf16ToFloat(host[i]);
  }

  using Session::beginStep;
  std::vector<int64_t> beginStep(const std::vector<SeqId> &seqs,
                                 int64_t rows) override {
    if (rows < 0 || rows > std::numeric_limits<int>::max())
      throw Error("beginStep: rows must be 0 to maxBatch, not " +
                  std::to_string(rows));
    gpu->beginStep(seqs, int(rows));
    // What the host knows of every layer of the step (stepLayer may not
    // run: a model replays the step from a graph).
    for (SeqId seq : seqs) {
      int64_t len = gpu->length(seq);
      int64_t blocks = (len + artifact.blockSize - 1) / artifact.blockSize;
      counters.listsAttended += int64_t(cfg.numKVHeads) * cfg.numLayers;
      counters.blocksAvailable +=
          int64_t(cfg.numKVHeads) * cfg.numLayers * blocks;
      counters.bytesRead += double(cfg.numKVHeads) * cfg.numLayers *
                            double(len / artifact.blockSize) * fieldBytes;
    }
    const StepShape s = gpu->stepShape();
    return {s.batch, s.gridBlocks, s.maxEntries, s.denseEntries,
            s.everyBlock ? 1 : 0};
  }
  void stepLayer(int layer, const Tensor &q, const Tensor &k, const Tensor &v,
                 const Tensor &out, void *stream = nullptr) override {
    for (const Tensor *t : {&q, &k, &v, &out})
      if (t->device != Device::Cuda || t->dtype != DType::BF16)
        throw Error("stepLayer: the CUDA backend takes device bf16 tensors");
    gpu->decodeLayer(layer, q.data, k.data, v.data, out.data, stream);
  }
  void endStep() override {
    gpu->endStep();
    ++counters.decodes;
  }

  std::vector<BlockLists> selection(int layer) const override {
    return gpu->selection(layer);
  }
  std::vector<BlockLists> selectedPages(int layer) const override {
    std::vector<SeqId> rows;
    std::vector<BlockLists> blocks = gpu->selection(layer, &rows);
    for (size_t b = 0; b < blocks.size(); ++b) {
      std::vector<PageId> table = gpu->pageTable(rows[b]);
      for (std::vector<int64_t> &list : blocks[b])
        for (int64_t &blk : list)
          blk = table.at(size_t(blk));
    }
    return blocks;
  }
  void setAttentionMass(SeqId seq, int layer,
                        const std::vector<float> &mass) override {
    gpu->setAttentionMass(seq, layer, mass);
  }
  void setParam(const std::string &name, double value) override {
    gpu->setParam(name, value);
  }
  double param(const std::string &name) const override {
    return gpu->param(name);
  }
  int64_t budget(SeqId seq) const override { return gpu->budget(seq); }
  std::vector<std::pair<std::string, float>> lastProfile() const override {
    return gpu->lastProfile();
  }
  SessionStats stats() const override {
    SessionStats s = counters;
    s.blocksAttended = gpu->blocksAttended();
    gpu->massRecall(s.massRecallSum, s.massRecallCount);
    s.bytesRead += double(s.blocksAttended) * 2 * double(artifact.blockSize) *
                   cfg.headDim * kvBytes;
    return s;
  }

private:
  size_t rowElements() const { return size_t(cfg.numKVHeads) * cfg.headDim; }
  size_t tokenElements() const { return size_t(cfg.numLayers) * rowElements(); }
  size_t queryElements() const { return rowElements() * size_t(cfg.group); }
  /// `n` host floats as device bf16 in `buf` (queued on the session's
  /// stream).
  void *toDevice(DeviceArray &buf, const float *src, size_t n) {
    staging.resize(n);
    for (size_t i = 0; i < n; ++i)
      staging[i] = floatToBF16(src[i]);
    buf.resize(n * 2);
    checkCuda(cudaMemcpyAsync(buf.get(), staging.data(), n * 2,
                              cudaMemcpyHostToDevice,
                              static_cast<cudaStream_t>(gpu->stream())),
              "copying to the device");
    return buf.get();
  }
  void sync(const char *what) {
    checkCuda(cudaStreamSynchronize(static_cast<cudaStream_t>(gpu->stream())),
              what);
  }

  FlowArtifact artifact;
  SessionConfig cfg;
  std::unique_ptr<GpuSession> gpu;
  DeviceArray qBuf, kBuf, vBuf, outBuf;
  std::vector<uint16_t> staging;
  double fieldBytes = 0, kvBytes = 2;
  SessionStats counters;
};

} // namespace

std::unique_ptr<Session>
vflow::rt::cuda::openGpuSession(const FlowArtifact &flow,
                                const SessionConfig &config) {
  return std::make_unique<CudaSession>(flow, config);
}
