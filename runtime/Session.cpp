//===- Session.cpp - A compiled flow attached to a paged KV cache ---------===//

#include "vflow/Runtime/Session.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cmath>

using namespace vflow::rt;

namespace {

CpuTensorSpec specOf(const ArtifactTensor &t) {
  CpuTensorSpec spec;
  spec.name = t.name;
  spec.dtype = t.dtype;
  for (const ArtifactAxis &a : t.axes) {
    spec.axes.push_back(a.name);
    spec.sizes.push_back(a.size);
  }
  spec.init = t.init;
  return spec;
}

} // namespace

CpuFlowInfo vflow::rt::cpuFlowInfo(const FlowArtifact &flow) {
  CpuFlowInfo info;
  info.flowName = flow.name;
  info.params = flow.params;
  for (const ArtifactTensor &t : flow.consts)
    info.consts.push_back(specOf(t));
  for (const ArtifactTensor &t : flow.fields)
    info.fields.push_back(specOf(t));
  for (const ArtifactTensor &t : flow.states)
    info.states.push_back(specOf(t));
  info.readsMass = flow.readsInput("mass");
  info.budgets = flow.budgets;
  info.selection = flow.selectionBudget;
  info.readsKV = flow.readsInput("K") || flow.readsInput("V");
  return info;
}

DecodeSession::DecodeSession(const FlowArtifact &flow,
                             const SessionConfig &config)
    : artifact(flow), cfg(config) {
  // The flow's code is compiled and run below: its metadata must be what
  // the compiler produced for it (Artifact.h).
  validateFlowArtifact(flow, "session");
  if (cfg.numLayers < 1 || cfg.numKVHeads < 1 || cfg.group < 1 ||
      cfg.headDim < 1 || cfg.numPages < 1)
    throw Error("session config: numLayers, numKVHeads, group, headDim and "
                "numPages must be positive");
  if (flow.headDim > 0 && flow.headDim != cfg.headDim)
    throw Error("flow '" + flow.name + "' is specialized to head_dim " +
                std::to_string(flow.headDim) +
                ", but the session has head dimension " +
                std::to_string(cfg.headDim));
  const ArtifactSource *source = nullptr;
  for (const ArtifactSource &s : flow.sources)
    if (s.language == "c++")
      source = &s;
  if (!source)
    throw Error("flow '" + flow.name +
                "' has no C++ source in its artifact (recompile it with "
                "vflowc -o FILE.vfa)");
  CpuFlowInfo info = cpuFlowInfo(flow);
  if (const FlowArtifact::ConstValues *c = flow.findConstValues(cfg.headDim))
    info.constValues = c->values;
  cpu = std::make_unique<CpuFlow>(source->text, std::move(info), cfg.headDim,
                                  cfg.group, cfg.jit);
  CacheConfig cc;
  cc.numLayers = cfg.numLayers;
  cc.numKVHeads = cfg.numKVHeads;
  cc.headDim = cfg.headDim;
  cc.pageSize = static_cast<int>(flow.blockSize);
  cc.numPages = cfg.numPages;
  cc.kvDType = cfg.kvDType;
  for (size_t i = 0; i < flow.fields.size(); ++i)
    cc.fields.push_back(
        {flow.fields[i].name, flow.fields[i].dtype, cpu->fieldElements(i)});
  for (const ArtifactTensor &s : flow.states)
    cc.states.push_back({s.name, s.dtype, s.elements(cfg.headDim, cfg.group),
                         s.perBlock, s.init});
  kv = std::make_unique<PagedKVCache>(cc);
  kv->setPageFullHook([this](int layer, PageId page, int kvHead) {
    computeFields(layer, page, kvHead);
  });
  if (cfg.scale == 0)
    cfg.scale = 1.0f / std::sqrt(float(cfg.headDim));
}

DecodeSession::~DecodeSession() = default;

void DecodeSession::computeFields(int layer, PageId page, int kvHead) {
  if (artifact.fields.empty())
    return;
  std::vector<float> k = kv->readKBlock(layer, page, kvHead);
  std::vector<float> v = kv->readVBlock(layer, page, kvHead);
  std::vector<std::vector<float>> fields;
  cpu->runCacheStage(k.data(), v.data(), fields);
  for (size_t f = 0; f < fields.size(); ++f)
    kv->writeField(static_cast<int>(f), layer, page, kvHead, fields[f].data());
}

SeqId DecodeSession::addSequence() { return kv->addSequence(); }

SeqId DecodeSession::fork(SeqId parent) {
  SeqId child = kv->fork(parent);
  auto it = lastMass.find(parent);
  if (it != lastMass.end())
    lastMass[child] = it->second;
  return child;
}

void DecodeSession::freeSequence(SeqId seq) {
  kv->freeSequence(seq);
  lastMass.erase(seq);
}

void DecodeSession::append(SeqId seq, const float *k, const float *v) {
  kv->append(seq, k, v);
}

void DecodeSession::appendTokens(SeqId seq, int64_t n, const float *k,
                                 const float *v) {
  kv->appendTokens(seq, n, k, v);
}

void DecodeSession::setParam(const std::string &name, double value) {
  cpu->setParam(name, value); // validated by FlowParams
  if (name == "keep_first")
    artifact.keepFirst = static_cast<int64_t>(value);
  else if (name == "keep_last")
    artifact.keepLast = static_cast<int64_t>(value);
}

int64_t DecodeSession::budget(SeqId seq) const {
  return cpu->budget(kv->numCompleteBlocks(seq), kv->length(seq));
}

void DecodeSession::decodeStep(int layer, const std::vector<SeqId> &seqs,
                               const float *q, float *out,
                               std::vector<BlockLists> *attended,
                               std::vector<BlockLists> *pages) {
  if (layer < 0 || layer >= cfg.numLayers)
    throw Error("decodeStep: layer " + std::to_string(layer) +
                " is out of range [0, " + std::to_string(cfg.numLayers) + ")");
  const int h = cfg.numKVHeads, g = cfg.group, d = cfg.headDim;
  const int64_t p = artifact.blockSize;
  if (attended)
    attended->assign(seqs.size(), {});
  if (pages)
    pages->assign(seqs.size(), {});
  for (size_t b = 0; b < seqs.size(); ++b) {
    SeqId seq = seqs[b];
    if (kv->length(seq) == 0)
      throw Error("decodeStep: sequence " + std::to_string(seq) +
                  " has no tokens");
    const float *qb = q + b * size_t(h) * g * d;
    float *ob = out + b * size_t(h) * g * d;
    int64_t numBlocks = kv->numBlocks(seq);
    int64_t complete = kv->numCompleteBlocks(seq);
    LayerHistory &history = lastMass[seq];
    history.mass.resize(cfg.numLayers);
    history.steps.resize(cfg.numLayers, 0);
    std::vector<float> &mass = history.mass[layer];
    int64_t massBlocks =
        mass.empty() ? 0 : int64_t(mass.size()) / (int64_t(h) * g);

    BlockLists blocks(h);
    std::vector<float> massIn, kIn, vIn;
    for (int kh = 0; kh < h; ++kh) {
      std::vector<int64_t> selection;
      if (complete > 0) {
        CpuIndexInputs in;
        in.q = qb + size_t(kh) * g * d;
        in.numBlocks = complete;
        in.contextLen = kv->length(seq);
        in.step = history.steps[layer];
        std::vector<std::vector<float>> fields;
        for (size_t f = 0; f < artifact.fields.size(); ++f)
          fields.push_back(
              kv->gatherField(seq, static_cast<int>(f), layer, kh));
        for (const auto &f : fields)
          in.fields.push_back(f.data());
        if (cpu->info().readsMass) {
          massIn.assign(complete * g, 0.0f);
          for (int64_t blk = 0; blk < std::min(complete, massBlocks); ++blk)
            for (int j = 0; j < g; ++j)
              massIn[blk * g + j] = mass[(kh * massBlocks + blk) * g + j];
          in.mass = massIn.data();
        }
        if (cpu->info().readsKV) {
          kIn.assign(complete * p * d, 0.0f);
          vIn.assign(complete * p * d, 0.0f);
          for (int64_t blk = 0; blk < complete; ++blk) {
            PageId page = kv->physicalPage(seq, blk);
            kv->readKBlock(layer, page, kh, kIn.data() + blk * p * d);
            kv->readVBlock(layer, page, kh, vIn.data() + blk * p * d);
          }
          in.K = kIn.data();
          in.V = vIn.data();
        }
        // States live in the cache, per (sequence, layer, KV head).
        CpuStates states(artifact.states.size());
        for (size_t s = 0; s < artifact.states.size(); ++s)
          states[s] = kv->readState(seq, static_cast<int>(s), layer, kh);
        selection = cpu->runIndexStage(in, states);
        for (size_t s = 0; s < artifact.states.size(); ++s)
          kv->writeState(seq, static_cast<int>(s), layer, kh, states[s].data(),
                         static_cast<int64_t>(states[s].size()));
      }
      blocks[kh] = cpu->finalBlocks(selection, complete);
      if (numBlocks > complete)
        blocks[kh].push_back(complete); // the partial last block
    }
    std::vector<float> newMass(size_t(h) * numBlocks * g);
    sparseDecodeAttention(*kv, seq, layer, qb, g, cfg.scale, blocks, ob,
                          newMass.data());
    mass = std::move(newMass);
    ++history.steps[layer];
    if (pages) {
      BlockLists &physical = (*pages)[b];
      physical.resize(h);
      for (int kh = 0; kh < h; ++kh)
        for (int64_t blk : blocks[kh])
          physical[kh].push_back(kv->physicalPage(seq, blk));
    }
    if (attended)
      (*attended)[b] = std::move(blocks);
  }
}

std::vector<float> DecodeSession::attentionMass(SeqId seq, int layer) const {
  auto it = lastMass.find(seq);
  if (it == lastMass.end() || layer < 0 || layer >= int(it->second.mass.size()))
    return {};
  return it->second.mass[layer];
}

int64_t DecodeSession::steps(SeqId seq, int layer) const {
  auto it = lastMass.find(seq);
  if (it == lastMass.end() || layer < 0 ||
      layer >= int(it->second.steps.size()))
    return 0;
  return it->second.steps[layer];
}
