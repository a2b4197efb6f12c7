//===- CudaSession.cpp - The GPU backend behind the session API -----------===//
//
// Adapts rt::cuda::GpuSession (device bf16 arrays, one step per
// beginStep/decodeLayer/endStep, the new token's K/V appended inside
// decodeLayer's fused kernel) to rt::Session (host f32 arrays, append then
// decode layer by layer). A one-token append is held until the decode of
// layer 0 starts the step; anything else is appended at once.
//
//===----------------------------------------------------------------------===//

#include "DeviceMemory.h"

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/GpuSession.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <map>

using namespace vflow::rt;
using namespace vflow::rt::cuda;

namespace {

class CudaSession : public Session {
public:
  CudaSession(const FlowArtifact &flow, const SessionConfig &config)
      : artifact(flow), cfg(config) {
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
    gpu = std::make_unique<GpuSession>(flow, g);
    lastBlocks.resize(cfg.numLayers);
    lastPages.resize(cfg.numLayers);
  }

  const FlowArtifact &flow() const override { return artifact; }
  const SessionConfig &config() const override { return cfg; }
  SeqId addSequence() override { return gpu->addSequence(); }
  SeqId fork(SeqId parent) override {
    requireNoStep("fork");
    flush(parent);
    return gpu->fork(parent);
  }
  SeqId sharePrefix(SeqId parent, int64_t tokens) override {
    requireNoStep("sharePrefix");
    flush(parent);
    return gpu->sharePrefix(parent, tokens);
  }
  void release(SeqId seq) override {
    requireNoStep("release");
    pending.erase(seq);
    gpu->freeSequence(seq);
  }
  int64_t length(SeqId seq) const override {
    return gpu->length(seq) + (pending.count(seq) ? 1 : 0);
  }

  void append(SeqId seq, int64_t n, const float *k, const float *v) override {
    requireNoStep("append");
    if (n < 0)
      throw Error("append: a negative count");
    if (n == 0)
      return;
    if (!k || !v)
      throw Error("append: k and v must not be null");
    gpu->length(seq); // throws for an unknown sequence
    flush(seq);
    if (n == 1) {
      size_t token = tokenElements();
      pending[seq] = {std::vector<float>(k, k + token),
                      std::vector<float>(v, v + token)};
      return;
    }
    gpu->appendTokens(seq, n, k, v);
  }

  void decode(int layer, const std::vector<SeqId> &seqs, const float *q,
              float *out) override {
    if (layer < 0 || layer >= cfg.numLayers)
      throw Error("decode: layer " + std::to_string(layer) +
                  " is out of range [0, " + std::to_string(cfg.numLayers) +
                  ")");
    if (!q || !out)
      throw Error("decode: q and out must not be null");
    if (layer == 0) {
      requireNoStep("decode of layer 0");
      for (SeqId seq : seqs)
        if (!pending.count(seq))
          throw Error("decode: sequence " + std::to_string(seq) +
                      " has no new token: on the GPU a decode step runs "
                      "the token appended (alone) just before it");
      gpu->beginStep(seqs);
      stepSeqs = seqs;
    } else if (layer != nextLayer || seqs != stepSeqs) {
      throw Error("decode: the layers of a step run in order 0, 1, ... for "
                  "the same sequences (expected layer " +
                  std::to_string(nextLayer) + ")");
    }
    auto t0 = std::chrono::steady_clock::now();
    const size_t B = seqs.size();
    const size_t H = size_t(cfg.numKVHeads), D = size_t(cfg.headDim);
    const size_t rowQ = H * size_t(cfg.group) * D;
    std::vector<uint16_t> hq(B * rowQ), hk(B * H * D), hv(B * H * D);
    for (size_t i = 0; i < B * rowQ; ++i)
      hq[i] = floatToBF16(q[i]);
    for (size_t b = 0; b < B; ++b) {
      const Pending &p = pending.at(seqs[b]);
      const size_t off = size_t(layer) * H * D;
      for (size_t i = 0; i < H * D; ++i) {
        hk[b * H * D + i] = floatToBF16(p.k[off + i]);
        hv[b * H * D + i] = floatToBF16(p.v[off + i]);
      }
    }
    cudaStream_t stream = static_cast<cudaStream_t>(gpu->stream());
    qBuf.resize(hq.size() * 2);
    kBuf.resize(hk.size() * 2);
    vBuf.resize(hv.size() * 2);
    outBuf.resize(hq.size() * 2);
    void *dq = qBuf.get(), *dk = kBuf.get(), *dv = vBuf.get(),
         *dout = outBuf.get();
    checkCuda(cudaMemcpyAsync(dq, hq.data(), hq.size() * 2,
                              cudaMemcpyHostToDevice, stream),
              "copying q");
    checkCuda(cudaMemcpyAsync(dk, hk.data(), hk.size() * 2,
                              cudaMemcpyHostToDevice, stream),
              "copying K");
    checkCuda(cudaMemcpyAsync(dv, hv.data(), hv.size() * 2,
                              cudaMemcpyHostToDevice, stream),
              "copying V");
    gpu->decodeLayer(layer, dq, dk, dv, dout);
    std::vector<uint16_t> hout(hq.size());
    checkCuda(cudaMemcpyAsync(hout.data(), dout, hout.size() * 2,
                              cudaMemcpyDeviceToHost, stream),
              "copying the output");
    checkCuda(cudaStreamSynchronize(stream), "a decode step");
    for (size_t i = 0; i < hout.size(); ++i)
      out[i] = bf16ToFloat(hout[i]);
    counters.attendMs += std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
    recordSelection(layer, seqs);
    ++counters.decodes;
    nextLayer = layer + 1;
    if (nextLayer == cfg.numLayers) {
      gpu->endStep();
      for (SeqId seq : seqs)
        pending.erase(seq);
      stepSeqs.clear();
      nextLayer = 0;
    }
  }

  std::vector<BlockLists> selection(int layer) const override {
    checkLayer(layer);
    return lastBlocks[layer];
  }
  std::vector<BlockLists> selectedPages(int layer) const override {
    checkLayer(layer);
    return lastPages[layer];
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
  SessionStats stats() const override { return counters; }

private:
  struct Pending {
    std::vector<float> k, v; ///< [numLayers, numKVHeads, headDim]
  };

  size_t tokenElements() const {
    return size_t(cfg.numLayers) * cfg.numKVHeads * cfg.headDim;
  }
  void requireNoStep(const char *what) const {
    if (nextLayer != 0)
      throw Error(std::string(what) +
                  " in the middle of a decode step (layer " +
                  std::to_string(nextLayer) + " is next)");
  }
  void checkLayer(int layer) const {
    if (layer < 0 || layer >= cfg.numLayers)
      throw Error("selection: layer " + std::to_string(layer) +
                  " is out of range");
  }
  /// Appends `seq`'s held token (if any) at once.
  void flush(SeqId seq) {
    auto it = pending.find(seq);
    if (it == pending.end())
      return;
    gpu->appendTokens(seq, 1, it->second.k.data(), it->second.v.data());
    pending.erase(it);
  }
  void recordSelection(int layer, const std::vector<SeqId> &seqs) {
    std::vector<std::vector<std::vector<int64_t>>> blocks =
        gpu->attendedBlocks();
    std::vector<BlockLists> pages(seqs.size());
    double fieldBytes = 0;
    for (const ArtifactTensor &f : artifact.fields)
      fieldBytes +=
          double(f.elements(cfg.headDim, cfg.group)) * bytesPerElement(f.dtype);
    double kvBytes = cfg.kvDType == "fp8_e4m3" ? 1 : 2;
    for (size_t b = 0; b < seqs.size(); ++b) {
      std::vector<PageId> table = gpu->pageTable(seqs[b]);
      int64_t len = gpu->length(seqs[b]);
      counters.bytesRead += double(cfg.numKVHeads) *
                            double(len / artifact.blockSize) * fieldBytes;
      pages[b].resize(blocks[b].size());
      for (size_t h = 0; h < blocks[b].size(); ++h) {
        ++counters.listsAttended;
        counters.blocksAttended += int64_t(blocks[b][h].size());
        counters.blocksAvailable += int64_t(table.size());
        counters.bytesRead += double(blocks[b][h].size()) * 2 *
                              double(artifact.blockSize) * cfg.headDim *
                              kvBytes;
        for (int64_t blk : blocks[b][h])
          pages[b][h].push_back(table.at(size_t(blk)));
      }
    }
    lastBlocks[layer] = std::move(blocks);
    lastPages[layer] = std::move(pages);
  }

  FlowArtifact artifact;
  SessionConfig cfg;
  std::unique_ptr<GpuSession> gpu;
  std::map<SeqId, Pending> pending;
  std::vector<SeqId> stepSeqs;
  int nextLayer = 0;
  std::vector<std::vector<BlockLists>> lastBlocks, lastPages;
  DeviceArray qBuf, kBuf, vBuf, outBuf;
  SessionStats counters;
};

} // namespace

std::unique_ptr<Session>
vflow::rt::cuda::openGpuSession(const FlowArtifact &flow,
                                const SessionConfig &config) {
  return std::make_unique<CudaSession>(flow, config);
}
