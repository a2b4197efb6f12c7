//===- Session.cpp - A compiled flow attached to a paged KV cache ---------===//

#include "vflow/Runtime/Session.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

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

/// Throws unless `t` is host memory of a type the CPU backend takes.
void checkHostTensor(const Tensor &t, const char *what) {
  if (!t.data)
    throw Error(std::string(what) + " must not be null");
  if (t.device != Device::Cpu)
    throw Error(std::string(what) +
                " is a device tensor; the CPU backend takes host memory");
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    throw Error(std::string(what) + " is " + dtypeName(t.dtype) +
                "; the CPU backend takes f32, bf16 or f16");
}

/// A host tensor of `count` elements as f32: its own data when it is f32,
/// else a converted copy kept in `copy`.
const float *hostF32(const Tensor &t, size_t count, const char *what,
                     std::vector<float> &copy) {
  checkHostTensor(t, what);
  if (t.dtype == DType::F32)
    return static_cast<const float *>(t.data);
  copy.resize(count);
  convertToF32(t.dtype, t.data, copy.data(), count);
  return copy.data();
}

} // namespace

int64_t vflow::rt::checkStepArgs(const char *what,
                                 const std::vector<SeqId> &seqs,
                                 const std::vector<int64_t> *counts) {
  if (counts && counts->size() != seqs.size())
    throw Error(std::string(what) + ": " + std::to_string(seqs.size()) +
                " sequences but " + std::to_string(counts->size()) + " counts");
  std::set<SeqId> distinct;
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!distinct.insert(seqs[i]).second)
      throw Error(std::string(what) + ": sequence " + std::to_string(seqs[i]) +
                  " appears twice in one call");
    if (counts && (*counts)[i] < 0)
      throw Error(std::string(what) + ": a negative count for sequence " +
                  std::to_string(seqs[i]));
    total += counts ? (*counts)[i] : 0;
  }
  return total;
}

void vflow::rt::checkLayer(const char *what, int layer, int numLayers) {
  if (layer < 0 || layer >= numLayers)
    throw Error(std::string(what) + ": layer " + std::to_string(layer) +
                " is out of range [0, " + std::to_string(numLayers) + ")");
}

int64_t vflow::rt::checkRowsWritten(const char *what, const PageTable &table,
                                    int layer, int numLayers,
                                    const std::vector<SeqId> &seqs,
                                    const std::vector<int64_t> *counts,
                                    bool needTokens) {
  const int64_t total = checkStepArgs(what, seqs, counts);
  const std::string call(what);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqId seq = seqs[i];
    table.require(seq, call);
    const int64_t length = table.length(seq);
    if (needTokens && length == 0)
      throw Error(call + ": sequence " + std::to_string(seq) +
                  " has no tokens");
    if (counts && (*counts)[i] > length)
      throw Error(call + ": " + std::to_string((*counts)[i]) +
                  " query rows for sequence " + std::to_string(seq) + " of " +
                  std::to_string(length) + " tokens");
    for (int l = layer < 0 ? 0 : layer; l < (layer < 0 ? numLayers : layer + 1);
         ++l)
      if (table.written(seq, l) != length)
        throw Error(call + ": sequence " + std::to_string(seq) + " has " +
                    std::to_string(length) + " tokens but layer " +
                    std::to_string(l) + " holds the K/V of " +
                    std::to_string(table.written(seq, l)) +
                    " (append them at this layer first)");
  }
  return total;
}

void vflow::rt::checkPool(const char *what, size_t sequences, int64_t needed,
                          int64_t free) {
  if (needed > free)
    throw Error(std::string("KV cache exhausted: ") + what + " " +
                std::to_string(sequences) + " sequences needs " +
                std::to_string(needed) + " more pages, " +
                std::to_string(free) + " are free (no sequence was changed)");
}

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
  info.retainBudget = flow.retainBudget;
  info.retainCombine = flow.retainCombine;
  info.retainTokens = flow.retainTokens;
  info.readsKV = flow.readsInput("K") || flow.readsInput("V");
  return info;
}

Session::~Session() = default;

void Session::append(const std::vector<SeqId> &seqs,
                     const std::vector<int64_t> &counts, const float *k,
                     const float *v) {
  if (seqs.size() != counts.size())
    throw Error("append: " + std::to_string(seqs.size()) + " sequences but " +
                std::to_string(counts.size()) + " counts");
  const SessionConfig &c = config();
  const size_t token = size_t(c.numLayers) * c.numKVHeads * c.headDim;
  size_t at = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    append(seqs[i], counts[i], k + at * token, v + at * token);
    at += size_t(counts[i]);
  }
}

FlowArtifact vflow::rt::denseFlow(int64_t blockSize) {
  FlowArtifact flow;
  flow.name = "dense";
  flow.blockSize = blockSize;
  flow.keepFirst = 0;
  flow.keepLast = 0;
  return flow;
}

FlowArtifact vflow::rt::sessionFlow(const FlowArtifact &flow, int denseLayers,
                                    int numLayers) {
  FlowArtifact kept = flow;
  if (denseLayers >= numLayers) {
    kept.fields.clear();
    kept.states.clear();
  }
  return kept;
}

void vflow::rt::checkDenseLayers(const SessionConfig &cfg) {
  if (cfg.denseLayers < 0)
    throw Error("session config: denseLayers must not be negative, got " +
                std::to_string(cfg.denseLayers));
  if (int64_t(cfg.slidingWindow.size()) > cfg.numLayers)
    throw Error("session config: slidingWindow has " +
                std::to_string(cfg.slidingWindow.size()) + " entries for " +
                std::to_string(cfg.numLayers) + " layers");
  for (int64_t w : cfg.slidingWindow)
    if (w < 0)
      throw Error("session config: a sliding window must not be negative, "
                  "got " +
                  std::to_string(w));
}

void vflow::rt::checkRetainWithWindows(const FlowArtifact &flow,
                                       const SessionConfig &cfg,
                                       bool runsFlow) {
  if (runsFlow && flow.retains())
    for (int64_t w : cfg.slidingWindow)
      if (w > 0)
        throw Error("flow '" + flow.name +
                    "' has a retain block, which would evict the tokens of a "
                    "sliding-window layer's window; use it on models "
                    "without sliding windows");
}

BudgetScope vflow::rt::budgetScope(const SessionConfig &cfg) {
  if (cfg.firstKVHead < 0)
    throw Error("session config: firstKVHead must not be negative, got " +
                std::to_string(cfg.firstKVHead));
  BudgetScope scope;
  scope.group = cfg.group;
  scope.firstLayer = std::min(cfg.denseLayers, cfg.numLayers);
  scope.numLayers = std::max(1, cfg.numLayers - cfg.denseLayers);
  scope.firstKVHead = cfg.firstKVHead;
  scope.numKVHeads = std::max(1, cfg.numKVHeads);
  return scope;
}

HostSession::HostSession(const FlowArtifact &flow, const SessionConfig &config)
    : artifact(sessionFlow(flow, config.denseLayers, config.numLayers)),
      cfg(config) {
  if (cfg.numLayers < 1 || cfg.numKVHeads < 1 || cfg.group < 1 ||
      cfg.headDim < 1 || cfg.numPages < 1)
    throw Error("session config: numLayers, numKVHeads, group, headDim and "
                "numPages must be positive");
  checkDenseLayers(cfg);
  // A session dense at every layer never runs the flow: nothing to compile.
  const bool runsFlow = cfg.denseLayers < cfg.numLayers;
  // The flow's code is compiled and run below: its metadata must be what
  // the compiler produced for it (Artifact.h).
  if (runsFlow)
    validateFlowArtifact(flow, "session");
  if (flow.headDim > 0 && flow.headDim != cfg.headDim)
    throw Error("flow '" + flow.name + "' is specialized to head_dim " +
                std::to_string(flow.headDim) +
                ", but the session has head dimension " +
                std::to_string(cfg.headDim));
  if (!isHostKVDType(cfg.kvDType))
    throw Error(std::string("session config: the CPU backend stores K/V as "
                            "f32, bf16, f16, int8, fp8e4m3 or fp8e5m2, not ") +
                dtypeName(cfg.kvDType));
  checkRetainWithWindows(flow, cfg, runsFlow);
  if (runsFlow) {
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
    HostJitOptions jit = cfg.jit;
    if (jit.cacheDir.empty())
      jit.cacheDir = cfg.cacheDir;
    jit.quiet = jit.quiet || cfg.quiet;
    cpu = std::make_unique<CpuFlow>(source->text, std::move(info), cfg.headDim,
                                    cfg.group, jit);
    const BudgetScope scope = budgetScope(cfg);
    cpu->setBudgetScope(scope.firstLayer, scope.numLayers, scope.firstKVHead,
                        scope.numKVHeads);
  }
  CacheConfig cc;
  cc.numLayers = cfg.numLayers;
  cc.numKVHeads = cfg.numKVHeads;
  cc.headDim = cfg.headDim;
  cc.pageSize = static_cast<int>(flow.blockSize);
  cc.numPages = cfg.numPages;
  cc.kvDType = cfg.kvDType;
  cc.valuesAreKeys = cfg.valuesAreKeys;
  // The fields and states kept (none when the flow never runs).
  for (size_t i = 0; i < artifact.fields.size(); ++i)
    cc.fields.push_back({artifact.fields[i].name, artifact.fields[i].dtype,
                         cpu->fieldElements(i)});
  for (const ArtifactTensor &s : artifact.states)
    cc.states.push_back({s.name, s.dtype, s.elements(cfg.headDim, cfg.group),
                         s.perBlock, s.init});
  kv = std::make_unique<PagedKVCache>(cc);
  if (cpu)
    kv->setPageFullHook([this](int layer, PageId page, int kvHead) {
      computeFields(layer, page, kvHead);
    });
  if (cfg.scale == 0)
    cfg.scale = 1.0f / std::sqrt(float(cfg.headDim));
  lastBlocks.resize(cfg.numLayers);
  lastPages.resize(cfg.numLayers);
  if (cfg.massRecall) {
    counters.massRecallSum.assign(
        size_t(cfg.numLayers) * cfg.numKVHeads * cfg.group, 0.0);
    counters.massRecallCount.assign(size_t(cfg.numLayers), 0);
  }
}

HostSession::~HostSession() = default;

void HostSession::computeFields(int layer, PageId page, int kvHead) {
  if (artifact.fields.empty())
    return;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> k = kv->readKBlock(layer, page, kvHead);
  std::vector<float> v = kv->readVBlock(layer, page, kvHead);
  std::vector<std::vector<float>> fields;
  cpu->runCacheStage(k.data(), v.data(), fields);
  for (size_t f = 0; f < fields.size(); ++f)
    kv->writeField(static_cast<int>(f), layer, page, kvHead, fields[f].data());
  counters.cacheStageMs += std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - t0)
                               .count();
}

SeqId HostSession::addSequence() { return kv->addSequence(); }

SeqId HostSession::fork(SeqId parent) {
  SeqId child = kv->fork(parent);
  auto it = history.find(parent);
  if (it != history.end())
    history[child] = it->second;
  return child;
}

SeqId HostSession::sharePrefix(SeqId parent, int64_t tokens) {
  return kv->sharePrefix(parent, tokens);
}

void HostSession::release(SeqId seq) {
  kv->freeSequence(seq);
  history.erase(seq);
  perSequence.erase(seq);
}

void HostSession::evict(SeqId seq, const std::vector<int64_t> &blocks) {
  kv->evict(seq, blocks);
  counters.tokensEvicted += int64_t(blocks.size()) * artifact.blockSize;
  perSequence[seq].tokensEvicted += int64_t(blocks.size()) * artifact.blockSize;
  auto it = history.find(seq);
  if (it == history.end() || blocks.empty())
    return;
  // The last step's mass ([numKVHeads, blocks then, group]) loses the
  // evicted blocks it covers.
  const size_t g = size_t(cfg.group), heads = size_t(cfg.numKVHeads);
  for (std::vector<float> &mass : it->second.mass) {
    if (mass.empty())
      continue;
    const int64_t n = int64_t(mass.size() / (heads * g));
    std::vector<float> kept;
    for (size_t h = 0; h < heads; ++h) {
      size_t next = 0;
      for (int64_t b = 0; b < n; ++b) {
        while (next < blocks.size() && blocks[next] < b)
          ++next;
        if (next < blocks.size() && blocks[next] == b)
          continue;
        const float *row = mass.data() + (h * size_t(n) + size_t(b)) * g;
        kept.insert(kept.end(), row, row + g);
      }
    }
    mass = std::move(kept);
  }
}

void HostSession::evictTokens(SeqId seq, const std::vector<int64_t> &tokens) {
  const int64_t first = kv->evictTokens(seq, tokens);
  counters.tokensEvicted += int64_t(tokens.size());
  perSequence[seq].tokensEvicted += int64_t(tokens.size());
  auto it = history.find(seq);
  if (it == history.end() || tokens.empty())
    return;
  // The last step's mass ([numKVHeads, blocks then, group]): the blocks
  // before the first rewritten one keep theirs, the others have none.
  const size_t g = size_t(cfg.group), heads = size_t(cfg.numKVHeads);
  const int64_t now = kv->numBlocks(seq);
  for (std::vector<float> &mass : it->second.mass) {
    if (mass.empty())
      continue;
    const int64_t n = int64_t(mass.size() / (heads * g));
    std::vector<float> kept(heads * size_t(now) * g, 0.0f);
    for (size_t h = 0; h < heads; ++h)
      for (int64_t b = 0; b < std::min({first, n, now}); ++b)
        std::copy_n(mass.data() + (h * size_t(n) + size_t(b)) * g, g,
                    kept.data() + (h * size_t(now) + size_t(b)) * g);
    mass = std::move(kept);
  }
}

SequenceStats HostSession::sequenceStats(SeqId seq) const {
  kv->length(seq); // an unknown sequence is an Error
  auto it = perSequence.find(seq);
  return it == perSequence.end() ? SequenceStats() : it->second;
}

void HostSession::append(SeqId seq, int64_t n, const float *k, const float *v) {
  kv->appendTokens(seq, n, k, v);
}

void HostSession::append(const std::vector<SeqId> &seqs,
                         const std::vector<int64_t> &counts, const float *k,
                         const float *v) {
  checkStepArgs("append", seqs, &counts);
  int64_t needed = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    needed += kv->pagesNeeded(seqs[i], counts[i]);
  checkPool("appending to", seqs.size(), needed, kv->blockManager().numFree());
  Session::append(seqs, counts, k, v);
}

void HostSession::append(int layer, const std::vector<SeqId> &seqs,
                         const std::vector<int64_t> &counts, const Tensor &k,
                         const Tensor &v, void *) {
  checkLayer("append", layer, cfg.numLayers);
  const int64_t total = checkStepArgs("append", seqs, &counts);
  std::vector<int64_t> growth(seqs.size());
  int64_t needed = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    growth[i] = std::max<int64_t>(0, kv->written(seqs[i], layer) + counts[i] -
                                         kv->length(seqs[i]));
    needed += kv->pagesNeeded(seqs[i], growth[i]);
  }
  if (total == 0)
    return;
  const size_t row = size_t(cfg.numKVHeads) * cfg.headDim;
  std::vector<float> kCopy, vCopy;
  const float *kf = hostF32(k, size_t(total) * row, "append: k", kCopy);
  const float *vf = hostF32(v, size_t(total) * row, "append: v", vCopy);
  checkPool("appending to", seqs.size(), needed, kv->blockManager().numFree());
  size_t at = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    kv->reserve(seqs[i], growth[i]);
    kv->writeLayer(layer, seqs[i], counts[i], kf + at * row, vf + at * row);
    at += size_t(counts[i]);
  }
}

Error vflow::rt::noParams(const std::string &name) {
  return Error("param '" + name +
               "': the session is dense at every layer (no flow, no params)");
}

void HostSession::setParam(const std::string &name, double value) {
  if (!cpu)
    throw noParams(name);
  cpu->setParam(name, value); // validated by FlowParams
  if (name == "keep_first")
    artifact.keepFirst = static_cast<int64_t>(value);
  else if (name == "keep_last")
    artifact.keepLast = static_cast<int64_t>(value);
}

double HostSession::param(const std::string &name) const {
  if (!cpu)
    throw noParams(name);
  return cpu->param(name);
}

int64_t HostSession::budget(SeqId seq) const {
  if (!cpu)
    return kv->numCompleteBlocks(seq);
  return cpu->budget(kv->numCompleteBlocks(seq), kv->length(seq));
}

void HostSession::setAttentionMass(SeqId seq, int layer,
                                   const std::vector<float> &mass) {
  checkLayer("setAttentionMass", layer, cfg.numLayers);
  const int64_t per = int64_t(cfg.numKVHeads) * cfg.group;
  if (int64_t(mass.size()) % per != 0 ||
      int64_t(mass.size()) / per > kv->numBlocks(seq))
    throw Error("setAttentionMass: " + std::to_string(mass.size()) +
                " values are not [numKVHeads, numBlocks, group] with at "
                "most the sequence's " +
                std::to_string(kv->numBlocks(seq)) + " blocks");
  LayerHistory &h = history[seq];
  h.mass.resize(cfg.numLayers);
  h.steps.resize(cfg.numLayers, 0);
  h.mass[layer] = mass;
}

void HostSession::checkDecodeRows(int layer,
                                  const std::vector<SeqId> &seqs) const {
  checkLayer("decode", layer, cfg.numLayers);
  checkRowsWritten("decode", kv->pageTable(), layer, cfg.numLayers, seqs,
                   nullptr, true);
  // The budgets at each row's length, before anything of the step runs.
  if (cpu && layer >= cfg.denseLayers)
    for (SeqId seq : seqs)
      cpu->checkBudgetsAt(kv->length(seq));
}

std::vector<int64_t> HostSession::indexHead(SeqId seq, int layer, int kh,
                                            const float *q, LayerHistory &hist,
                                            float *retainScore) {
  const int g = cfg.group, d = cfg.headDim;
  const int64_t p = artifact.blockSize, complete = kv->numCompleteBlocks(seq);
  if (complete == 0)
    return {};
  CpuIndexInputs in;
  in.q = q + size_t(kh) * g * d;
  in.numBlocks = complete;
  in.contextLen = kv->length(seq);
  in.step = hist.steps[layer];
  in.layer = layer;
  in.kvHead = cfg.firstKVHead + kh;
  std::vector<std::vector<float>> fields;
  for (size_t f = 0; f < artifact.fields.size(); ++f)
    fields.push_back(kv->gatherField(seq, static_cast<int>(f), layer, kh));
  for (const auto &f : fields)
    in.fields.push_back(f.data());
  std::vector<float> massIn, kIn, vIn, firstToken;
  if (artifact.readsInput("first_token")) {
    // Where each kept block's first token was before any eviction.
    firstToken.resize(size_t(complete));
    for (int64_t blk = 0; blk < complete; ++blk)
      firstToken[size_t(blk)] =
          float(kv->pageTable().originalPosition(seq, blk * p));
    in.firstToken = firstToken.data();
  }
  if (cpu->info().readsMass) {
    // The previous step's mass per block ([kvHeads, blocks then, group]).
    const std::vector<float> &mass = hist.mass[layer];
    const int64_t massBlocks =
        mass.empty() ? 0 : int64_t(mass.size()) / (int64_t(cfg.numKVHeads) * g);
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
  std::vector<int64_t> chosen = cpu->runIndexStage(in, states, retainScore);
  for (size_t s = 0; s < artifact.states.size(); ++s)
    kv->writeState(seq, static_cast<int>(s), layer, kh, states[s].data(),
                   static_cast<int64_t>(states[s].size()));
  return chosen;
}

void HostSession::addRetainScores(LayerHistory &hist,
                                  const std::vector<float> &heads,
                                  int64_t count) {
  const bool max = cpu->retainRule().max;
  if (int64_t(hist.retain.size()) != count)
    hist.retain.assign(size_t(count), rules::retainInit(max));
  for (int kh = 0; kh < cfg.numKVHeads; ++kh)
    for (int64_t i = 0; i < count; ++i) {
      float &acc = hist.retain[size_t(i)];
      acc = rules::retainFold(max, acc, heads[size_t(kh * count + i)]);
    }
}

int64_t HostSession::retainedBlocks() const {
  if (!cpu || !cpu->retains())
    return -1;
  return cpu->retainRule().retainedBlocks();
}

void HostSession::applyRetain(SeqId seq, LayerHistory &hist) {
  std::vector<float> score = std::move(hist.retain);
  hist.retain.clear();
  const RetainRule rule = cpu->retainRule();
  const int64_t n = kv->numCompleteBlocks(seq);
  if (score.empty() || int64_t(score.size()) != n * rule.scoresPerBlock())
    return;
  const std::vector<int64_t> out = rule.evictions(score.data(), n);
  if (out.empty())
    return;
  const int64_t freeBefore = kv->blockManager().numFree();
  if (rule.tokens) {
    evictTokens(seq, out);
  } else {
    evict(seq, out);
    counters.blocksEvicted += int64_t(out.size());
    perSequence[seq].blocksEvicted += int64_t(out.size());
  }
  counters.pagesReclaimed += kv->blockManager().numFree() - freeBefore;
}

void HostSession::addMassRecall(SeqId seq, int layer, const float *q,
                                const BlockLists &blocks) {
  // Dense attention's mass per block, summed over the attended ones.
  const int h = cfg.numKVHeads, g = cfg.group, d = cfg.headDim;
  const int64_t numBlocks = kv->numBlocks(seq);
  std::vector<float> denseMass(size_t(h) * numBlocks * g),
      scratch(size_t(h) * g * d);
  denseDecodeAttention(*kv, seq, layer, q, g, cfg.scale, scratch.data(),
                       denseMass.data());
  for (int kh = 0; kh < h; ++kh)
    for (int j = 0; j < g; ++j) {
      double share = 0;
      for (int64_t blk : blocks[kh])
        share += denseMass[(size_t(kh) * numBlocks + blk) * g + j];
      counters.massRecallSum[size_t(layer) * h * g + kh * g + j] += share;
    }
  ++counters.massRecallCount[size_t(layer)];
}

BlockLists HostSession::countAttended(SeqId seq, const BlockLists &blocks) {
  // Telemetry: the byte model of the perf records (fields of every complete
  // block, K and V of the attended blocks); the physical pages attended.
  const int h = cfg.numKVHeads, g = cfg.group, d = cfg.headDim;
  const int64_t p = artifact.blockSize, numBlocks = kv->numBlocks(seq);
  double fieldBytes = 0;
  for (const ArtifactTensor &f : artifact.fields)
    fieldBytes += double(f.elements(d, g)) * bytesPerElement(f.dtype);
  counters.bytesRead += double(h) * kv->numCompleteBlocks(seq) * fieldBytes;
  BlockLists physical(h);
  SequenceStats &mine = perSequence[seq];
  for (int kh = 0; kh < h; ++kh) {
    ++counters.listsAttended;
    counters.blocksAttended += int64_t(blocks[kh].size());
    counters.blocksAvailable += numBlocks;
    ++mine.listsAttended;
    mine.blocksAttended += int64_t(blocks[kh].size());
    mine.blocksAvailable += numBlocks;
    // K and V of each token: its row, and its scale for a scaled dtype.
    counters.bytesRead +=
        double(blocks[kh].size()) * 2 * p *
        double(d * bytesPerElement(kv->kvDType()) +
               (isScaledKVDType(kv->kvDType()) ? sizeof(float) : 0));
    for (int64_t blk : blocks[kh])
      physical[kh].push_back(kv->physicalPage(seq, blk));
  }
  return physical;
}

void HostSession::decode(int layer, const std::vector<SeqId> &seqs,
                         const Tensor &qTensor, const Tensor &outTensor,
                         void *) {
  checkDecodeRows(layer, seqs);
  const int h = cfg.numKVHeads, g = cfg.group, d = cfg.headDim;
  const size_t rows = seqs.size() * size_t(h) * g * d;
  std::vector<float> qCopy, outCopy;
  const float *q = hostF32(qTensor, rows, "decode: q", qCopy);
  checkHostTensor(outTensor, "decode: out");
  float *out = static_cast<float *>(outTensor.data);
  if (outTensor.dtype != DType::F32) {
    outCopy.resize(rows);
    out = outCopy.data();
  }
  std::vector<BlockLists> attended(seqs.size()), pages(seqs.size());
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  const int64_t window = layer < int64_t(cfg.slidingWindow.size())
                             ? cfg.slidingWindow[size_t(layer)]
                             : 0;
  const bool dense = layer < cfg.denseLayers || !cpu || window > 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const SeqId seq = seqs[b];
    const float *qb = q + b * size_t(h) * g * d;
    float *ob = out + b * size_t(h) * g * d;
    const int64_t numBlocks = kv->numBlocks(seq);
    const int64_t complete = kv->numCompleteBlocks(seq);
    LayerHistory &hist = history[seq];
    hist.mass.resize(cfg.numLayers);
    hist.steps.resize(cfg.numLayers, 0);

    // The blocks each KV head attends: every one on a dense layer, else
    // the index stage's selection, the kept blocks and the partial last.
    auto t0 = Clock::now();
    BlockLists blocks(h);
    // A sliding window starts at this token (and its block).
    const int64_t from =
        window > 0 ? std::max<int64_t>(0, kv->length(seq) - window) : 0;
    // Past what the retain block keeps (its capacity, or the kept blocks
    // when they are more: under it a cut evicts nothing), each KV head also
    // scores the blocks for eviction.
    std::vector<float> retainScores;
    if (layer == cfg.denseLayers)
      hist.retain.clear(); // a step that did not reach its last layer
    const int64_t perBlock =
        cpu && cpu->retains() ? cpu->retainRule().scoresPerBlock() : 1;
    if (!dense && cpu->retains() && cpu->retainRule().over(complete))
      retainScores.resize(size_t(h) * complete * perBlock);
    for (int kh = 0; kh < h; ++kh) {
      if (dense) {
        for (int64_t blk = from / artifact.blockSize; blk < numBlocks; ++blk)
          blocks[kh].push_back(blk);
        continue;
      }
      blocks[kh] = cpu->finalBlocks(
          indexHead(seq, layer, kh, qb, hist,
                    retainScores.empty()
                        ? nullptr
                        : retainScores.data() + kh * complete * perBlock),
          complete);
      if (numBlocks > complete)
        blocks[kh].push_back(complete); // the partial last block
    }
    if (!retainScores.empty())
      addRetainScores(hist, retainScores, complete * perBlock);
    counters.indexMs += ms(t0);
    t0 = Clock::now();
    std::vector<float> newMass(size_t(h) * numBlocks * g);
    sparseDecodeAttention(*kv, seq, layer, qb, g, cfg.scale, blocks, ob,
                          newMass.data(), from);
    counters.attendMs += ms(t0);
    hist.mass[layer] = std::move(newMass);
    ++hist.steps[layer];
    if (cfg.massRecall && !dense)
      addMassRecall(seq, layer, qb, blocks);
    pages[b] = countAttended(seq, blocks);
    attended[b] = std::move(blocks);
    // The step's last layer ends it: the retain block evicts then, so every
    // layer held the same blocks for the whole step.
    if (layer == cfg.numLayers - 1 && !hist.retain.empty())
      applyRetain(seq, hist);
  }
  if (out != outTensor.data)
    convertFromF32(outTensor.dtype, out, outTensor.data, rows);
  ++counters.decodes;
  lastBlocks[layer] = std::move(attended);
  lastPages[layer] = std::move(pages);
}

void HostSession::prefill(int layer, const std::vector<SeqId> &seqs,
                          const std::vector<int64_t> &counts,
                          const Tensor &qTensor, const Tensor &outTensor,
                          void *) {
  checkLayer("prefill", layer, cfg.numLayers);
  const int64_t total = checkRowsWritten("prefill", kv->pageTable(), layer,
                                         cfg.numLayers, seqs, &counts, false);
  const size_t row = size_t(cfg.numKVHeads) * cfg.group * cfg.headDim;
  std::vector<float> qCopy, outCopy;
  const float *q = hostF32(qTensor, size_t(total) * row, "prefill: q", qCopy);
  checkHostTensor(outTensor, "prefill: out");
  float *out = static_cast<float *>(outTensor.data);
  if (outTensor.dtype != DType::F32) {
    outCopy.resize(size_t(total) * row);
    out = outCopy.data();
  }
  auto t0 = std::chrono::steady_clock::now();
  size_t at = 0;
  // The observation window sets the mass a flow reads at the next decode.
  const bool observe = cfg.observeTokens > 0 && cpu && cpu->info().readsMass &&
                       layer >= cfg.denseLayers;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (counts[i] > 0) {
      std::vector<float> mass;
      if (observe)
        mass.resize(size_t(cfg.numKVHeads) * kv->numBlocks(seqs[i]) *
                    cfg.group);
      causalPrefillAttention(*kv, seqs[i], layer, q + at * row, counts[i],
                             cfg.group, cfg.scale, out + at * row,
                             observe ? mass.data() : nullptr, cfg.observeTokens,
                             layer < int(cfg.slidingWindow.size())
                                 ? cfg.slidingWindow[size_t(layer)]
                                 : 0);
      if (observe) {
        LayerHistory &hist = history[seqs[i]];
        hist.mass.resize(cfg.numLayers);
        hist.steps.resize(cfg.numLayers, 0);
        hist.mass[layer] = std::move(mass);
      }
    }
    at += size_t(counts[i]);
  }
  counters.attendMs += std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
  if (out != outTensor.data)
    convertFromF32(outTensor.dtype, out, outTensor.data, size_t(total) * row);
}

StepKey HostSession::beginStep(const std::vector<SeqId> &seqs, int64_t rows,
                               void *) {
  checkRowsWritten("beginStep", kv->pageTable(), -1, cfg.numLayers, seqs,
                   nullptr, false);
  if (rows < 0 || (cfg.maxBatch > 0 && rows > cfg.maxBatch))
    throw Error("beginStep: rows must be 0 to maxBatch (" +
                std::to_string(cfg.maxBatch) + "), not " +
                std::to_string(rows));
  stepRows = seqs;
  StepKey key;
  key.rows = std::max<int64_t>(int64_t(seqs.size()), rows);
  return key;
}

void HostSession::stepLayer(int layer, const Tensor &q, const Tensor &k,
                            const Tensor &v, const Tensor &out, void *stream) {
  if (stepRows.empty())
    throw Error("stepLayer: no step was begun (beginStep)");
  append(layer, stepRows, std::vector<int64_t>(stepRows.size(), 1), k, v,
         stream);
  decode(layer, stepRows, q, out, stream);
}

std::vector<BlockLists> HostSession::selection(int layer) const {
  checkLayer("selection", layer, cfg.numLayers);
  return lastBlocks[layer];
}

std::vector<BlockLists> HostSession::selectedPages(int layer) const {
  checkLayer("selectedPages", layer, cfg.numLayers);
  return lastPages[layer];
}

std::vector<float> HostSession::attentionMass(SeqId seq, int layer) const {
  auto it = history.find(seq);
  if (it == history.end() || layer < 0 || layer >= int(it->second.mass.size()))
    return {};
  return it->second.mass[layer];
}

int64_t HostSession::steps(SeqId seq, int layer) const {
  auto it = history.find(seq);
  if (it == history.end() || layer < 0 || layer >= int(it->second.steps.size()))
    return 0;
  return it->second.steps[layer];
}
