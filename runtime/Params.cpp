//===- Params.cpp - A flow's params at run time ---------------------------===//

#include "vflow/Runtime/Params.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/Limits.h"
#include "vflow/Runtime/NumericRules.h"

#include <algorithm>
#include <cmath>

using namespace vflow::rt;

FlowParams::FlowParams(std::string flowName, std::vector<ParamSpec> specs,
                       std::vector<BudgetExpr> budgetExprs,
                       std::vector<SelectionNode> selectionNodes,
                       BudgetScope scope)
    : flow(std::move(flowName)), params(std::move(specs)),
      budgets(std::move(budgetExprs)), selection(std::move(selectionNodes)),
      where(scope), inputs(budgetInputs(budgets)) {
  for (const ParamSpec &p : params) {
    current.push_back(p.value);
    names.push_back(p.name);
    compileTime.push_back(p.compileTime);
  }
  blockSizeIndex = indexOf("block_size");
  keepFirstIndex = indexOf("keep_first");
  keepLastIndex = indexOf("keep_last");
  if (blockSize() < 1)
    throw Error("flow '" + flow + "': block_size must be positive");
  checkBudgets();
}

int64_t FlowParams::indexOf(const std::string &name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name)
      return int64_t(i);
  throw Error("flow '" + flow + "' has no param '" + name + "'");
}

double FlowParams::get(const std::string &name) const {
  return current[size_t(indexOf(name))];
}

void FlowParams::set(const std::string &name, double value) {
  size_t i = size_t(indexOf(name));
  const ParamSpec &p = params[i];
  std::string where = "param '" + name + "' of flow '" + flow + "'";
  if (p.compileTime && value != current[i])
    throw Error(where +
                " is compile-time: the flow was specialized on it; "
                "recompile with -p " +
                name + "=...");
  if (!std::isfinite(value))
    throw Error(where + " must be a finite number");
  if (p.type == "int" && (value != std::floor(value) ||
                          std::fabs(value) > double(limits::kMaxExactInt)))
    throw Error(where + " is an int; " + std::to_string(value) +
                " is not an integer within 2^53");
  if (p.type == "bool" && value != 0 && value != 1)
    throw Error(where + " is a bool: use 0 or 1");
  if ((name == "keep_first" || name == "keep_last") && value < 0)
    throw Error(where + " must be a non-negative integer");
  double old = current[i];
  current[i] = value;
  try {
    checkBudgets();
  } catch (...) {
    current[i] = old;
    throw;
  }
}

void FlowParams::setScope(const BudgetScope &scope) {
  if (scope.group < 1 || scope.numLayers < 1 || scope.numKVHeads < 1 ||
      scope.firstLayer < 0 || scope.firstKVHead < 0)
    throw Error("flow '" + flow +
                "': a budget scope needs a positive group and at least one "
                "layer and KV head, from index 0 up");
  BudgetScope old = where;
  where = scope;
  try {
    checkBudgets();
  } catch (...) {
    where = old;
    throw;
  }
}

void FlowParams::setScope(int64_t firstLayer, int64_t numLayers,
                          int64_t firstKVHead, int64_t numKVHeads) {
  BudgetScope scope = where;
  scope.firstLayer = firstLayer;
  scope.numLayers = numLayers;
  scope.firstKVHead = firstKVHead;
  scope.numKVHeads = numKVHeads;
  setScope(scope);
}

void FlowParams::checkInScope(const char *what, int64_t layer,
                              int64_t kvHead) const {
  auto range = [](int64_t first, int64_t count) {
    return "[" + std::to_string(first) + ", " + std::to_string(first + count) +
           ")";
  };
  if (inputs.layer && !where.containsLayer(layer))
    throw Error(std::string(what) + ": layer " + std::to_string(layer) +
                " is outside the layers " +
                range(where.firstLayer, where.numLayers) + " flow '" + flow +
                "' was planned for (a budget reads 'layer'): give the flow "
                "the model's layers");
  if (inputs.kvHead && !where.containsKVHead(kvHead))
    throw Error(std::string(what) + ": KV head " + std::to_string(kvHead) +
                " is outside the KV heads " +
                range(where.firstKVHead, where.numKVHeads) + " flow '" + flow +
                "' was planned for (a budget reads 'kv_head'): give the flow "
                "the model's KV heads");
}

int64_t FlowParams::budgetAt(const BudgetPoint &at) const {
  return selectionBudget(selection, budgets, current.data(), at);
}

int64_t FlowParams::budgetValue(int64_t index, const BudgetPoint &at) const {
  if (index < 0 || index >= int64_t(budgets.size()))
    throw Error("flow '" + flow + "': no budget " + std::to_string(index));
  return roundBudget(budgets[size_t(index)].evaluate(current.data(), at));
}

int64_t FlowParams::budget(int64_t numBlocks, int64_t contextLen) const {
  int64_t most = 0;
  forEachScopePoint(
      where, inputs, numBlocks, contextLen,
      [&](const BudgetPoint &at) { most = std::max(most, budgetAt(at)); });
  return most;
}

int64_t FlowParams::maxEntries(int64_t contextLen) const {
  const int64_t size = std::max<int64_t>(1, blockSize());
  const int64_t numBlocks = (contextLen + size - 1) / size;
  return std::min(numBlocks, budget(contextLen / size, contextLen) +
                                 keepFirst() + keepLast() + 1);
}

bool FlowParams::takesEveryBlock(int64_t contextLen) const {
  const int64_t complete = contextLen / std::max<int64_t>(1, blockSize());
  const vflow::rules::KeptBlocks kept{complete, keepFirst(), keepLast()};
  bool all = true;
  forEachScopePoint(
      where, inputs, complete, contextLen, [&](const BudgetPoint &at) {
        all = all && selectionTakesAll(selection, budgets, current.data(), at,
                                       kept.candidates());
      });
  return all;
}

void FlowParams::checkBudgets() const {
  vflow::rt::checkBudgets(budgets, current.data(), names, compileTime,
                          blockSize(), where, flow);
}

void FlowParams::checkBudgetsAt(int64_t contextLen) const {
  forEachScopePoint(where, inputs,
                    contextLen / std::max<int64_t>(1, blockSize()), contextLen,
                    [&](const BudgetPoint &at) {
                      vflow::rt::checkBudgetsAt(budgets, current.data(), names,
                                                compileTime, at, flow);
                    });
}
