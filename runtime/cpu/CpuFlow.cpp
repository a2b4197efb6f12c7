//===- CpuFlow.cpp - Run a flow's generated C++ on the host ---------------===//

#include "vflow/Runtime/CpuFlow.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

using namespace vflow::rt;

namespace {

std::string shapeText(const CpuTensorSpec &spec) {
  std::string out = "[";
  for (size_t i = 0; i < spec.axes.size(); ++i) {
    out += (i ? ", " : "") + spec.axes[i] + ":" + formatAxisSize(spec.sizes[i]);
  }
  return out + "]";
}

bool perBlock(const CpuTensorSpec &spec) {
  return std::find(spec.axes.begin(), spec.axes.end(), "block") !=
         spec.axes.end();
}

} // namespace

CpuFlow::CpuFlow(const std::string &source, CpuFlowInfo info, int64_t headDim,
                 int64_t group, HostJitOptions options)
    : flowInfo(std::move(info)), dim(headDim), groupSize(group) {
  const std::string &flow = flowInfo.flowName;
  if (headDim <= 0 || group <= 0)
    throw Error("flow '" + flow + "': head dimension (" +
                std::to_string(headDim) + ") and group size (" +
                std::to_string(group) + ") must be positive");
  BudgetScope scope;
  scope.group = group;
  params = FlowParams(flow, flowInfo.params, flowInfo.budgets,
                      flowInfo.selection, scope);
  int64_t fixed = 0;
  for (const ParamSpec &p : flowInfo.params)
    if (p.name == "head_dim")
      fixed = static_cast<int64_t>(p.value);
  if (fixed > 0 && fixed != headDim)
    throw Error("flow '" + flow + "' is specialized to head_dim " +
                std::to_string(fixed) + ", but the cache has head dimension " +
                std::to_string(headDim));
  for (const CpuTensorSpec &s : flowInfo.states)
    if (perBlock(s) && s.axes.front() != "block")
      throw Error("flow '" + flow + "': state '" + s.name +
                  "' must have its block axis first, has " + shapeText(s));

  std::string label = options.label.empty() ? flow : options.label;
  library = std::make_unique<HostJit>(label, source, std::move(options));
  auto constsFn = library->lookup<VflowConstsFn>("vflow_" + flow + "_consts");
  cacheFn = library->lookup<VflowCacheFn>("vflow_" + flow + "_cache");
  indexFn = library->lookup<VflowIndexFn>("vflow_" + flow + "_index");

  std::vector<float *> out;
  for (const CpuTensorSpec &c : flowInfo.consts) {
    if (perBlock(c))
      throw Error("flow '" + flow + "': const '" + c.name +
                  "' cannot have a block axis");
    constValues.emplace_back(elements(c, 0), 0.0f);
  }
  for (auto &values : constValues) {
    out.push_back(values.data());
    constPtrs.push_back(values.data());
  }
  if (!flowInfo.constValues.empty()) {
    // Computed by the compiler (the artifact's const values): the same
    // values a GPU session of the same artifact uses.
    if (flowInfo.constValues.size() != constValues.size())
      throw Error("flow '" + flow +
                  "': " + std::to_string(flowInfo.constValues.size()) +
                  " const value arrays for " +
                  std::to_string(constValues.size()) + " consts");
    for (size_t i = 0; i < constValues.size(); ++i) {
      if (flowInfo.constValues[i].size() != constValues[i].size())
        throw Error("flow '" + flow + "': const '" + flowInfo.consts[i].name +
                    "' has " + std::to_string(flowInfo.constValues[i].size()) +
                    " values, not " + std::to_string(constValues[i].size()));
      // In place: constPtrs point into these buffers.
      std::copy(flowInfo.constValues[i].begin(), flowInfo.constValues[i].end(),
                constValues[i].begin());
    }
    return;
  }
  VflowConstArgs args{dim, groupSize, params.values().data(), out.data()};
  constsFn(&args);
}

CpuFlow::~CpuFlow() = default;

int64_t CpuFlow::blockSize() const { return params.blockSize(); }
int64_t CpuFlow::keepFirst() const { return params.keepFirst(); }
int64_t CpuFlow::keepLast() const { return params.keepLast(); }

void CpuFlow::setParam(const std::string &name, double value) {
  params.set(name, value);
}

double CpuFlow::param(const std::string &name) const {
  return params.get(name);
}

int64_t CpuFlow::resolve(int64_t size, int64_t numBlocks) const {
  switch (size) {
  case kCpuSizeBlocks:
    return numBlocks;
  case kCpuSizeGroup:
    return groupSize;
  case kCpuSizeHeadDim:
    return dim;
  default:
    return size;
  }
}

int64_t CpuFlow::elements(const CpuTensorSpec &spec, int64_t numBlocks) const {
  int64_t n = 1;
  for (int64_t s : spec.sizes)
    n *= resolve(s, numBlocks);
  return n;
}

int64_t CpuFlow::fieldElements(size_t i) const {
  if (i >= flowInfo.fields.size())
    throw Error("flow '" + flowInfo.flowName + "' has no field #" +
                std::to_string(i));
  return elements(flowInfo.fields[i], 0);
}

void CpuFlow::runCacheStage(const float *K, const float *V,
                            std::vector<std::vector<float>> &fields) const {
  if (!K || !V)
    throw Error("flow '" + flowInfo.flowName +
                "': the cache stage needs K and V");
  fields.resize(flowInfo.fields.size());
  std::vector<float *> out;
  for (size_t i = 0; i < fields.size(); ++i) {
    fields[i].assign(fieldElements(i), 0.0f);
    out.push_back(fields[i].data());
  }
  VflowCacheArgs args{
      dim, groupSize, params.values().data(), constPtrs.data(), K,
      V,   out.data()};
  cacheFn(&args);
}

CpuStates CpuFlow::initialStates(int64_t numBlocks) const {
  CpuStates states;
  for (const CpuTensorSpec &s : flowInfo.states)
    states.emplace_back(elements(s, numBlocks), roundToDType(s.dtype, s.init));
  return states;
}

void CpuFlow::growStates(CpuStates &states, int64_t numBlocks) const {
  if (states.size() != flowInfo.states.size())
    throw Error("flow '" + flowInfo.flowName + "' has " +
                std::to_string(flowInfo.states.size()) + " states, got " +
                std::to_string(states.size()));
  for (size_t i = 0; i < states.size(); ++i) {
    const CpuTensorSpec &s = flowInfo.states[i];
    if (!perBlock(s))
      continue;
    // Block is the first axis: growing appends whole blocks.
    size_t want = static_cast<size_t>(elements(s, numBlocks));
    if (states[i].size() < want)
      states[i].resize(want, roundToDType(s.dtype, s.init));
  }
}

RetainRule CpuFlow::retainRule() const {
  if (!retains())
    throw Error("flow '" + flowInfo.flowName + "' has no retain block");
  return RetainRule::of(params, flowInfo.retainBudget, groupSize,
                        flowInfo.retainCombine, flowInfo.retainTokens,
                        params.blockSize());
}

std::vector<int64_t> CpuFlow::runIndexStage(const CpuIndexInputs &in,
                                            CpuStates &states,
                                            float *retainScore) const {
  const std::string &flow = flowInfo.flowName;
  if (in.numBlocks < 0)
    throw Error("flow '" + flow + "': negative number of blocks");
  if (!in.q)
    throw Error("flow '" + flow + "': the index stage needs q");
  if (in.fields.size() != flowInfo.fields.size())
    throw Error("flow '" + flow + "' has " +
                std::to_string(flowInfo.fields.size()) + " fields, got " +
                std::to_string(in.fields.size()));
  for (size_t i = 0; i < in.fields.size(); ++i)
    if (!in.fields[i] && in.numBlocks > 0)
      throw Error("flow '" + flow + "': field '" + flowInfo.fields[i].name +
                  "' is missing");
  if (flowInfo.readsMass && !in.mass)
    throw Error("flow '" + flow + "' reads mass, which the inputs lack");
  if (flowInfo.readsKV && (!in.K || !in.V))
    throw Error("flow '" + flow +
                "' reads K and V in its index stage, which the inputs lack");
  growStates(states, in.numBlocks);
  std::vector<float *> stateOut;
  for (size_t i = 0; i < states.size(); ++i) {
    size_t want =
        static_cast<size_t>(elements(flowInfo.states[i], in.numBlocks));
    if (states[i].size() != want)
      throw Error("flow '" + flow + "': state '" + flowInfo.states[i].name +
                  "' holds " + std::to_string(states[i].size()) +
                  " values, expected " + std::to_string(want) + " for " +
                  std::to_string(in.numBlocks) + " blocks");
    stateOut.push_back(states[i].data());
  }
  std::vector<int64_t> selected(static_cast<size_t>(in.numBlocks) + 1);
  int64_t count = 0;
  // `first_token` of a sequence that never evicted: block * block_size.
  std::vector<float> firstToken;
  if (!in.firstToken) {
    firstToken.resize(size_t(in.numBlocks));
    for (int64_t j = 0; j < in.numBlocks; ++j)
      firstToken[size_t(j)] = float(j * blockSize());
  }
  params.checkInScope("index stage", in.layer, in.kvHead);
  VflowIndexArgs args{dim,
                      groupSize,
                      in.numBlocks,
                      in.contextLen,
                      in.step,
                      in.layer,
                      in.kvHead,
                      params.values().data(),
                      constPtrs.data(),
                      in.q,
                      in.fields.data(),
                      in.mass,
                      in.K,
                      in.V,
                      stateOut.data(),
                      selected.data(),
                      &count,
                      retains() ? retainScore : nullptr,
                      in.firstToken ? in.firstToken : firstToken.data()};
  indexFn(&args);
  selected.resize(static_cast<size_t>(count));
  return selected;
}

std::vector<int64_t> CpuFlow::finalBlocks(const std::vector<int64_t> &selection,
                                          int64_t numBlocks) const {
  std::set<int64_t> all(selection.begin(), selection.end());
  for (int64_t j = 0; j < std::min(keepFirst(), numBlocks); ++j)
    all.insert(j);
  for (int64_t j = std::max<int64_t>(0, numBlocks - keepLast()); j < numBlocks;
       ++j)
    all.insert(j);
  return std::vector<int64_t>(all.begin(), all.end());
}

int64_t CpuFlow::budget(int64_t numBlocks, int64_t contextLen) const {
  return params.budget(numBlocks, contextLen);
}

void CpuFlow::setBudgetScope(int64_t firstLayer, int64_t numLayers,
                             int64_t firstKVHead, int64_t numKVHeads) {
  params.setScope(firstLayer, numLayers, firstKVHead, numKVHeads);
}

void CpuFlow::checkBudgets() const { params.checkBudgets(); }

void CpuFlow::checkBudgetsAt(int64_t contextLen) const {
  params.checkBudgetsAt(contextLen);
}
